//! A real PgBouncer (Debian's `pgbouncer`) in front of a test cluster, on a loopback port of its
//! own, its configuration in a temporary directory. As root it runs as `postgres` (PgBouncer
//! refuses to run as root), as the cluster does, but as our own child, in a process group of its
//! own. On drop the group is killed and the test fails if any process started with its
//! configuration still runs.

use super::pg::{as_postgres, chown_to_postgres};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// How PgBouncer hands server connections to clients.
#[derive(Clone, Copy, Debug)]
pub enum PoolMode {
    /// A server connection per client connection, for as long as it lasts.
    Session,
    /// A server connection per transaction: session state (LISTEN, advisory locks, prepared
    /// statements) does not survive from one to the next.
    Transaction,
}

pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

/// The `pgbouncer` binary: on `PATH`, or where Debian puts it.
fn binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("pgbouncer"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin/pgbouncer")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("no pgbouncer binary (apt-get install -y pgbouncer; .ci/run installs it)")
        })
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of the cluster listening on 127.0.0.1:`pg_port`,
    /// and returns once it accepts connections.
    pub fn start(pg_port: u16, mode: PoolMode) -> PgBouncer {
        let dir = std::env::temp_dir().join(format!(
            "pgbouncer-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create PgBouncer's directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let ini = format!(
            "[databases]\n\
             postgres = host=127.0.0.1 port={pg_port} dbname=postgres user=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = {mode}\n\
             max_client_conn = 200\n\
             default_pool_size = 20\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).expect("write pgbouncer.ini");
        chown_to_postgres(&dir);
        let mut command = as_postgres(&binary());
        command
            .arg(&config)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Out of the terminal's process group, so an interrupted test run must end it too.
        super::procs::ends_with_its_thread(&mut command);
        let child = command.spawn().expect("start pgbouncer");
        let mut bouncer = PgBouncer { child, dir, port };
        bouncer.wait_ready();
        bouncer
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("pgbouncer exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer does not accept connections:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A `DATABASE_URL` through PgBouncer.
    pub fn url(&self) -> String {
        super::proxy::tcp_url(self.port)
    }

    /// PgBouncer's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // The whole group: whatever PgBouncer was started through, and whatever it started.
        // SAFETY: kill(2) on the process group our own child leads.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.wait();
        // Every process of this PgBouncer names its configuration file, which is in `dir`.
        let config = self.dir.join("pgbouncer.ini");
        super::procs::assert_none_left(&config.to_string_lossy(), "PgBouncer");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
