//! A TCP proxy on loopback that can freeze: every connection open at that moment stops
//! forwarding bytes both ways, and nothing is closed, as on a silent network path or behind a
//! middlebox that keeps the server's side open. Connections made afterwards flow normally.
//!
//! It can also hold back only the server's answers (a request that reaches the server and
//! commits, whose answer is lost on the way back), and slow the server's answers down (a slow
//! path, or a busy server).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

type Hello = Arc<Mutex<Vec<u8>>>;
/// Per connection: its switch, and the first bytes its client sent.
type Switches = Arc<Mutex<Vec<(Arc<watch::Sender<Flow>>, Hello)>>>;
/// The bytes a client sends after which its server's answers are held back (once).
type Trap = Arc<Mutex<Option<Vec<u8>>>>;
/// What a new connection's first bytes may contain to be frozen before any of them passes.
type Doomed = Arc<Mutex<Vec<Vec<u8>>>>;

/// How one connection forwards.
#[derive(Clone, Copy, Debug, Default)]
struct Flow {
    /// Nothing passes either way.
    frozen: bool,
    /// Nothing passes from the server to the client.
    answers_held: bool,
    /// Each chunk from the server is forwarded this long after it was read.
    answer_delay: Duration,
}

pub struct FreezingProxy {
    addr: SocketAddr,
    /// Per connection made so far: its switch, and the first bytes the client sent (for
    /// PostgreSQL without TLS, the startup message, which names the `application_name`).
    switches: Switches,
    trap: Trap,
    doomed: Doomed,
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
        let trap: Trap = Arc::default();
        let doomed: Doomed = Arc::default();
        let tasks: Arc<Mutex<JoinSet<()>>> = Arc::default();
        let accept = {
            let (switches, tasks, trap) = (switches.clone(), tasks.clone(), trap.clone());
            let doomed = doomed.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue;
                    };
                    let (tx, rx) = watch::channel(Flow::default());
                    let tx = Arc::new(tx);
                    let hello = Hello::default();
                    switches.lock().unwrap().push((tx.clone(), hello.clone()));
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let mut tasks = tasks.lock().unwrap();
                    let upstream = Upstream {
                        hello,
                        trap: trap.clone(),
                        doomed: doomed.clone(),
                        switch: tx,
                    };
                    tasks.spawn(pump(cr, sw, rx.clone(), Some(upstream)));
                    tasks.spawn(pump(sr, cw, rx, None));
                }
            })
        };
        FreezingProxy {
            addr,
            switches,
            trap,
            doomed,
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
        self.switch_where(|_| true, |f| f.frozen = true)
    }

    /// Freezes the connections open now whose client's first bytes contain `needle` (e.g. an
    /// `application_name`); returns how many.
    pub fn freeze_named(&self, needle: &str) -> usize {
        self.switch_where(contains(needle), |f| f.frozen = true)
    }

    /// [`FreezingProxy::freeze_named`], and from now on freezes each new connection whose
    /// client's first bytes contain `needle` before any of them passes: a path on which no
    /// connection of that client's gets through any more (its TCP connect still succeeds).
    pub fn freeze_named_from_now_on(&self, needle: &str) -> usize {
        self.doomed.lock().unwrap().push(needle.as_bytes().to_vec());
        self.freeze_named(needle)
    }

    /// How many connections made so far sent first bytes containing `needle`.
    pub fn connections_named(&self, needle: &str) -> usize {
        let pick = contains(needle);
        let switches = self.switches.lock().unwrap();
        switches
            .iter()
            .filter(|(_, hello)| pick(&hello.lock().unwrap()))
            .count()
    }

    /// Undoes [`FreezingProxy::freeze_named_from_now_on`] for new connections: they flow
    /// again (those frozen stay frozen).
    pub fn let_new_connections_through(&self) {
        self.doomed.lock().unwrap().clear();
    }

    /// Delays every chunk the server sends by `delay`, on the connections open now whose
    /// client's first bytes contain `needle`; returns how many.
    pub fn delay_answers_named(&self, needle: &str, delay: Duration) -> usize {
        self.switch_where(contains(needle), |f| f.answer_delay = delay)
    }

    /// Once: on the first connection (open now or later) whose client sends bytes containing
    /// `needle`, those bytes reach the server but nothing the server sends from then on reaches
    /// the client, and both sockets stay open. The request goes through, its answer is lost.
    pub fn hold_answers_after(&self, needle: &str) {
        *self.trap.lock().unwrap() = Some(needle.as_bytes().to_vec());
    }

    fn switch_where(&self, pick: impl Fn(&[u8]) -> bool, change: impl Fn(&mut Flow)) -> usize {
        let switches = self.switches.lock().unwrap();
        let mut n = 0;
        for (switch, hello) in switches.iter() {
            if pick(&hello.lock().unwrap()) {
                switch.send_modify(&change);
                n += 1;
            }
        }
        n
    }
}

fn contains(needle: &str) -> impl Fn(&[u8]) -> bool + '_ {
    move |bytes| find(bytes, needle.as_bytes())
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// What the client-to-server pump of a connection also does.
struct Upstream {
    hello: Hello,
    trap: Trap,
    doomed: Doomed,
    switch: Arc<watch::Sender<Flow>>,
}

/// Copies `from` to `to` until either ends, or forever holds both once frozen (or, from the
/// server, once its answers are held). From the server, each chunk is written its delay after
/// it was read, whatever came before it: a slow path, not a queue.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    mut flow: watch::Receiver<Flow>,
    upstream: Option<Upstream>,
) {
    let from_server = upstream.is_none();
    let stopped = move |f: &Flow| f.frozen || (from_server && f.answers_held);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut writer = AbortOnDrop(tokio::spawn(write_out(to, rx, flow.clone(), stopped)));
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    let _ = (&mut writer.0).await;
                    return;
                }
                Ok(n) => n,
            },
            _ = async { flow.wait_for(stopped).await.is_ok() } => 0,
        };
        if stopped(&flow.borrow()) {
            // Hold this half open, reading nothing.
            let _keep = from;
            return std::future::pending().await;
        }
        if let Some(up) = &upstream {
            let first = {
                let mut h = up.hello.lock().unwrap();
                let first = h.is_empty();
                if first {
                    h.extend_from_slice(&buf[..n]);
                }
                first
            };
            let doomed = first && (up.doomed.lock().unwrap().iter()).any(|d| find(&buf[..n], d));
            if doomed {
                // Before the bytes go: the server never hears of this connection.
                up.switch.send_modify(|f| f.frozen = true);
                let _keep = from;
                return std::future::pending().await;
            }
            let mut trap = up.trap.lock().unwrap();
            if trap.as_deref().is_some_and(|t| find(&buf[..n], t)) {
                // Before the bytes go: the server's answer must not slip through.
                *trap = None;
                up.switch.send_modify(|f| f.answers_held = true);
            }
        }
        let delay = if from_server {
            flow.borrow().answer_delay
        } else {
            Duration::ZERO
        };
        let at = tokio::time::Instant::now() + delay;
        if tx.send(Some((at, buf[..n].to_vec()))).is_err() {
            return;
        }
    }
}

/// The writing half of [`pump`]: each chunk at its time, nothing once stopped; `None` is the
/// reader's end, passed on as a shutdown.
async fn write_out(
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut chunks: tokio::sync::mpsc::UnboundedReceiver<Option<(tokio::time::Instant, Vec<u8>)>>,
    flow: watch::Receiver<Flow>,
    stopped: impl Fn(&Flow) -> bool,
) {
    while let Some(chunk) = chunks.recv().await {
        let Some((at, bytes)) = chunk else {
            let _ = to.shutdown().await;
            return;
        };
        tokio::time::sleep_until(at).await;
        if stopped(&flow.borrow()) {
            // Hold this half open, writing nothing.
            let _keep = to;
            return std::future::pending().await;
        }
        if to.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A cluster of our own that also listens on 127.0.0.1 (so that a proxy can sit in front).
pub fn tcp_db(settings: &[(&str, &str)]) -> super::pg::TestDb {
    super::pg::TestDb::start_with(super::pg::PgOptions {
        tcp: true,
        hba: vec![
            "local all all trust".to_owned(),
            "host all all 127.0.0.1/32 trust".to_owned(),
        ],
        settings: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..super::pg::PgOptions::default()
    })
}

/// A `DATABASE_URL` for the server (or proxy) on 127.0.0.1 at `port`.
pub fn tcp_url(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=disable")
}

/// A proxy in front of `env`'s cluster (made with [`tcp_db`]).
pub async fn proxy_for(env: &super::relay::Env) -> FreezingProxy {
    let port = env.db.tcp_port().expect("the cluster listens on TCP");
    FreezingProxy::start(([127, 0, 0, 1], port).into()).await
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.tasks.lock().unwrap().abort_all();
    }
}
