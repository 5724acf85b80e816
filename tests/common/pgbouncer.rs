//! A real PgBouncer in front of a test cluster, for what the relay must notice about poolers.
//! CI installs it (`.ci/run`); where it is missing, [`PgBouncer::start`] returns None and the
//! test says it was skipped.

use super::pg::{TestDb, chown_to_postgres};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running PgBouncer, stopped (and its directory removed) on drop.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

fn binary() -> Option<PathBuf> {
    [
        "/usr/sbin/pgbouncer",
        "/usr/bin/pgbouncer",
        "/usr/local/bin/pgbouncer",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

impl PgBouncer {
    /// PgBouncer with `pool_mode` (`transaction`, `session`) in front of `db`'s cluster, on a
    /// free port of 127.0.0.1; None when PgBouncer is not installed or `db` is not a cluster of
    /// our own.
    pub fn start(db: &TestDb, pool_mode: &str) -> Option<PgBouncer> {
        let bin = binary()?;
        let socket_dir = db.socket_dir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("pgbouncer-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create PgBouncer's directory");
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={socket} port=5432 user=postgres\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = {pool_mode}\n\
                 default_pool_size = 4\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {log}\n",
                socket = socket_dir.display(),
                log = dir.join("pgbouncer.log").display(),
            ),
        )
        .expect("write pgbouncer.ini");
        chown_to_postgres(&dir);
        // PgBouncer refuses to run as root: it drops to `postgres` itself (`-u`), so that the
        // process the test holds is PgBouncer's own and killing it stops it.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let mut c = std::process::Command::new(&bin);
        if unsafe { libc::geteuid() } == 0 {
            c.args(["-u", "postgres"]);
        }
        let child = c
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = PgBouncer { child, dir, port };
        let deadline = Instant::now() + super::pg::PROMPTLY;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "PgBouncer did not listen; its log:\n{}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(bouncer)
    }

    /// A connection string through PgBouncer to the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    #[allow(dead_code)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
