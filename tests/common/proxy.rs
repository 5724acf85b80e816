//! A TCP proxy on loopback that can freeze: every connection open at that moment stops
//! forwarding bytes both ways, and nothing is closed, as on a silent network path or behind a
//! middlebox that keeps the server's side open. Connections made afterwards flow normally.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

type Hello = Arc<Mutex<Vec<u8>>>;
/// Per connection: its freeze switch, and the first bytes its client sent.
type Switches = Arc<Mutex<Vec<(watch::Sender<bool>, Hello)>>>;

pub struct FreezingProxy {
    addr: SocketAddr,
    /// Per connection made so far: its freeze switch, and the first bytes the client sent (for
    /// PostgreSQL without TLS, the startup message, which names the `application_name`).
    switches: Switches,
    tasks: Arc<Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl FreezingProxy {
    /// Listens on 127.0.0.1 and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> FreezingProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let switches: Switches = Arc::default();
        let tasks: Arc<Mutex<JoinSet<()>>> = Arc::default();
        let accept = {
            let (switches, tasks) = (switches.clone(), tasks.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue;
                    };
                    let (tx, rx) = watch::channel(false);
                    let hello = Hello::default();
                    switches.lock().unwrap().push((tx, hello.clone()));
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let mut tasks = tasks.lock().unwrap();
                    tasks.spawn(pump(cr, sw, rx.clone(), Some(hello)));
                    tasks.spawn(pump(sr, cw, rx, None));
                }
            })
        };
        FreezingProxy {
            addr,
            switches,
            tasks,
            accept,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Freezes every connection open now: no byte passes either way from here on, and both
    /// sockets stay open (until the proxy is dropped).
    pub fn freeze_open_connections(&self) -> usize {
        self.freeze_where(|_| true)
    }

    /// Freezes the connections open now whose client's first bytes contain `needle` (e.g. an
    /// `application_name`); returns how many.
    pub fn freeze_named(&self, needle: &str) -> usize {
        self.freeze_where(|hello| hello.windows(needle.len()).any(|w| w == needle.as_bytes()))
    }

    fn freeze_where(&self, pick: impl Fn(&[u8]) -> bool) -> usize {
        let switches = self.switches.lock().unwrap();
        let mut n = 0;
        for (switch, hello) in switches.iter() {
            if pick(&hello.lock().unwrap()) {
                let _ = switch.send(true);
                n += 1;
            }
        }
        n
    }
}

/// Copies `from` to `to` until either ends, or forever holds both once frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    hello: Option<Hello>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            _ = async { frozen.wait_for(|f| *f).await.is_ok() } => 0,
        };
        let is_frozen = *frozen.borrow();
        if is_frozen {
            // Hold both halves open, forwarding nothing.
            let _keep = (from, to);
            return std::future::pending().await;
        }
        if let Some(h) = &hello {
            let mut h = h.lock().unwrap();
            if h.is_empty() {
                h.extend_from_slice(&buf[..n]);
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.tasks.lock().unwrap().abort_all();
    }
}
