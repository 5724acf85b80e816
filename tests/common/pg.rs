//! A real PostgreSQL for tests, started by the test itself.
//!
//! With `TEST_DATABASE_URL` set, each [`TestDb`] is a fresh database on that server, dropped
//! afterwards. `DATABASE_URL` is never read: it names the operator's own server, where tests
//! must not create databases and roles. Otherwise each [`TestDb`] is its own cluster: `initdb` (copied from
//! a template made once per machine and user) and `pg_ctl start` on a Unix socket in a short temp
//! directory, stopped and removed on drop. As root, every PostgreSQL tool runs through
//! `runuser -u postgres --`, since PostgreSQL refuses to run as root.
//!
//! NOTIFY reaches only listeners of the same database, so a database per test also isolates the
//! relay's wake-ups.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// How a cluster of our own runs (see [`TestDb::start_with`]).
#[derive(Clone, Debug, Default)]
pub struct PgOptions {
    /// PostgreSQL's own durability defaults: `fsync` and `full_page_writes` on, as in
    /// production. Without it (the tests' default) the cluster skips
    /// them, for speed: tests are about behaviour, and a benchmark is about the real thing.
    pub durable: bool,
    /// More server settings, passed as `-c name='value'` (e.g. `shared_preload_libraries`).
    pub settings: Vec<(String, String)>,
    /// Also listen on TCP, 127.0.0.1, on a free port ([`TestDb::tcp_port`]).
    pub tcp: bool,
    /// When not empty: the whole `pg_hba.conf`, a line each (e.g. `hostssl all all
    /// 127.0.0.1/32 trust`).
    pub hba: Vec<String>,
    /// Files put in the data directory before the server starts, owned by `postgres` with mode
    /// 0600 (as PostgreSQL wants a TLS key): (name, contents). Relative paths in settings such
    /// as `ssl_cert_file` are relative to the data directory.
    pub files: Vec<(String, Vec<u8>)>,
}

/// One PostgreSQL database for one test.
pub struct TestDb {
    /// Connection string for the test's database (key=value form, accepted by tokio-postgres).
    url: String,
    kind: Kind,
    /// The TCP port, when the cluster also listens on 127.0.0.1 ([`PgOptions::tcp`]).
    tcp_port: Option<u16>,
}

enum Kind {
    /// A cluster of our own; `dir` holds `data/`, the socket and the log.
    Cluster {
        dir: PathBuf,
        bin: PathBuf,
        options: PgOptions,
    },
    /// A database on a server we were given; `admin_url` connects to its `postgres` database.
    Shared { admin_url: String, name: String },
}

impl TestDb {
    /// Starts a cluster (or creates a database on the given server) and returns once it accepts
    /// connections.
    pub fn start() -> TestDb {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        if let Some(admin) = std::env::var("TEST_DATABASE_URL")
            .ok()
            .filter(|s| !s.is_empty())
        {
            let name = format!("relay_t_{}_{}", std::process::id(), n);
            run_sql(&admin, &format!("CREATE DATABASE {name}"));
            let url = with_dbname(&admin, &name);
            return TestDb {
                url,
                kind: Kind::Shared {
                    admin_url: admin,
                    name,
                },
                tcp_port: None,
            };
        }
        TestDb::start_with(PgOptions::default())
    }

    /// [`TestDb::start`], with the test's database in `encoding` and the C locale
    /// (`SQL_ASCII`: text stored as the bytes given, none checked).
    pub fn start_encoded(encoding: &str) -> TestDb {
        let mut db = TestDb::start();
        let create = |name: &str| {
            format!(
                "CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' \
                 TEMPLATE template0"
            )
        };
        match &db.kind {
            Kind::Shared { admin_url, name } => {
                run_sql(admin_url, &format!("DROP DATABASE {name}"));
                run_sql(admin_url, &create(name));
            }
            Kind::Cluster { .. } => {
                run_sql(&db.url, &create("encoded"));
                db.url = db.url.replace("dbname=postgres", "dbname=encoded");
            }
        }
        db
    }

    /// Starts a cluster of our own with these options, whatever `TEST_DATABASE_URL` says: the
    /// benchmark must know what server it measures.
    pub fn start_with(options: PgOptions) -> TestDb {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let bin = pg_bindir();
        let dir = std::env::temp_dir().join(format!("pgt-{}-{}", std::process::id(), n));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster directory");
        let template = template_cluster(&bin);
        copy_dir(&template, &dir.join("data"));
        write_data_files(&dir.join("data"), &options);
        chown_to_postgres(&dir);
        // Bound and let go at once: another process could take the port in between, which no
        // test here does.
        let tcp_port = options.tcp.then(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("find a free port")
                .port()
        });
        let db = TestDb {
            url: format!(
                "host={} port={} user=postgres dbname=postgres",
                dir.display(),
                tcp_port.unwrap_or(5432)
            ),
            kind: Kind::Cluster { dir, bin, options },
            tcp_port,
        };
        db.pg_ctl_start();
        db
    }

    /// The connection string, for the relay's `DATABASE_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database as a URI, for clients that take no keyword string (OpenFGA's
    /// `--datastore-uri`).
    pub fn uri(&self) -> String {
        match &self.kind {
            Kind::Cluster { dir, .. } => format!(
                "postgres://postgres@/postgres?host={}&port={}&sslmode=disable",
                dir.display(),
                self.tcp_port.unwrap_or(5432)
            ),
            Kind::Shared { .. } => self.url.clone(),
        }
    }

    /// The TCP port on 127.0.0.1, when the cluster listens there ([`PgOptions::tcp`]).
    pub fn tcp_port(&self) -> Option<u16> {
        self.tcp_port
    }

    /// The directory holding the Unix socket, when this is a cluster of our own.
    pub fn socket_dir(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Cluster { dir, .. } => Some(dir),
            Kind::Shared { .. } => None,
        }
    }

    /// A new connection, driven on the current runtime.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to the test database: {e}"));
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// Stops the server at once (`-m immediate`: a crash, as far as the clients can tell).
    pub fn stop_immediately(&self) {
        self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
    }

    /// Starts the server again after [`TestDb::stop_immediately`].
    pub fn restart_after_stop(&self) {
        self.pg_ctl_start();
    }

    /// Restarts the server (`pg_ctl restart -m fast`), ending every session.
    pub fn restart(&self) {
        self.stop_immediately();
        self.pg_ctl_start();
    }

    fn pg_ctl_start(&self) {
        let Kind::Cluster { dir, options, .. } = &self.kind else {
            panic!("only a cluster of our own can be started or stopped");
        };
        let mut opts = format!(
            "-c listen_addresses='' -k {} -c max_connections=200 -c shared_buffers=128MB",
            dir.display()
        );
        if !options.durable {
            // Safe against the crashes tests make (processes killed, `-m immediate`): the
            // operating system keeps what was written. Not `synchronous_commit = off`: a commit
            // still in PostgreSQL's own buffers dies with it, and tests that restart the server
            // rely on what they committed being there afterwards.
            opts.push_str(" -c fsync=off -c full_page_writes=off");
        }
        for (name, value) in &options.settings {
            opts.push_str(&format!(" -c {name}='{value}'"));
        }
        if let Some(port) = self.tcp_port {
            opts.push_str(&format!(" -c listen_addresses='127.0.0.1' -c port={port}"));
        }
        self.pg_ctl(&[
            "-l",
            &dir.join("log").display().to_string(),
            "-w",
            "-t",
            "60",
            "-o",
            &opts,
            "start",
        ]);
    }

    fn pg_ctl(&self, args: &[&str]) {
        let Kind::Cluster { dir, bin, .. } = &self.kind else {
            panic!("only a cluster of our own can be started or stopped");
        };
        let data = dir.join("data");
        let mut full = vec!["-D", data.to_str().unwrap()];
        full.extend_from_slice(args);
        let out = pg_tool(&bin.join("pg_ctl"), &full)
            .output()
            .expect("run pg_ctl");
        if !out.status.success() {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            panic!(
                "pg_ctl {args:?} failed: {}\n{}\nserver log:\n{log}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.kind {
            Kind::Cluster { dir, bin, .. } => {
                let data = dir.join("data");
                let _ = pg_tool(
                    &bin.join("pg_ctl"),
                    &[
                        "-D",
                        data.to_str().unwrap(),
                        "-m",
                        "immediate",
                        "-w",
                        "stop",
                    ],
                )
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
                let _ = std::fs::remove_dir_all(dir);
            }
            Kind::Shared { admin_url, name } => {
                run_sql(
                    admin_url,
                    &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                );
            }
        }
    }
}

/// Runs one statement through a short-lived connection on a throwaway runtime (usable from
/// synchronous code such as `Drop`).
fn run_sql(url: &str, sql: &str) {
    let url = url.to_owned();
    let sql = sql.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        })
    })
    .join()
    .unwrap();
}

/// Replaces (or adds) the database name in a URL or key=value connection string.
fn with_dbname(url: &str, name: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (url, None),
        };
        let scheme_end = base.find("://").unwrap() + 3;
        let path_start = base[scheme_end..]
            .find('/')
            .map(|i| i + scheme_end)
            .unwrap_or(base.len());
        let mut out = format!("{}/{}", &base[..path_start], name);
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|kv| !kv.starts_with("dbname="))
            .collect();
        format!("{} dbname={name}", kept.join(" "))
    }
}

/// Finds PostgreSQL's server binaries: `PG_BINDIR`, then `pg_config --bindir`, then the newest
/// `/usr/lib/postgresql/*/bin`.
fn pg_bindir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    panic!(
        "no PostgreSQL server binaries found (looked at PG_BINDIR, /usr/lib/postgresql/*/bin, \
         pg_config --bindir): install them (apt-get install -y postgresql) or set TEST_DATABASE_URL"
    );
}

/// `psql` from the same PostgreSQL as the servers, connecting to `url`, with no startup file
/// (`-X`): a client, run as whoever runs the tests.
pub fn psql(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(pg_bindir().join("psql"));
    c.arg("-X").args(args).arg(url).env_remove("PSQLRC");
    c
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A long-running program run as `postgres` when we are root: the program itself is the child
/// (its uid and gid set between fork and exec), never a `runuser` in front of it, whose death
/// would leave the program running, orphaned.
pub fn as_postgres(program: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(program);
    if is_root() {
        let (uid, gid) = postgres_ids();
        // std empties the supplementary groups when it sets the uid of a root process.
        c.uid(uid).gid(gid);
    }
    c
}

/// The uid and gid of the `postgres` user.
fn postgres_ids() -> (u32, u32) {
    let name = std::ffi::CString::new("postgres").expect("no NUL in a literal");
    // SAFETY: getpwnam with a NUL-terminated name; the fields are copied out at once, before
    // any other call could reuse its static buffer (tests call it from one place only).
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "no postgres user (apt-get install -y postgresql makes it)"
    );
    // SAFETY: not null, as checked.
    unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
}

/// A command for a PostgreSQL tool, run as `postgres` when we are root. For tools that end on
/// their own (`pg_ctl` daemonizes the server itself); a program the test stops goes through
/// [`as_postgres`].
pub fn pg_tool(tool: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(tool).args(args);
        c
    } else {
        let mut c = Command::new(tool);
        c.args(args);
        c
    }
}

pub fn chown_to_postgres(dir: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .expect("run chown");
        assert!(status.success(), "chown -R postgres {}", dir.display());
    }
}

/// An initialised data directory to copy, made once per machine and user (initdb takes about a
/// second; a copy a few milliseconds). Made under a temporary name and renamed into place, so
/// concurrent test processes never see half of one.
fn template_cluster(bin: &Path) -> PathBuf {
    let version = bin
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|v| v.to_str())
        .unwrap_or("x")
        .to_owned();
    let template = std::env::temp_dir().join(format!("fga-relay-pgtemplate-{version}"));
    if template.join("PG_VERSION").exists() {
        return template;
    }
    let tmp = std::env::temp_dir().join(format!(
        "fga-relay-pgtemplate-{version}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    chown_to_postgres(&tmp);
    let out = pg_tool(
        &bin.join("initdb"),
        &[
            "-D",
            tmp.to_str().unwrap(),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ],
    )
    .output()
    .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Another process may have won the race; either template is good.
    if std::fs::rename(&tmp, &template).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    template
}

/// Writes [`PgOptions::hba`] and [`PgOptions::files`] into a data directory (before it is
/// handed to `postgres`).
fn write_data_files(data: &Path, options: &PgOptions) {
    use std::os::unix::fs::PermissionsExt;
    if !options.hba.is_empty() {
        std::fs::write(data.join("pg_hba.conf"), options.hba.join("\n") + "\n")
            .expect("write pg_hba.conf");
    }
    for (name, contents) in &options.files {
        let path = data.join(name);
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .expect("chmod 0600");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// How long tests wait for something that should happen promptly. Generous: the machines that
/// run the tests are shared and noisy; a condition that holds returns at once anyway.
pub const PROMPTLY: Duration = Duration::from_secs(10);

/// `SELECT count(*) …` (or any one-bigint query) on `client`.
pub async fn count(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> i64 {
    client
        .query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}
