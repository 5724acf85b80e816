//! Listening and connections: the proxy serves HTTP/1.1 itself, so a test can drop one
//! connection without an answer or stop listening on the port.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::Request;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(super) enum Control {
    /// Stop listening and close every connection; acknowledge when done.
    Stop(std::sync::mpsc::Sender<()>),
    /// Listen again with this (already bound) listener; acknowledge when done.
    Listen(StdTcpListener, std::sync::mpsc::Sender<()>),
    Shutdown,
}

/// Per-connection handle given to handlers, so that one can drop its own connection.
#[derive(Clone)]
pub(super) struct ConnCtl {
    pub(super) kill: CancellationToken,
    /// The `Authorization` header of the connection's first request: whose connection it is.
    pub(super) owner: Arc<OnceLock<Option<String>>>,
}

/// Told when a client ends a connection (closes it, or breaks off a request), with the
/// connection's owner (`None`: it sent no request).
pub(super) type OnEnd = Arc<dyn Fn(Option<String>) + Send + Sync>;

/// Binds 127.0.0.1 on a port below the kernel's ephemeral range when it can: such a port is
/// never handed to an outgoing connection, so `set_refusing(false)` can take it back.
pub(super) fn bind_listener() -> StdTcpListener {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_low > 12000 {
        for _ in 0..200 {
            let port = fastrand::u16(10000..ephemeral_low);
            if let Ok(listener) = StdTcpListener::bind(("127.0.0.1", port)) {
                return listener;
            }
        }
    }
    StdTcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0")
}

/// Binds the same address again (std sets SO_REUSEADDR, so closed connections in TIME_WAIT do
/// not stand in the way).
pub(super) fn rebind(addr: SocketAddr) -> StdTcpListener {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match StdTcpListener::bind(addr) {
            Ok(listener) => {
                listener
                    .set_nonblocking(true)
                    .expect("non-blocking listener");
                return listener;
            }
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the proxy could not listen on {addr} again: {e}"),
        }
    }
}

pub(super) async fn accept_loop(
    listener: StdTcpListener,
    mut control: tokio::sync::mpsc::UnboundedReceiver<Control>,
    app: Router,
    on_end: OnEnd,
) {
    let mut listener = Some(TcpListener::from_std(listener).expect("tokio listener"));
    // Every connection of the current listening period: cancelled and awaited on Stop.
    let mut connections = CancellationToken::new();
    let mut tracker = TaskTracker::new();
    loop {
        tokio::select! {
            message = control.recv() => match message {
                None | Some(Control::Shutdown) => break,
                Some(Control::Stop(ack)) => {
                    listener = None;
                    connections.cancel();
                    tracker.close();
                    tracker.wait().await;
                    connections = CancellationToken::new();
                    tracker = TaskTracker::new();
                    let _ = ack.send(());
                }
                Some(Control::Listen(std_listener, ack)) => {
                    listener = Some(TcpListener::from_std(std_listener).expect("tokio listener"));
                    let _ = ack.send(());
                }
            },
            accepted = accept(listener.as_ref()) => match accepted {
                Ok(stream) => {
                    tracker.spawn(serve_connection(
                        stream,
                        app.clone(),
                        connections.child_token(),
                        on_end.clone(),
                    ));
                }
                // E.g. too many open files: wait a little rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
    }
    connections.cancel();
}

pub(super) async fn accept(listener: Option<&TcpListener>) -> std::io::Result<TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// Serves one HTTP/1.1 connection until the client closes it or `kill` fires; on `kill` the
/// connection future is dropped, which closes the socket without writing anything more.
pub(super) async fn serve_connection(
    stream: TcpStream,
    app: Router,
    kill: CancellationToken,
    on_end: OnEnd,
) {
    let _ = stream.set_nodelay(true);
    let owner = Arc::new(OnceLock::new());
    let ctl = ConnCtl {
        kill: kill.clone(),
        owner: owner.clone(),
    };
    let service = hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ctl.clone());
        // `Router` is always ready, so `call` needs no `poll_ready` first.
        tower_service::Service::call(&mut app.clone(), request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => on_end(owner.get().cloned().flatten()),
        _ = kill.cancelled() => {}
    }
}
