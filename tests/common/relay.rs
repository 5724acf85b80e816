//! Running the real `fga-relay` binary against a test database and a real OpenFGA (behind the fault proxy): as a
//! daemon (`run`, killed or stopped like a real process) or as a one-shot command.

use super::fga::Fga;
use super::pg::{PgOptions, TestDb};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_fga-relay");

static LOGS: AtomicUsize = AtomicUsize::new(0);

/// The README's example row (a capture job under an archive, and its organization), as the
/// writer examples write it: user, relation, object.
pub const README_TUPLES: [(&str, &str, &str); 2] = [
    ("capture_job:7f170ae4", "parent", "archive:3a4cb75c"),
    ("organization:acme", "parent", "capture_job:7f170ae4"),
];

/// A database with the schema migrated, and a store on a real OpenFGA.
pub struct Env {
    pub db: TestDb,
    pub fga: Fga,
}

impl Env {
    /// A migrated database and a store of its own on OpenFGA.
    pub async fn start() -> Env {
        Env::with_fga(Fga::start()).await
    }

    pub async fn with_fga(fga: Fga) -> Env {
        Env::with(TestDb::start(), fga).await
    }

    /// [`Env::start`] with a database that counts the statements its sessions run
    /// (pg_stat_statements loaded and created), and a client of the test's own on it.
    pub async fn with_statement_stats() -> (Env, tokio_postgres::Client) {
        let db = TestDb::start_with(PgOptions {
            settings: vec![(
                "shared_preload_libraries".into(),
                "pg_stat_statements".into(),
            )],
            ..PgOptions::default()
        });
        let env = Env::with(db, Fga::start()).await;
        let admin = env.db.connect().await;
        admin
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .expect("create pg_stat_statements");
        (env, admin)
    }

    /// This database, migrated, and this OpenFGA store.
    pub async fn with(db: TestDb, fga: Fga) -> Env {
        let env = Env { db, fga };
        let out = env.command(&["migrate"]).output().expect("run migrate");
        assert_success(&out, "fga-relay migrate");
        env
    }

    /// The environment every relay command of this test gets: database, store, and quick
    /// timings suited to tests (a sweep far away, so that only notifications can explain a
    /// prompt delivery).
    pub fn vars(&self) -> Vec<(String, String)> {
        [
            ("DATABASE_URL", self.db.url().to_owned()),
            ("FGA_API_URL", self.fga.url()),
            ("FGA_STORE_ID", self.fga.store_id().to_owned()),
            ("FGA_RELAY_SWEEP_INTERVAL", "1h".to_owned()),
            ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s".to_owned()),
            // A short lease, so that a new leader after a crash waits seconds, not half a
            // minute, for the dead one's Writes ("not before": lease + request timeout + 1 s).
            ("FGA_RELAY_LEADER_LEASE", "4s".to_owned()),
            ("FGA_RELAY_REQUEST_TIMEOUT", "2s".to_owned()),
            ("FGA_RELAY_HTTP_ADDR", "off".to_owned()),
            ("RUST_LOG", "info,fga_relay=debug".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// `fga-relay ARGS` with this environment (nothing inherited from the test's own but PATH).
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_of(Path::new(BIN), args)
    }

    /// As [`Env::command`], with another build of the relay (an earlier release, for upgrades).
    pub fn command_of(&self, bin: &Path, args: &[&str]) -> Command {
        let mut c = command(bin, args);
        c.envs(self.vars());
        c
    }

    /// Starts `fga-relay run`, with extra environment on top of [`Env::vars`].
    pub fn spawn_relay(&self, extra: &[(&str, &str)]) -> RelayProc {
        self.spawn_relay_of(Path::new(BIN), extra)
    }

    /// As [`Env::spawn_relay`], with another build of the relay.
    pub fn spawn_relay_of(&self, bin: &Path, extra: &[(&str, &str)]) -> RelayProc {
        let mut c = self.command_of(bin, &["run"]);
        for (k, v) in extra {
            c.env(k, v);
        }
        RelayProc::spawn(c)
    }

    /// Starts a relay with its endpoint on a free port; returns it and the endpoint's base URL.
    pub async fn spawn_relay_with_endpoint(&self, extra: &[(&str, &str)]) -> (RelayProc, String) {
        let mut vars = vec![("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0")];
        vars.extend_from_slice(extra);
        let relay = self.spawn_relay(&vars);
        let base = relay.endpoint().await;
        (relay, base)
    }

    /// Starts a relay and waits until it leads (delivers).
    pub async fn start_relay(&self) -> RelayProc {
        let relay = self.spawn_relay(&[]);
        relay.wait_for_log("delivering (leader)").await;
        relay
    }

    /// Inserts one outbox row in its own transaction; returns its id.
    pub async fn insert(&self, payload: serde_json::Value) -> i64 {
        let client = self.db.connect().await;
        insert_with(&client, payload).await
    }

    /// Asserts that OpenFGA holds every tuple (user, relation, object) given.
    pub fn assert_fga_has(&self, tuples: &[(&str, &str, &str)]) {
        for (user, relation, object) in tuples {
            assert!(
                self.fga.has(user, relation, object),
                "OpenFGA does not hold {object}#{relation}@{user}"
            );
        }
    }

    /// Waits (up to [`PROMPTLY`](super::pg::PROMPTLY)) until row `id` is delivered.
    pub async fn wait_delivered(&self, id: i64) {
        wait_until(
            super::pg::PROMPTLY,
            &format!("row {id} is delivered"),
            || async { self.row(id).await.delivered },
        )
        .await;
    }

    /// The highest id in the outbox (found by key, whatever the table's statistics say).
    pub async fn newest_id(&self) -> i64 {
        self.db
            .connect()
            .await
            .query_one("SELECT max(id) FROM fga_outbox", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// Whether every row of `ids` is delivered within `within` (false at the deadline: for a
    /// test that reports what it found rather than failing at once).
    pub async fn all_delivered_within(&self, ids: &[i64], within: Duration) -> bool {
        poll_until(within, Duration::from_millis(100), || async {
            let mut all = true;
            for id in ids {
                all &= self.row(*id).await.delivered;
            }
            all
        })
        .await
        .is_some()
    }

    /// Waits (up to [`PROMPTLY`](super::pg::PROMPTLY)) until no row is pending.
    pub async fn wait_drained(&self) {
        wait_until(super::pg::PROMPTLY, "no row is pending", || async {
            self.pending().await == 0
        })
        .await;
    }

    /// As [`Env::wait_drained`], for up to `within`.
    pub async fn wait_drained_within(&self, within: Duration) {
        wait_until(within, "no row is pending", || async {
            self.pending().await == 0
        })
        .await;
    }

    /// A session of the test's own holding row `id` (`FOR UPDATE`, in a transaction left open
    /// until the client commits or is dropped), as an operator correcting it by hand would.
    pub async fn hold_row(&self, id: i64) -> tokio_postgres::Client {
        let holder = self.db.connect().await;
        holder.batch_execute("BEGIN").await.unwrap();
        holder
            .execute("SELECT 1 FROM fga_outbox WHERE id = $1 FOR UPDATE", &[&id])
            .await
            .unwrap();
        holder
    }

    /// The state of a row: (processed, dead, attempts, last_error).
    pub async fn row(&self, id: i64) -> RowState {
        let client = self.db.connect().await;
        let r = client
            .query_one(
                "SELECT processed_at IS NOT NULL, failed_at IS NOT NULL, attempts, last_error \
                 FROM fga_outbox WHERE id = $1",
                &[&id],
            )
            .await
            .expect("row exists");
        RowState {
            delivered: r.get(0),
            dead: r.get(1),
            attempts: r.get(2),
            last_error: r.get(3),
        }
    }

    /// How many rows are dead.
    pub async fn dead(&self) -> i64 {
        let client = self.db.connect().await;
        client
            .query_one(
                "SELECT count(*) FROM fga_outbox WHERE failed_at IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Sessions that sit in an open transaction: a claim left behind.
    pub async fn idle_in_transaction(&self) -> i64 {
        let client = self.db.connect().await;
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// How many rows are pending.
    pub async fn pending(&self) -> i64 {
        let client = self.db.connect().await;
        client
            .query_one(
                "SELECT count(*) FROM fga_outbox WHERE processed_at IS NULL AND failed_at IS NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RowState {
    pub delivered: bool,
    pub dead: bool,
    pub attempts: i32,
    pub last_error: Option<String>,
}

/// Inserts one outbox row through `client`; returns its id.
pub async fn insert_with(client: &tokio_postgres::Client, payload: serde_json::Value) -> i64 {
    client
        .query_one(
            "INSERT INTO fga_outbox (payload) VALUES ($1) RETURNING id",
            &[&payload],
        )
        .await
        .expect("insert an outbox row")
        .get(0)
}

/// Inserts `n` rows, one a commit, each granting `viewer` on `object` to `user:{prefix}{i}`
/// (distinct tuples, one object); returns their ids in order.
pub async fn insert_viewers(
    client: &tokio_postgres::Client,
    prefix: &str,
    object: &str,
    n: usize,
) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let t = tk(&format!("user:{prefix}{i}"), "viewer", object);
        ids.push(insert_with(client, writes(&[t])).await);
    }
    ids
}

/// The call a writer makes after COMMIT: `$1` the ids, `$2` the timeout as text.
pub const WAIT_CALL: &str = "SELECT fga_outbox_wait($1, $2::text::interval)";

/// `SELECT fga_outbox_wait(ids, timeout)`.
pub async fn wait_for(
    client: &tokio_postgres::Client,
    ids: &[i64],
    timeout: &str,
) -> Result<String, tokio_postgres::Error> {
    client
        .query_one(WAIT_CALL, &[&ids, &timeout])
        .await
        .map(|r| r.get(0))
}

/// Inserts one outbox row from JSON text (cast to jsonb by PostgreSQL, which takes documents
/// `serde_json::Value` cannot hold); returns its id, or PostgreSQL's refusal.
pub async fn insert_text(
    client: &tokio_postgres::Client,
    payload: &str,
) -> Result<i64, tokio_postgres::Error> {
    client
        .query_one(
            "INSERT INTO fga_outbox (payload) VALUES ($1::text::jsonb) RETURNING id",
            &[&payload],
        )
        .await
        .map(|r| r.get(0))
}

/// The Writes OpenFGA accepted (status 200), in arrival order.
pub fn accepted_writes(fga: &super::fga::Fga) -> Vec<super::fga::WriteRecord> {
    fga.writes()
        .into_iter()
        .filter(|w| w.status == 200)
        .collect()
}

/// A tuple-key JSON object.
pub fn tk(user: &str, relation: &str, object: &str) -> serde_json::Value {
    serde_json::json!({"user": user, "relation": relation, "object": object})
}

/// A payload writing the given tuples.
pub fn writes(tuples: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({ "writes": tuples })
}

/// A payload deleting the given tuples.
pub fn deletes(tuples: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({ "deletes": tuples })
}

/// `BIN ARGS` with no environment but PATH: what a relay command sees is what the caller gives it.
pub fn command(bin: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args).env_clear();
    if let Ok(path) = std::env::var("PATH") {
        c.env("PATH", path);
    }
    c
}

/// A running `fga-relay run` process. Killed (SIGKILL) on drop if still running.
pub struct RelayProc {
    child: Child,
    log: PathBuf,
}

impl RelayProc {
    pub fn spawn(mut c: Command) -> RelayProc {
        let log = std::env::temp_dir().join(format!(
            "fga-relay-test-{}-{}.log",
            std::process::id(),
            LOGS.fetch_add(1, Ordering::SeqCst)
        ));
        let file = std::fs::File::create(&log).expect("create the relay's log file");
        let child = c
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn fga-relay");
        RelayProc { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the relay logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the relay logs a line containing `needle`; panics with the log otherwise.
    pub async fn wait_for_log(&self, needle: &str) {
        self.wait_for_log_count(needle, 1).await;
    }

    /// Waits until `needle` appears at least `n` times in the log.
    pub async fn wait_for_log_count(&self, needle: &str, n: usize) {
        let deadline = Instant::now() + super::pg::PROMPTLY;
        loop {
            let logs = self.logs();
            if logs.matches(needle).count() >= n {
                return;
            }
            if Instant::now() > deadline {
                panic!("the relay did not log {needle:?} ({n}x) in time; its log:\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process is still running (it has not exited, crashed or panicked).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: the process dies at once, wherever it is.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM.
    pub fn term(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `sig` (SIGSTOP and SIGCONT freeze and thaw it).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// The base URL of `/healthz` and `/metrics`, from the address the relay logged it bound
    /// (so that `FGA_RELAY_HTTP_ADDR=127.0.0.1:0` can let the system pick a free port).
    pub async fn endpoint(&self) -> String {
        const SERVING: &str = "serving /livez, /readyz, /healthz and /metrics";
        self.wait_for_log(SERVING).await;
        let logs = self.logs();
        let addr = logs
            .lines()
            .find(|l| l.contains(SERVING))
            .and_then(|l| l.split("addr=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in the relay's log:\n{logs}"))
            .trim_matches('"');
        format!("http://{addr}")
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the relay") {
                return status;
            }
            if Instant::now() > deadline {
                panic!("the relay did not exit in time; its log:\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- relay log ({}) ---\n{}",
                self.log.display(),
                self.logs()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// What a command printed, stdout then stderr.
pub fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Panics with the command's output unless it succeeded.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed with {}:\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls an async condition every 20 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if poll_until(timeout, Duration::from_millis(20), f)
        .await
        .is_none()
    {
        panic!("timed out after {timeout:?} waiting for: {what}");
    }
}

/// Polls an async condition every `every` until it holds, and says when it was first seen to;
/// nothing after `timeout`.
pub async fn poll_until<F, Fut>(timeout: Duration, every: Duration, mut f: F) -> Option<Instant>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return Some(Instant::now());
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until OpenFGA has received at least `n` Writes, whatever became of them.
pub async fn wait_for_writes(fga: &Fga, n: usize, what: &str) {
    wait_until(super::pg::PROMPTLY, what, || {
        let got = fga.write_count();
        async move { got >= n }
    })
    .await;
}

/// Whether the relay holds the wake lock (it does while it sleeps, waiting for a notification)
/// is `sleeping`.
pub async fn relay_sleeps(admin: &tokio_postgres::Client, sleeping: bool) -> bool {
    let held = super::pg::count(
        admin,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = 1718051121 AND mode = 'ExclusiveLock'",
        &[],
    )
    .await;
    (held == 1) == sleeping
}

/// Every tuple key a Write's body names, written or deleted, as `object#relation@user`.
pub fn write_tuple_keys(body: &serde_json::Value) -> Vec<String> {
    ["writes", "deletes"]
        .iter()
        .filter_map(|p| body[p]["tuple_keys"].as_array())
        .flatten()
        .map(|k| {
            format!(
                "{}#{}@{}",
                k["object"].as_str().unwrap_or(""),
                k["relation"].as_str().unwrap_or(""),
                k["user"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Asserts that no two Writes in flight at the same time (each received before the other was
/// answered) name the same tuple; returns how many pairs of Writes were in flight together.
pub fn assert_no_tuple_in_two_writes_in_flight(fga: &super::fga::Fga) -> usize {
    let all: Vec<_> = fga
        .writes()
        .into_iter()
        .filter_map(|w| {
            w.answered_at
                .map(|a| (w.received_at, a, write_tuple_keys(&w.body)))
        })
        .collect();
    let mut overlapping = 0;
    for (i, (r1, a1, k1)) in all.iter().enumerate() {
        for (r2, a2, k2) in &all[i + 1..] {
            if r1 < a2 && r2 < a1 {
                overlapping += 1;
                let shared: Vec<&String> = k1.iter().filter(|k| k2.contains(k)).collect();
                assert!(
                    shared.is_empty(),
                    "two Writes in flight at once share tuples {shared:?}"
                );
            }
        }
    }
    overlapping
}

/// A backlog of `n` one-tuple rows, `user:{tag}{i} viewer document:{tag}`, behind an OpenFGA
/// that takes `latency` per Write (the first `failures` Writes answered 500 first).
pub async fn slow_backlog(env: &Env, tag: &str, n: usize, latency: Duration, failures: usize) {
    use super::fga::{Fault, FaultRule};
    if failures > 0 {
        env.fga
            .push_fault(FaultRule::times(Fault::internal(), failures));
    }
    env.fga
        .push_fault(FaultRule::times(Fault::Delay(latency), 1_000_000));
    env.db
        .connect()
        .await
        .batch_execute(&format!(
            "INSERT INTO fga_outbox (payload) SELECT jsonb_build_object('writes', \
             jsonb_build_array(jsonb_build_object('user', 'user:{tag}' || g, 'relation', \
             'viewer', 'object', 'document:{tag}'))) FROM generate_series(1, {n}) g"
        ))
        .await
        .expect("insert the backlog");
}
