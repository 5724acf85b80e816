//! A TCP proxy on loopback that can freeze: every connection open at that moment stops
//! forwarding bytes both ways, and nothing is closed, as on a silent network path or behind a
//! middlebox that keeps the server's side open. Connections made afterwards flow normally.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub struct FreezingProxy {
    addr: SocketAddr,
    /// One switch per connection made so far.
    switches: Arc<Mutex<Vec<watch::Sender<bool>>>>,
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
        let switches: Arc<Mutex<Vec<watch::Sender<bool>>>> = Arc::default();
        let tasks: Arc<Mutex<JoinSet<()>>> = Arc::default();
        let accept = {
            let (switches, tasks) = (switches.clone(), tasks.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue;
                    };
                    let (tx, rx) = watch::channel(false);
                    switches.lock().unwrap().push(tx);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let mut tasks = tasks.lock().unwrap();
                    tasks.spawn(pump(cr, sw, rx.clone()));
                    tasks.spawn(pump(sr, cw, rx));
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
        let switches = self.switches.lock().unwrap();
        for s in switches.iter() {
            let _ = s.send(true);
        }
        switches.len()
    }
}

/// Copies `from` to `to` until either ends, or forever holds both once frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
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
