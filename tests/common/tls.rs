//! TLS for the tests: a certificate authority made in the test, an https front for the OpenFGA
//! proxy in front of OpenFGA (which speaks plain http), and a way to run a small server on a thread of its own.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A directory for one test's files, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "fga-relay-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    /// Writes `name` with `contents`; returns its path.
    pub fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write a temp file");
        path
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A certificate and its private key, PEM.
pub struct Certified {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority of the test's own: no system trusts it.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate, PEM: what a client trusts.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server certificate for these names (DNS names or IP addresses), signed by this CA.
    pub fn server_cert(&self, names: &[&str]) -> Certified {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].clone());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate for a PostgreSQL role (its common name), signed by this CA.
    pub fn client_cert(&self, user: &str) -> Certified {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Certified {
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Certified {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A future run on a thread and runtime of its own, so that it keeps serving while a test
/// blocks its own thread (on a child process, say). Dropping it stops the runtime, which ends
/// every task it spawned, and joins the thread.
pub struct Background {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    pub fn spawn<F, Fut>(name: &str, make: F) -> Background
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async move {
                    tokio::select! {
                        _ = make() => {}
                        _ = stopped => {}
                    }
                });
            })
            .expect("spawn a thread");
        Background {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Counts a held connection as ended when dropped, however its task ends.
struct Ended<'a>(&'a AtomicUsize);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Binds 127.0.0.1 on a free port, ready for a tokio listener on another runtime.
pub fn bind_local() -> (std::net::TcpListener, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("local address");
    (listener, addr)
}

/// A TLS-terminating proxy on 127.0.0.1: https in front, the proxy's plain http behind.
pub struct HttpsFront {
    addr: SocketAddr,
    failed_handshakes: Arc<AtomicUsize>,
    hold: Arc<Hold>,
    _server: Background,
}

/// A connection accepted but whose TLS handshake waits: the client has handed its request to
/// the connection and cannot send a byte of it until the handshake is done.
#[derive(Default)]
struct Hold {
    /// The next connection accepted is held.
    armed: std::sync::atomic::AtomicBool,
    /// Connections held so far, and those of them that have ended since.
    held: AtomicUsize,
    ended: AtomicUsize,
    released: std::sync::Mutex<Option<tokio::sync::watch::Sender<bool>>>,
}

impl HttpsFront {
    /// Serves `cert` and forwards every connection's bytes to `upstream`.
    pub fn start(cert: &Certified, upstream: SocketAddr) -> HttpsFront {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("key PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (listener, addr) = bind_local();
        let failed_handshakes = Arc::new(AtomicUsize::new(0));
        let failed = failed_handshakes.clone();
        let hold = Arc::new(Hold::default());
        let holds = hold.clone();
        let server = Background::spawn("https-front", move || async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let failed = failed.clone();
                let hold = holds.clone();
                tokio::spawn(async move {
                    let released = hold
                        .armed
                        .swap(false, Ordering::SeqCst)
                        .then(|| {
                            hold.released
                                .lock()
                                .unwrap()
                                .as_ref()
                                .map(|r| r.subscribe())
                        })
                        .flatten();
                    let held = released.is_some();
                    if let Some(mut released) = released {
                        hold.held.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|r| *r).await;
                    }
                    let _ended = held.then(|| Ended(&hold.ended));
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        // The client refused our certificate (or hung up).
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        HttpsFront {
            addr,
            failed_handshakes,
            hold,
            _server: server,
        }
    }

    /// Holds the TLS handshake of the next connection accepted until [`HttpsFront::release`].
    pub fn hold_next_handshake(&self) {
        *self.hold.released.lock().unwrap() = Some(tokio::sync::watch::channel(false).0);
        self.hold.armed.store(true, Ordering::SeqCst);
    }

    /// Lets the held handshake go on.
    pub fn release(&self) {
        if let Some(r) = self.hold.released.lock().unwrap().as_ref() {
            r.send_replace(true);
        }
    }

    /// How many connections were held, and how many of those have ended since (closed by
    /// either side, or refused).
    pub fn held(&self) -> (usize, usize) {
        (
            self.hold.held.load(Ordering::SeqCst),
            self.hold.ended.load(Ordering::SeqCst),
        )
    }

    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Connections whose TLS handshake did not complete.
    pub fn failed_handshakes(&self) -> usize {
        self.failed_handshakes.load(Ordering::SeqCst)
    }
}
