//! Real OpenFGA servers: built once per version with `go install` into a cache outside the
//! repository, started once per test binary and configuration (stores are cheap, so each test
//! gets a store of its own), and killed when the test binary exits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// The newest OpenFGA, with `on_duplicate` / `on_missing`.
pub const MODERN: &str = "v1.18.1";
/// The last OpenFGA before `on_duplicate` / `on_missing` (1.10): the relay's legacy path.
pub const LEGACY: &str = "v1.9.5";

const MODULE: &str = "github.com/openfga/openfga/cmd/openfga";

/// What makes two servers different: tests that share these share a server.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Flavour {
    pub(super) version: &'static str,
    pub(super) preshared_keys: Vec<String>,
    pub(super) max_tuples_per_write: usize,
    /// `None`: the memory datastore. Some(connection string): OpenFGA's PostgreSQL datastore
    /// there, migrated first, on a server of the test's own.
    pub(super) postgres: Option<String>,
    /// `--authn-method oidc` against an issuer of the test's own (a server of its own).
    pub(super) oidc: Option<Oidc>,
}

/// What OpenFGA needs for OIDC: the issuer it fetches the discovery document and keys from at
/// start, and the audience its tokens must name; and a token the harness's own calls carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Oidc {
    pub(super) issuer: String,
    pub(super) audience: String,
    pub(super) token: String,
}

/// A running server: where it listens, and a key to call it with when it wants one. A server
/// of one test's own (on its PostgreSQL) is killed when dropped; shared ones live as long as
/// the test binary.
pub(super) struct Server {
    pub(super) url: String,
    pub(super) key: Option<String>,
    pid: u32,
}

impl Server {
    /// The server's process id.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid we started; a server already gone makes it fail harmlessly.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

static SERVERS: LazyLock<Mutex<HashMap<Flavour, Arc<Server>>>> = LazyLock::new(Default::default);

/// The server of this flavour, started on first use (and built first, once per machine).
pub(super) fn server(flavour: &Flavour) -> Arc<Server> {
    // A server of the test's own: on its PostgreSQL, or trusting its issuer.
    if flavour.postgres.is_some() || flavour.oidc.is_some() {
        return Arc::new(start(&binary(flavour.version), flavour));
    }
    // Held while building and starting, so that two tests wanting the same flavour start one.
    let mut servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = servers.get(flavour) {
        return server.clone();
    }
    let binary = binary(flavour.version);
    let server = Arc::new(start(&binary, flavour));
    servers.insert(flavour.clone(), server.clone());
    server
}

/// Where built servers are kept: `FGA_RELAY_OPENFGA_CACHE`, else `~/.cache/fga-relay/openfga`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FGA_RELAY_OPENFGA_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    Path::new(&home).join(".cache/fga-relay/openfga")
}

/// The `openfga` binary of `version`, built with `go install` when the cache lacks it.
pub fn binary(version: &str) -> PathBuf {
    let dir = cache_dir().join(version);
    let binary = dir.join("openfga");
    if binary.is_file() {
        return binary;
    }
    let install = format!("GOBIN={} go install {MODULE}@{version}", dir.display());
    if Command::new("go").arg("version").output().is_err() {
        panic!(
            "the tests run a real OpenFGA {version}, which is not built yet and needs Go \
             (https://go.dev/doc/install); with Go installed, run: {install}"
        );
    }
    eprintln!(
        "building OpenFGA {version} once (cached in {}): {install}",
        dir.display()
    );
    // Built beside, then renamed into place: a build cut short never looks finished.
    let staging = cache_dir().join(format!("{version}.building-{}", std::process::id()));
    let out = Command::new("go")
        .args(["install", &format!("{MODULE}@{version}")])
        .env("GOBIN", &staging)
        .env("CGO_ENABLED", "0")
        .output()
        .expect("run go install");
    assert!(
        out.status.success(),
        "{install} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir_all(&dir).expect("create the OpenFGA cache directory");
    std::fs::rename(staging.join("openfga"), &binary).expect("move the built OpenFGA into place");
    let _ = std::fs::remove_dir_all(&staging);
    binary
}

/// A free port on 127.0.0.1 (below the ephemeral range where possible, so that no outgoing
/// connection takes it between now and the server binding it).
fn free_port() -> u16 {
    super::server::bind_listener()
        .local_addr()
        .expect("listener address")
        .port()
}

fn start(binary: &Path, flavour: &Flavour) -> Server {
    if let Some(uri) = &flavour.postgres {
        let out = Command::new(binary)
            .args([
                "migrate",
                "--datastore-engine",
                "postgres",
                "--datastore-uri",
                uri,
            ])
            .output()
            .expect("run openfga migrate");
        assert!(
            out.status.success(),
            "openfga migrate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    remove_stale_logs();
    for _ in 0..5 {
        let (http, grpc) = (free_port(), free_port());
        let log = std::env::temp_dir().join(format!(
            "fga-relay-openfga-{}-{http}.log",
            std::process::id()
        ));
        let mut command = Command::new(binary);
        command.arg("run");
        match &flavour.postgres {
            Some(uri) => command.args(["--datastore-engine", "postgres", "--datastore-uri", uri]),
            None => command.args(["--datastore-engine", "memory"]),
        };
        command.args([
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--playground-enabled=false",
            "--metrics-enabled=false",
            "--log-level",
            "warn",
            "--max-tuples-per-write",
            &flavour.max_tuples_per_write.to_string(),
        ]);
        if !flavour.preshared_keys.is_empty() {
            command.args([
                "--authn-method",
                "preshared",
                "--authn-preshared-keys",
                &flavour.preshared_keys.join(","),
            ]);
        }
        if let Some(oidc) = &flavour.oidc {
            command.args([
                "--authn-method",
                "oidc",
                "--authn-oidc-issuer",
                &oidc.issuer,
                "--authn-oidc-audience",
                &oidc.audience,
            ]);
        }
        let file = std::fs::File::create(&log).expect("create the OpenFGA log");
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        let pid = spawn_for_life(command);
        let url = format!("http://127.0.0.1:{http}");
        let server = Server {
            url,
            key: flavour
                .preshared_keys
                .first()
                .cloned()
                .or_else(|| flavour.oidc.as_ref().map(|o| o.token.clone())),
            pid,
        };
        if healthy(&server.url, Duration::from_secs(30)) {
            return server;
        }
        // Most likely a port taken meanwhile: try others.
        eprintln!(
            "OpenFGA {} did not come up on {}; log: {}",
            flavour.version,
            server.url,
            log.display()
        );
    }
    panic!("OpenFGA {} would not start", flavour.version);
}

/// Removes the logs of servers started by test processes that have ended (a server lives as
/// long as its test binary, which has no moment to remove its log afterwards): what a run
/// leaves in the temporary directory is the logs of the runs still going.
fn remove_stale_logs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("fga-relay-openfga-"))
            .and_then(|n| n.strip_suffix(".log"))
        else {
            continue;
        };
        // `<pid>-<port>`; older runs named it `<port>` alone.
        let pid = rest.split('-').next().unwrap_or_default();
        if !std::path::Path::new("/proc").join(pid).exists() || !rest.contains('-') {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Starts the server on a thread that lives as long as it does, with `PR_SET_PDEATHSIG`: the
/// kernel kills the server when that thread goes, which is when the test binary exits (the
/// signal follows the spawning thread, not the process, so the thread must outlive the test).
fn spawn_for_life(mut command: Command) -> u32 {
    super::super::procs::ends_with_its_thread(&mut command);
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("openfga".to_owned())
        .spawn(move || match command.spawn() {
            Ok(mut child) => {
                let _ = pid_tx.send(Ok(child.id()));
                let _ = child.wait();
            }
            Err(e) => {
                let _ = pid_tx.send(Err(e));
            }
        })
        .expect("spawn the OpenFGA thread");
    pid_rx
        .recv()
        .expect("the OpenFGA thread answers")
        .expect("start OpenFGA")
}

fn healthy(url: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let agent = super::api::agent();
    while Instant::now() < deadline {
        if let Ok(mut answer) = agent.get(format!("{url}/healthz")).call()
            && answer.status() == 200
            && answer
                .body_mut()
                .read_to_string()
                .is_ok_and(|b| b.contains("SERVING"))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
