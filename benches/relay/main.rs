//! fga-relay's benchmark: the performance targets' figures, measured with the real relay binary, a PostgreSQL
//! cluster of its own with production settings (fsync on), and the in-process, zero-latency
//! OpenFGA stand-in of the tests. Everything talks over loopback or Unix sockets and stops by
//! itself.
//!
//! ```sh
//! cargo bench --bench relay                 # everything, about 5½ minutes
//! cargo bench --bench relay -- --smoke      # tiny sizes, seconds: does it still run?
//! cargo bench --bench relay -- --only latency,burndown --backlog 50000
//! cargo bench --bench relay -- --help
//! ```
//!
//! BENCHMARKS.md has the results, where the time goes, and what each scenario means. This is a
//! program, not a test: nothing here asserts a timing; it prints a table and whether each of
//! the performance targets is met.

#[path = "../tests/common/mod.rs"]
mod common;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use common::fga::{FakeFga, STORE_ID};
use common::pg::{PgOptions, TestDb};
use common::relay::RelayProc;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_postgres::{AsyncMessage, Client, NoTls};
use tokio_util::sync::CancellationToken;

/// The relay's claim, exactly as it runs it (the table name is the default one).
const CLAIM_SQL: &str = include_str!("../sql/queries/claim.sql");
/// The relay's default `--batch-size`, for EXPLAINing its claim.
const BATCH: i64 = 500;

// ------------------------------------------------------------------------------------------------
// Command line
// ------------------------------------------------------------------------------------------------

#[derive(Parser, Debug)]
#[command(
    about = "fga-relay's benchmark: the performance targets' scenarios against the real relay (see BENCHMARKS.md)"
)]
struct Args {
    /// Tiny sizes, a few seconds in all: checks that the benchmark still runs (CI).
    #[arg(long)]
    smoke: bool,
    /// Scenarios to run, comma-separated (default: all of them).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Scenario>,
    /// Single-row commits measured in each latency run [1000; smoke 40].
    #[arg(long)]
    latency_commits: Option<usize>,
    /// Commits per second in the latency runs [200].
    #[arg(long)]
    latency_rate: Option<u32>,
    /// Rows in the burn-down backlog, 2 tuples each [100000; smoke 2000].
    #[arg(long)]
    backlog: Option<usize>,
    /// Delivered rows in the table for the history scenario [1000000; smoke 20000].
    #[arg(long)]
    history: Option<usize>,
    /// Rows in the baseline drainer's burn-down backlog [20000; smoke 300].
    #[arg(long)]
    baseline_backlog: Option<usize>,
    /// Seconds of each pgbench run [6; smoke 1].
    #[arg(long)]
    pgbench_seconds: Option<u64>,
    /// pgbench client counts, comma-separated [1,8].
    #[arg(long, value_delimiter = ',')]
    pgbench_clients: Vec<u32>,
    /// Rounds of pgbench runs, each round one run of each configuration back to back; the
    /// median of the rounds' ratios counts [5; smoke 1].
    #[arg(long)]
    pgbench_runs: Option<usize>,
    /// Seconds the idle relay is watched [60; smoke 3].
    #[arg(long)]
    idle_seconds: Option<u64>,
    /// The relay binary to measure (default: this tree's, built in release by cargo bench).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Extra environment for every relay, NAME=VALUE (e.g. FGA_RELAY_BATCH_SIZE=1000).
    #[arg(long = "relay-env", value_parser = parse_kv)]
    relay_env: Vec<(String, String)>,
    /// Profile the relay and its PostgreSQL sessions during the first burn-down with
    /// `perf record --call-graph dwarf` into this file (`perf report -i FILE` reads it).
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// A name filter `cargo bench NAME` passes on; ignored.
    #[arg(hide = true)]
    filter: Vec<String>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Latency,
    Burndown,
    History,
    Writers,
    Idle,
    Baseline,
}

/// The sizes of one run, from the flags, `--smoke` and the defaults.
#[derive(Debug, Clone)]
struct Sizes {
    smoke: bool,
    latency_commits: usize,
    latency_warmup: usize,
    latency_rate: u32,
    backlog: usize,
    history: usize,
    baseline_backlog: usize,
    pgbench_seconds: u64,
    pgbench_runs: usize,
    pgbench_clients: Vec<u32>,
    idle_seconds: u64,
}

impl Sizes {
    fn from(a: &Args) -> Sizes {
        let s = a.smoke;
        Sizes {
            smoke: s,
            latency_commits: a.latency_commits.unwrap_or(if s { 40 } else { 1000 }),
            latency_warmup: if s { 5 } else { 100 },
            latency_rate: a.latency_rate.unwrap_or(200).max(1),
            backlog: a.backlog.unwrap_or(if s { 2_000 } else { 100_000 }).max(1),
            history: a.history.unwrap_or(if s { 20_000 } else { 1_000_000 }),
            baseline_backlog: a
                .baseline_backlog
                .unwrap_or(if s { 300 } else { 20_000 })
                .max(1),
            pgbench_seconds: a.pgbench_seconds.unwrap_or(if s { 1 } else { 6 }).max(1),
            pgbench_runs: a.pgbench_runs.unwrap_or(if s { 1 } else { 5 }).max(1),
            pgbench_clients: if a.pgbench_clients.is_empty() {
                vec![1, 8]
            } else {
                a.pgbench_clients.clone()
            },
            idle_seconds: a.idle_seconds.unwrap_or(if s { 3 } else { 60 }).max(1),
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let sizes = Sizes::from(&args);
    let all = [
        Scenario::Latency,
        Scenario::Burndown,
        Scenario::History,
        Scenario::Writers,
        Scenario::Idle,
        Scenario::Baseline,
    ];
    let chosen: Vec<Scenario> = if args.only.is_empty() {
        all.to_vec()
    } else {
        all.into_iter().filter(|s| args.only.contains(s)).collect()
    };
    let started = Instant::now();
    let bench = Bench::start(&args).await?;
    bench.print_header(&args, &sizes).await?;
    let mut results = Results::default();
    for scenario in chosen {
        let t = Instant::now();
        println!("\n=== {scenario:?} ===");
        match scenario {
            Scenario::Latency => results.latency = Some(bench.latency(&sizes).await?),
            Scenario::Burndown => results.burndown = Some(bench.burndown(&sizes).await?),
            Scenario::History => results.history = Some(bench.history(&sizes).await?),
            Scenario::Writers => results.writers = bench.writers(&sizes).await?,
            Scenario::Idle => results.idle = Some(bench.idle(&sizes).await?),
            Scenario::Baseline => results.baseline = Some(bench.baseline(&sizes).await?),
        }
        println!("({scenario:?}: {:.1} s)", t.elapsed().as_secs_f64());
    }
    results.print_summary(&sizes);
    println!(
        "\nbenchmark done in {:.0} s; load average now {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// The bench: a cluster, a role for the relay, and ways to run relays
// ------------------------------------------------------------------------------------------------

struct Bench {
    db: TestDb,
    /// The bench's own connection, as `postgres`.
    admin: Client,
    relay_bin: PathBuf,
    relay_env: Vec<(String, String)>,
    /// `DATABASE_URL` for relays: the `fga_relay` role, so that pg_stat_statements and
    /// pg_stat_activity tell the relay's statements and sessions from the bench's.
    relay_url: String,
    postmaster: u32,
    /// Where to write the profile of the next burn-down, if asked for.
    perf: std::sync::Mutex<Option<PathBuf>>,
}

impl Bench {
    async fn start(args: &Args) -> Result<Bench> {
        let db = TestDb::start_with(PgOptions {
            durable: true,
            settings: vec![(
                "shared_preload_libraries".into(),
                "pg_stat_statements".into(),
            )],
            ..PgOptions::default()
        });
        let admin = db.connect().await;
        admin
            .batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; \
                 CREATE ROLE fga_relay LOGIN SUPERUSER",
            )
            .await
            .context("set up the bench's database")?;
        let relay_url = db.url().replace("user=postgres", "user=fga_relay");
        let backend: i32 = admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let postmaster = proc_stat(backend as u32)
            .map(|s| s.ppid)
            .context("the postmaster's pid")?;
        let bench = Bench {
            db,
            admin,
            relay_bin: args
                .relay_bin
                .clone()
                .unwrap_or_else(|| PathBuf::from(common::relay::BIN)),
            relay_env: args.relay_env.clone(),
            relay_url,
            postmaster,
            perf: std::sync::Mutex::new(args.perf.clone()),
        };
        bench.migrate()?;
        Ok(bench)
    }

    /// `fga-relay migrate`: creates the schema, or puts the relay's trigger back.
    fn migrate(&self) -> Result<()> {
        let out = self
            .relay_command("migrate")
            .env("DATABASE_URL", self.db.url())
            .output()
            .context("run fga-relay migrate")?;
        if !out.status.success() {
            bail!(
                "fga-relay migrate failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn relay_command(&self, sub: &str) -> Command {
        let mut c = Command::new(&self.relay_bin);
        c.arg(sub).env_clear();
        if let Ok(path) = std::env::var("PATH") {
            c.env("PATH", path);
        }
        c
    }

    /// Starts `fga-relay run` with production settings (the defaults: sweep 30 s, heartbeat
    /// 5 s, batch 500, info logs), `extra` and `--relay-env` on top, and waits until it leads
    /// and has settled into waiting for notifications.
    async fn start_relay(&self, fga: &FakeFga, extra: &[(&str, &str)]) -> Result<RelayProc> {
        let mut c = self.relay_command("run");
        c.env("DATABASE_URL", &self.relay_url)
            .env("FGA_API_URL", fga.url())
            .env("FGA_STORE_ID", STORE_ID)
            .env("FGA_RELAY_HTTP_ADDR", "off")
            .env("RUST_LOG", "info");
        for (k, v) in extra {
            c.env(k, v);
        }
        for (k, v) in &self.relay_env {
            c.env(k, v);
        }
        let relay = RelayProc::spawn(c);
        relay.wait_for_log("delivering (leader)").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(relay)
    }

    /// SIGTERM, wait for the exit, and say whether it logged warnings or errors (other than
    /// those that contain one of `expected`).
    async fn stop_relay(&self, mut relay: RelayProc, what: &str, expected: &[&str]) {
        relay.term();
        let status = relay.wait_exit(Duration::from_secs(20)).await;
        let logs = relay.logs();
        let bad: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .filter(|l| !expected.iter().any(|e| l.contains(e)))
            .collect();
        if !status.success() || !bad.is_empty() {
            println!(
                "  note: the relay ({what}) exited with {status} and logged {} warnings/errors; first: {}",
                bad.len(),
                bad.first().copied().unwrap_or("-")
            );
        }
    }

    async fn print_header(&self, args: &Args, sizes: &Sizes) -> Result<()> {
        let version: String = self.admin.query_one("SELECT version()", &[]).await?.get(0);
        let settings = self
            .admin
            .query(
                "SELECT name || '=' || setting FROM pg_settings WHERE name IN \
                 ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', \
                  'max_wal_size', 'wal_level') ORDER BY name",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join(" ");
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("?")
            .trim()
            .to_owned();
        let mem_gb = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0 / 1024.0)
            .unwrap_or(0.0);
        let commit = Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "?".into());
        println!(
            "fga-relay benchmark{}",
            if args.smoke { " (smoke)" } else { "" }
        );
        println!(
            "machine: {} CPUs ({cpu}), {mem_gb:.0} GB",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("server:  {version}");
        println!("         {settings}");
        println!("relay:   {} (tree at {commit})", self.relay_bin.display());
        if !self.relay_env.is_empty() {
            println!("         with {:?}", self.relay_env);
        }
        println!("sizes:   {sizes:?}");
        println!("load:    {}", loadavg());
        Ok(())
    }

    async fn truncate(&self) -> Result<()> {
        self.admin
            .batch_execute("TRUNCATE fga_outbox; CHECKPOINT")
            .await?;
        Ok(())
    }

    async fn pending_exists(&self) -> Result<bool> {
        Ok(self
            .admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM fga_outbox \
                 WHERE processed_at IS NULL AND failed_at IS NULL)",
                &[],
            )
            .await?
            .get(0))
    }

    /// Polls until no row is pending; returns when that was first seen.
    async fn wait_drained(&self, timeout: Duration, every: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.pending_exists().await? {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("rows still pending after {timeout:?}");
            }
            tokio::time::sleep(every).await;
        }
    }

    async fn count(&self, sql: &str) -> Result<i64> {
        Ok(self.admin.query_one(sql, &[]).await?.get(0))
    }

    /// The pids of the relay's PostgreSQL sessions.
    async fn relay_backends(&self) -> Result<Vec<u32>> {
        Ok(self
            .admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE usename = 'fga_relay'",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, i32>(0) as u32)
            .collect())
    }

    async fn cpu(&self, relay: Option<u32>) -> Result<CpuSnap> {
        self.cpu_with(relay, None).await
    }

    /// As [`Bench::cpu`], also counting a pgbench process.
    async fn cpu_with(&self, relay: Option<u32>, pgbench: Option<u32>) -> Result<CpuSnap> {
        let backends = self.relay_backends().await?;
        Ok(CpuSnap::take(relay, &backends, self.postmaster, pgbench))
    }

    /// `BEGIN; EXPLAIN (ANALYZE, BUFFERS) <the claim>; ROLLBACK` with the relay's parameters
    /// (first page, batch 500), as a generic plan: the relay runs the claim as a prepared
    /// statement, and after five executions PostgreSQL settles on the generic plan when it is
    /// no dearer than the custom ones.
    async fn explain_claim(&self) -> Result<String> {
        let body: String = CLAIM_SQL
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        self.admin
            .batch_execute(&format!(
                "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
                 PREPARE bench_claim(bigint, bigint) AS {body}"
            ))
            .await?;
        let rows = self
            .admin
            .simple_query(&format!(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE bench_claim(0, {BATCH})"
            ))
            .await;
        let cleanup = self.admin.batch_execute("ROLLBACK; DEALLOCATE ALL").await;
        let mut out = String::new();
        for m in rows? {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                let _ = writeln!(out, "    {}", r.get(0).unwrap_or(""));
            }
        }
        cleanup?;
        Ok(out)
    }
}

// ------------------------------------------------------------------------------------------------
// Latency
// ------------------------------------------------------------------------------------------------

/// One single-row commit of a latency run.
struct Commit {
    user: String,
    sent: Instant,
    committed: Instant,
}

#[derive(Clone, Debug, Default)]
struct Dist {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

impl Dist {
    /// Nearest-rank percentiles of milliseconds.
    fn of(mut ms: Vec<f64>) -> Dist {
        if ms.is_empty() {
            return Dist::default();
        }
        ms.sort_by(f64::total_cmp);
        let q = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Dist {
            n: ms.len(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            max: ms[ms.len() - 1],
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
        }
    }

    fn line(&self) -> String {
        format!(
            "p50 {} ms, p90 {} ms, p99 {} ms, max {} ms (mean {} ms, n {})",
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max),
            ms(self.mean),
            self.n
        )
    }
}

/// The machine's load averages: the machine may be shared, and what else runs shows in every
/// number.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[derive(Clone, Debug, Default)]
struct LatencyResult {
    /// Commit returned → the stand-in received the Write with the row's tuple.
    relay: Dist,
    /// INSERT sent → the stand-in received the Write: an upper bound of the above, which
    /// does not depend on when the writer's task saw its commit return.
    from_send: Dist,
    /// The writer's INSERT (autocommit) round trip: the cost of the commit itself.
    commit: Dist,
    /// Commit returned → a plain LISTENer received a NOTIFY sent by that commit.
    notify_floor: Dist,
    /// Deliveries seen before the writer's commit returned (counted as 0 ms).
    early: usize,
    writes: usize,
}

/// Commits `n` single-row transactions, one every 1/rate s, each writing the unique tuple
/// `user:{tag}{i} viewer document:{tag}`; returns when each commit returned.
async fn commit_steadily(client: &Client, tag: &str, n: usize, rate: u32) -> Result<Vec<Commit>> {
    let stmt = client
        .prepare("INSERT INTO fga_outbox (payload) VALUES ($1)")
        .await?;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + period.mul_f64(i as f64)).await;
        let user = format!("user:{tag}{i}");
        let payload = json!({"writes": [
            {"user": user, "relation": "viewer", "object": format!("document:{tag}")}
        ]});
        let sent = Instant::now();
        client.execute(&stmt, &[&payload]).await?;
        let committed = Instant::now();
        out.push(Commit {
            user,
            sent,
            committed,
        });
    }
    Ok(out)
}

/// When the stand-in first received each user's tuple in an accepted Write.
fn receipts(fga: &FakeFga) -> HashMap<String, Instant> {
    let mut m = HashMap::new();
    for w in fga.writes() {
        if w.status != 200 {
            continue;
        }
        let Some(keys) = w
            .body
            .pointer("/writes/tuple_keys")
            .and_then(Value::as_array)
        else {
            continue;
        };
        for k in keys {
            if let Some(u) = k.get("user").and_then(Value::as_str) {
                m.entry(u.to_owned()).or_insert(w.received_at);
            }
        }
    }
    m
}

/// Runs a latency measurement against whatever delivers (relay or baseline drainer).
async fn measure_latency(
    db: &TestDb,
    fga: &FakeFga,
    tag: &str,
    sizes: &Sizes,
    patience: Duration,
) -> Result<LatencyResult> {
    let writer = db.connect().await;
    // Warm-up, not counted: prepared statements, connections, caches.
    let warm = commit_steadily(
        &writer,
        &format!("{tag}w"),
        sizes.latency_warmup,
        sizes.latency_rate,
    )
    .await?;
    if let Some(last) = warm.last() {
        wait_for_tuple(fga, &last.user, &format!("document:{tag}w"), patience).await?;
    }
    let commits = commit_steadily(&writer, tag, sizes.latency_commits, sizes.latency_rate).await?;
    let last = commits.last().expect("at least one commit");
    wait_for_tuple(fga, &last.user, &format!("document:{tag}"), patience).await?;
    let got = receipts(fga);
    let mut lat = Vec::with_capacity(commits.len());
    let mut from_send = Vec::with_capacity(commits.len());
    let mut early = 0;
    for c in &commits {
        let at = got
            .get(&c.user)
            .with_context(|| format!("{} was never delivered", c.user))?;
        if *at < c.committed {
            early += 1;
        }
        lat.push(at.saturating_duration_since(c.committed).as_secs_f64() * 1e3);
        from_send.push(at.saturating_duration_since(c.sent).as_secs_f64() * 1e3);
    }
    let first = commits[0].sent;
    let writes = fga
        .writes()
        .iter()
        .filter(|w| w.received_at >= first)
        .count();
    Ok(LatencyResult {
        relay: Dist::of(lat),
        from_send: Dist::of(from_send),
        commit: Dist::of(
            commits
                .iter()
                .map(|c| (c.committed - c.sent).as_secs_f64() * 1e3)
                .collect(),
        ),
        notify_floor: Dist::default(),
        early,
        writes,
    })
}

/// Waits until the stand-in holds `user viewer object`.
async fn wait_for_tuple(fga: &FakeFga, user: &str, object: &str, patience: Duration) -> Result<()> {
    let deadline = Instant::now() + patience;
    while !fga.has(user, "viewer", object) {
        if Instant::now() > deadline {
            bail!("{user} not delivered within {patience:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The floor under any LISTEN/NOTIFY relay: a writer inserts a row and NOTIFYs in one
/// transaction; how long after its commit returns does a plain LISTENer hear it?
async fn notify_floor(db: &TestDb, n: usize, rate: u32) -> Result<Dist> {
    let (listener, mut conn) = tokio_postgres::connect(db.url(), NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let driver = tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notification(_)) => {
                    let _ = tx.send(Instant::now());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    listener
        .batch_execute("CREATE TABLE IF NOT EXISTS bench_floor (x int); LISTEN bench_floor")
        .await?;
    let writer = db.connect().await;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        tokio::time::sleep(period).await;
        writer
            .batch_execute(
                "INSERT INTO bench_floor VALUES (1); SELECT pg_notify('bench_floor', '')",
            )
            .await?;
        let committed = Instant::now();
        let heard = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .context("no notification")?
            .context("listener gone")?;
        if i >= 10 {
            lat.push(heard.saturating_duration_since(committed).as_secs_f64() * 1e3);
        }
    }
    listener.batch_execute("DROP TABLE bench_floor").await?;
    drop(listener);
    driver.abort();
    Ok(Dist::of(lat))
}

impl Bench {
    async fn latency(&self, sizes: &Sizes) -> Result<LatencyResult> {
        self.truncate().await?;
        let floor =
            notify_floor(&self.db, sizes.latency_commits.min(500), sizes.latency_rate).await?;
        let fga = FakeFga::start();
        let relay = self.start_relay(&fga, &[]).await?;
        let cpu0 = self.cpu(Some(relay.pid())).await?;
        let mut r = measure_latency(&self.db, &fga, "lat", sizes, Duration::from_secs(10)).await?;
        let cpu = cpu0.until(&self.cpu(Some(relay.pid())).await?);
        self.stop_relay(relay, "latency", &[]).await;
        r.notify_floor = floor;
        println!(
            "{} single-row commits at {}/s, relay running with default settings",
            sizes.latency_commits, sizes.latency_rate
        );
        println!("  commit → OpenFGA Write:      {}", r.relay.line());
        println!("  INSERT sent → OpenFGA Write: {}", r.from_send.line());
        println!("  insert+commit (writer):      {}", r.commit.line());
        println!("  commit → plain LISTENer:     {}", r.notify_floor.line());
        println!(
            "  Writes sent: {} ({} deliveries seen before the writer saw its commit return)",
            r.writes, r.early
        );
        println!("  {}", cpu.line());
        Ok(r)
    }
}

// ------------------------------------------------------------------------------------------------
// CPU accounting
// ------------------------------------------------------------------------------------------------

struct ProcStat {
    ppid: u32,
    /// utime + stime, in clock ticks.
    ticks: u64,
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    Some(ProcStat {
        ppid: f.get(1)?.parse().ok()?,
        ticks: f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?,
    })
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU used so far by each party, in clock ticks.
#[derive(Clone, Copy, Debug, Default)]
struct CpuSnap {
    at: Option<Instant>,
    relay: u64,
    relay_pg: u64,
    pg_all: u64,
    standin: u64,
    bench_all: u64,
    pgbench: u64,
    machine_busy: u64,
}

impl CpuSnap {
    fn take(
        relay: Option<u32>,
        relay_backends: &[u32],
        postmaster: u32,
        pgbench: Option<u32>,
    ) -> CpuSnap {
        let mut s = CpuSnap {
            at: Some(Instant::now()),
            ..CpuSnap::default()
        };
        if let Some(pid) = pgbench {
            s.pgbench = proc_stat(pid).map_or(0, |p| p.ticks);
        }
        if let Some(pid) = relay {
            s.relay = proc_stat(pid).map_or(0, |p| p.ticks);
        }
        s.relay_pg = relay_backends
            .iter()
            .filter_map(|&p| proc_stat(p))
            .map(|p| p.ticks)
            .sum();
        // The postmaster and its children: backends, walwriter, checkpointer, autovacuum.
        s.pg_all = proc_stat(postmaster).map_or(0, |p| p.ticks);
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(p) = proc_stat(pid).filter(|p| p.ppid == postmaster) {
                    s.pg_all += p.ticks;
                }
            }
        }
        // The stand-in's threads (its accept loop and its runtime's workers), in this process.
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for e in dir.flatten() {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                if comm.trim().starts_with("fake-fga") {
                    let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    s.standin += parse_stat(&stat).map_or(0, |p| p.ticks);
                }
            }
        }
        s.bench_all = proc_stat(std::process::id()).map_or(0, |p| p.ticks);
        if let Some(line) = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .next()
        {
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            let total: u64 = v.iter().take(8).sum();
            s.machine_busy = total - idle;
        }
        s
    }

    /// CPU-seconds used by each party between `self` and `later`.
    fn until(&self, later: &CpuSnap) -> CpuUse {
        let hz = clock_ticks_per_second();
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64 / hz;
        let wall = match (self.at, later.at) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let standin = d(self.standin, later.standin);
        CpuUse {
            wall,
            relay: d(self.relay, later.relay),
            relay_pg: d(self.relay_pg, later.relay_pg),
            pg_other: d(self.pg_all, later.pg_all) - d(self.relay_pg, later.relay_pg),
            standin,
            bench: d(self.bench_all, later.bench_all) - standin,
            pgbench: d(self.pgbench, later.pgbench),
            machine: d(self.machine_busy, later.machine_busy),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct CpuUse {
    wall: f64,
    relay: f64,
    relay_pg: f64,
    pg_other: f64,
    standin: f64,
    bench: f64,
    /// pgbench, when it ran.
    pgbench: f64,
    machine: f64,
}

impl CpuUse {
    /// CPU the machine spent on processes other than the bench's: on a shared machine, the
    /// noise in every number here.
    fn others(&self) -> f64 {
        (self.machine
            - self.relay
            - self.relay_pg
            - self.pg_other
            - self.standin
            - self.bench
            - self.pgbench)
            .max(0.0)
    }

    fn line(&self) -> String {
        let pct = |s: f64| {
            if self.wall > 0.0 {
                s / self.wall * 100.0
            } else {
                0.0
            }
        };
        format!(
            "CPU over {:.2} s (100% = one core): relay {:.0}%, its PostgreSQL sessions {:.0}%, \
             rest of PostgreSQL {:.0}%, OpenFGA stand-in {:.0}%, bench {:.0}%, other processes \
             {:.0}%; machine busy {:.0}% of {}%",
            self.wall,
            pct(self.relay),
            pct(self.relay_pg),
            pct(self.pg_other.max(0.0)),
            pct(self.standin),
            pct(self.bench.max(0.0)),
            pct(self.others()),
            pct(self.machine),
            100 * std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    }
}

// ------------------------------------------------------------------------------------------------
// Burn-down and history
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct BurnDown {
    rows: usize,
    tuples: usize,
    /// SIGCONT to the relay → no row pending.
    secs: f64,
    /// SIGCONT → the stand-in received the last row's tuples.
    last_write_secs: f64,
    writes: usize,
    cpu: CpuUse,
    insert_secs: f64,
    explain: String,
    /// The relay's statements during the burn-down: (calls, total ms, rows, query).
    statements: Vec<(i64, f64, i64, String)>,
}

impl BurnDown {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.secs
    }
    fn tuples_per_s(&self) -> f64 {
        self.tuples as f64 / self.secs
    }
    fn print(&self, label: &str) {
        println!(
            "  {label}: {} rows ({} tuples) in {:.3} s: {:.0} rows/s, {:.0} tuples/s, {} Writes \
             ({:.1} tuples each); last Write received at {:.3} s",
            self.rows,
            self.tuples,
            self.secs,
            self.rows_per_s(),
            self.tuples_per_s(),
            self.writes,
            self.tuples as f64 / self.writes.max(1) as f64,
            self.last_write_secs
        );
        println!("    {}", self.cpu.line());
        println!(
            "    stand-in cost: {:.0} µs CPU per Write",
            self.cpu.standin / self.writes.max(1) as f64 * 1e6
        );
        let total: f64 = self.statements.iter().map(|s| s.1).sum();
        println!(
            "    the relay's statements, {:.0} ms of execution in PostgreSQL ({:.0}% of the wall \
             time):",
            total,
            total / 1e3 / self.secs * 100.0
        );
        for (calls, ms_total, rows, q) in self.statements.iter().take(6) {
            let q: String = q.chars().take(80).collect();
            println!(
                "    {calls:>7} calls {ms_total:>8.1} ms ({:>6.3} ms each, {rows:>7} rows)  {q}",
                ms_total / (*calls).max(1) as f64
            );
        }
    }
}

/// `INSERT ... SELECT generate_series`: `n` rows of 2 tuples each (the README's example shape),
/// unique per row through `tag`; delivered already when `delivered`.
fn rows_sql(tag: &str, n: usize, delivered: bool) -> String {
    let (cols, vals) = if delivered {
        (", created_at, processed_at", ", now(), now()")
    } else {
        ("", "")
    };
    format!(
        "INSERT INTO fga_outbox (payload{cols}) \
         SELECT jsonb_build_object('writes', jsonb_build_array( \
           jsonb_build_object('user', 'capture_job:{tag}' || g, 'relation', 'parent', \
                              'object', 'archive:{tag}' || g), \
           jsonb_build_object('user', 'organization:acme', 'relation', 'parent', \
                              'object', 'capture_job:{tag}' || g))){vals} \
         FROM generate_series(1, {n}) g"
    )
}

/// `perf record` of these processes, all threads, with DWARF call graphs.
async fn start_perf(path: &Path, pids: &[u32]) -> Result<std::process::Child> {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let child = Command::new("perf")
        .args([
            "record",
            "-q",
            "-F",
            "997",
            "--call-graph",
            "dwarf,16384",
            "-o",
        ])
        .arg(path)
        .args(["-p", &pids.join(",")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("run perf record (is perf installed?)")?;
    // perf needs a moment to attach.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(child)
}

fn stop_perf(mut child: std::process::Child) -> Result<()> {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    child.wait()?;
    Ok(())
}

fn signal(relay: &RelayProc, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(relay.pid() as i32, sig);
    }
}

impl Bench {
    /// A backlog of `n` rows burnt down by a warm relay. The relay is paused (SIGSTOP) while
    /// the backlog is inserted, analysed and EXPLAINed, and the clock starts at SIGCONT: the
    /// notification of the backlog's commit is waiting for it then.
    async fn burn(&self, n: usize, tag: &str) -> Result<BurnDown> {
        let fga = FakeFga::start();
        let relay = self.start_relay(&fga, &[]).await?;
        signal(&relay, libc::SIGSTOP);
        let t = Instant::now();
        self.admin.batch_execute(&rows_sql(tag, n, false)).await?;
        let insert_secs = t.elapsed().as_secs_f64();
        self.admin
            .batch_execute("ANALYZE fga_outbox; CHECKPOINT")
            .await?;
        let explain = self.explain_claim().await?;
        let perf = self.perf.lock().expect("not poisoned").take();
        let perf = match perf {
            Some(path) => {
                let mut pids = self.relay_backends().await?;
                pids.push(relay.pid());
                Some(start_perf(&path, &pids).await?)
            }
            None => None,
        };
        self.admin
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await?;
        let cpu0 = self.cpu(Some(relay.pid())).await?;
        let t0 = Instant::now();
        signal(&relay, libc::SIGCONT);
        let last_user = format!("capture_job:{tag}{n}");
        let last_object = format!("archive:{tag}{n}");
        let patience = Duration::from_secs(60 + n as u64 / 1000);
        while !fga.has(&last_user, "parent", &last_object) {
            if t0.elapsed() > patience {
                self.stop_relay(relay, "burn-down", &[]).await;
                bail!("burn-down of {n} rows did not finish within {patience:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let last_write = t0.elapsed();
        let done = self
            .wait_drained(Duration::from_secs(30), Duration::from_millis(2))
            .await?;
        let cpu1 = self.cpu(Some(relay.pid())).await?;
        if let Some(child) = perf {
            stop_perf(child)?;
        }
        let statements = self.relay_statements().await?;
        let writes = fga.write_count();
        let stored = fga.tuples().len();
        self.stop_relay(relay, "burn-down", &[]).await;
        if stored != 2 * n {
            bail!("the stand-in holds {stored} tuples, expected {}", 2 * n);
        }
        Ok(BurnDown {
            rows: n,
            tuples: 2 * n,
            secs: (done - t0).as_secs_f64(),
            last_write_secs: last_write.as_secs_f64(),
            writes,
            cpu: cpu0.until(&cpu1),
            insert_secs,
            explain,
            statements,
        })
    }

    /// What the relay's statements cost PostgreSQL since the last pg_stat_statements_reset():
    /// (calls, total ms, rows, query), dearest first.
    async fn relay_statements(&self) -> Result<Vec<(i64, f64, i64, String)>> {
        Ok(self
            .admin
            .query(
                "SELECT calls, total_exec_time, rows, \
                 regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g') \
                 FROM pg_stat_statements WHERE userid = 'fga_relay'::regrole \
                 ORDER BY total_exec_time DESC, calls DESC",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    async fn burndown(&self, sizes: &Sizes) -> Result<BurnDown> {
        self.truncate().await?;
        let r = self.burn(sizes.backlog, "bd").await?;
        println!(
            "backlog of {} rows (inserted in {:.1} s), relay with default settings (batch 500)",
            sizes.backlog, r.insert_secs
        );
        r.print("burn-down");
        Ok(r)
    }

    async fn history(&self, sizes: &Sizes) -> Result<History> {
        // None delivered before: an empty table, then the backlog.
        self.truncate().await?;
        self.admin
            .batch_execute("VACUUM ANALYZE fga_outbox")
            .await?;
        let idle_none = self.explain_claim().await?;
        let none = self.burn(sizes.backlog, "hn").await?;
        // A million delivered rows before, as a relay leaves them behind.
        self.truncate().await?;
        let t = Instant::now();
        self.admin
            .batch_execute(&rows_sql("h", sizes.history, true))
            .await?;
        self.admin
            .batch_execute("VACUUM ANALYZE fga_outbox")
            .await?;
        self.admin.batch_execute("CHECKPOINT").await?;
        let fill_secs = t.elapsed().as_secs_f64();
        let size: String = self
            .admin
            .query_one(
                "SELECT pg_size_pretty(pg_total_relation_size('fga_outbox'))",
                &[],
            )
            .await?
            .get(0);
        let idle_full = self.explain_claim().await?;
        let full = self.burn(sizes.backlog, "hf").await?;
        println!(
            "backlog of {} rows, with no delivered row in the table vs. {} ({size}, filled and \
             vacuumed in {fill_secs:.1} s)",
            sizes.backlog, sizes.history
        );
        none.print("none delivered  ");
        full.print("with the history");
        println!(
            "  ratio: {:.2} (rows/s with the history / without)",
            full.rows_per_s() / none.rows_per_s()
        );
        println!("  the claim with nothing pending, no history:\n{idle_none}");
        println!(
            "  the claim with nothing pending, {} delivered rows:\n{idle_full}",
            sizes.history
        );
        println!(
            "  the claim over the backlog, no history:\n{}",
            none.explain
        );
        println!(
            "  the claim over the backlog, {} delivered rows:\n{}",
            sizes.history, full.explain
        );
        Ok(History {
            none,
            full,
            idle_none,
            idle_full,
        })
    }
}

#[derive(Clone, Debug, Default)]
struct History {
    none: BurnDown,
    full: BurnDown,
    idle_none: String,
    idle_full: String,
}

/// The buffers an EXPLAIN's top node read ("Buffers: shared hit=N read=M": N + M; 0 when it
/// touched none).
fn top_buffers(explain: &str) -> u64 {
    explain
        .lines()
        .take_while(|l| !l.contains("Planning:"))
        .find(|l| l.contains("Buffers:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .filter(|(k, _)| *k == "hit" || *k == "read")
                .filter_map(|(_, n)| n.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// "Execution Time: X ms" of an EXPLAIN ANALYZE.
fn exec_ms(explain: &str) -> f64 {
    explain
        .lines()
        .find_map(|l| l.trim().strip_prefix("Execution Time: "))
        .and_then(|v| v.trim_end_matches(" ms").parse().ok())
        .unwrap_or(f64::NAN)
}

// ------------------------------------------------------------------------------------------------
// Writers
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TriggerKind {
    None,
    Relay,
    PlainNotify,
}

impl TriggerKind {
    /// Without the relay's trigger, the relay says so at start and whenever a sweep finds rows.
    fn expected_warnings(self) -> &'static [&'static str] {
        match self {
            TriggerKind::Relay => &[],
            _ => &["wake-up trigger", "the sweep found rows"],
        }
    }

    fn label(self) -> &'static str {
        match self {
            TriggerKind::None => "no trigger",
            TriggerKind::Relay => "relay's trigger",
            TriggerKind::PlainNotify => "plain NOTIFY trigger",
        }
    }
}

#[derive(Clone, Debug)]
struct WriterRun {
    clients: u32,
    trigger: TriggerKind,
    tps: Vec<f64>,
    relay_cpu: Vec<f64>,
    /// Transactions run and notifications the relay received, over all runs.
    transactions: i64,
    notifications: f64,
    /// CPU share of processes other than the bench's, per run.
    others: Vec<f64>,
}

impl WriterRun {
    /// NOTIFYs per 1000 transactions: each notifying transaction took PostgreSQL's global
    /// NOTIFY lock at commit (notifications of different transactions are never folded).
    fn notify_rate(&self) -> f64 {
        self.notifications / self.transactions.max(1) as f64 * 1000.0
    }

    fn median(&self) -> f64 {
        median(self.tps.clone())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The median over rounds of `kind`'s throughput relative to no trigger in the same round:
/// runs of one round are back to back, so they share the machine's load, whatever else runs.
fn round_ratio(runs: &[WriterRun], clients: u32, kind: TriggerKind) -> f64 {
    let find = |k: TriggerKind| runs.iter().find(|r| r.clients == clients && r.trigger == k);
    let (Some(a), Some(base)) = (find(kind), find(TriggerKind::None)) else {
        return f64::NAN;
    };
    median(a.tps.iter().zip(&base.tps).map(|(x, b)| x / b).collect())
}

/// The pgbench script: one single-row transaction inserting an outbox row with a unique tuple.
const PGBENCH_SCRIPT: &str = "\\set n random(1, 2000000000)
INSERT INTO fga_outbox (payload) VALUES (jsonb_build_object('writes', jsonb_build_array(jsonb_build_object('user', 'user:' || :client_id || '-' || :n, 'relation', 'viewer', 'object', 'document:' || :client_id))));
";

/// A free port on 127.0.0.1, as `127.0.0.1:PORT` (bound and let go: nothing else here takes
/// ports in between).
fn free_local_addr() -> Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// One counter from the relay's `/metrics`; 0 when it cannot be read.
async fn scrape(addr: &str, name: &str) -> f64 {
    let Ok(resp) = reqwest::get(format!("http://{addr}/metrics")).await else {
        return 0.0;
    };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn pgbench_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PGBENCH") {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/pgbench"]
        .into_iter()
        .map(PathBuf::from)
        .chain(
            std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("bin/pgbench")),
        )
        .find(|c| c.exists())
}

fn pgbench(
    bin: &Path,
    socket_dir: &Path,
    script: &Path,
    clients: u32,
    secs: u64,
) -> Result<std::process::Child> {
    Command::new(bin)
        .args(["-n", "-M", "prepared", "-h"])
        .arg(socket_dir)
        .args(["-p", "5432", "-U", "postgres", "-f"])
        .arg(script)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
            "-T",
            &secs.to_string(),
            "postgres",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("run pgbench")
}

/// pgbench's throughput, once it has finished.
fn pgbench_tps(out: std::process::Output) -> Result<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")
                .filter(|r| r.contains("without initial connection time"))
                .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        })
        .with_context(|| format!("no tps in pgbench's output: {text}"))
}

impl Bench {
    async fn set_trigger(&self, kind: TriggerKind) -> Result<()> {
        match kind {
            TriggerKind::Relay => self.migrate()?,
            TriggerKind::None => {
                self.admin
                    .batch_execute("DROP TRIGGER IF EXISTS fga_outbox_notify ON fga_outbox")
                    .await?
            }
            TriggerKind::PlainNotify => {
                self.admin
                    .batch_execute(
                        "CREATE OR REPLACE FUNCTION bench_plain_notify() RETURNS trigger \
                         LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('fga_outbox', ''); \
                         RETURN NULL; END $$; \
                         DROP TRIGGER IF EXISTS fga_outbox_notify ON fga_outbox; \
                         CREATE TRIGGER fga_outbox_notify AFTER INSERT ON fga_outbox \
                         FOR EACH STATEMENT EXECUTE FUNCTION bench_plain_notify()",
                    )
                    .await?
            }
        }
        Ok(())
    }

    async fn writers(&self, sizes: &Sizes) -> Result<Vec<WriterRun>> {
        let Some(bin) = pgbench_path() else {
            println!("pgbench not found (set PGBENCH): skipped");
            return Ok(Vec::new());
        };
        let socket_dir = self
            .db
            .socket_dir()
            .context("the bench runs its own cluster")?
            .to_owned();
        let script =
            std::env::temp_dir().join(format!("fga-relay-bench-{}.sql", std::process::id()));
        std::fs::write(&script, PGBENCH_SCRIPT)?;
        let kinds = [
            TriggerKind::None,
            TriggerKind::Relay,
            TriggerKind::PlainNotify,
        ];
        let mut runs: Vec<WriterRun> = Vec::new();
        println!(
            "pgbench -M prepared, one single-row INSERT per transaction, {} s a run, {} round(s) \
             of the three configurations back to back; a relay runs throughout (sweep 100 ms, so \
             that it delivers without a trigger too)",
            sizes.pgbench_seconds, sizes.pgbench_runs
        );
        for &clients in &sizes.pgbench_clients {
            for kind in kinds {
                runs.push(WriterRun {
                    clients,
                    trigger: kind,
                    tps: Vec::new(),
                    relay_cpu: Vec::new(),
                    transactions: 0,
                    notifications: 0.0,
                    others: Vec::new(),
                });
            }
            for run in 0..sizes.pgbench_runs {
                // A different order each round, so that a drift in the machine's load does not
                // always fall on the same configuration.
                let mut order = kinds;
                order.rotate_left(run % kinds.len());
                for kind in order {
                    self.truncate().await?;
                    self.set_trigger(kind).await?;
                    let fga = FakeFga::start();
                    let metrics = free_local_addr()?;
                    let relay = self
                        .start_relay(
                            &fga,
                            &[
                                ("FGA_RELAY_SWEEP_INTERVAL", "100ms"),
                                ("FGA_RELAY_HTTP_ADDR", &metrics),
                            ],
                        )
                        .await?;
                    let notified0 = scrape(&metrics, "fga_relay_notifications_total").await;
                    let secs = sizes.pgbench_seconds;
                    let child = pgbench(&bin, &socket_dir, &script, clients, secs)?;
                    let pgbench_pid = child.id();
                    let finished = tokio::task::spawn_blocking(move || child.wait_with_output());
                    // CPU is measured over the middle of the run, while every writer's session
                    // exists: a process that has exited no longer shows its CPU time.
                    let margin = if secs >= 3 { 1.0 } else { 0.2 };
                    tokio::time::sleep(Duration::from_secs_f64(margin)).await;
                    let cpu0 = self.cpu_with(Some(relay.pid()), Some(pgbench_pid)).await?;
                    tokio::time::sleep(Duration::from_secs_f64(secs as f64 - 2.0 * margin)).await;
                    let cpu1 = self.cpu_with(Some(relay.pid()), Some(pgbench_pid)).await?;
                    let tps = pgbench_tps(finished.await??)?;
                    let notified =
                        scrape(&metrics, "fga_relay_notifications_total").await - notified0;
                    self.wait_drained(Duration::from_secs(120), Duration::from_millis(20))
                        .await?;
                    let rows = self.count("SELECT count(*) FROM fga_outbox").await?;
                    self.stop_relay(relay, kind.label(), kind.expected_warnings())
                        .await;
                    let cpu = cpu0.until(&cpu1);
                    let pct = |x: f64| x / cpu.wall * 100.0;
                    println!(
                        "  {clients} client(s), {:<21} {tps:>7.0} tps; {rows} rows, all \
                         delivered; {notified:.0} notifications reached the relay; CPU: relay \
                         {:.0}%, its sessions {:.0}%, writers' sessions and the rest of \
                         PostgreSQL {:.0}%, pgbench {:.0}%, other processes {:.0}%",
                        kind.label(),
                        pct(cpu.relay),
                        pct(cpu.relay_pg),
                        pct(cpu.pg_other),
                        pct(cpu.pgbench),
                        pct(cpu.others())
                    );
                    let run = runs
                        .iter_mut()
                        .find(|r| r.clients == clients && r.trigger == kind)
                        .expect("set up above");
                    run.tps.push(tps);
                    run.relay_cpu.push(cpu.relay / cpu.wall);
                    run.transactions += rows;
                    run.notifications += notified;
                    run.others.push(cpu.others() / cpu.wall);
                }
            }
        }
        self.set_trigger(TriggerKind::Relay).await?;
        let _ = std::fs::remove_file(&script);
        for &clients in &sizes.pgbench_clients {
            for r in runs.iter().filter(|r| r.clients == clients) {
                println!(
                    "  median, {clients} client(s), {:<21} {:>7.0} tps ({:+.1}% vs. no trigger, \
                     median of the rounds); {:.2} NOTIFYs per 1000 transactions; relay CPU \
                     {:.0}%, other processes {:.0}%",
                    r.trigger.label(),
                    r.median(),
                    (round_ratio(&runs, clients, r.trigger) - 1.0) * 100.0,
                    r.notify_rate(),
                    median(r.relay_cpu.clone()) * 100.0,
                    median(r.others.clone()) * 100.0
                );
            }
        }
        Ok(runs)
    }
}

// ------------------------------------------------------------------------------------------------
// Idle
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct IdleResult {
    secs: f64,
    statements: Vec<(i64, String)>,
    commits: i64,
    cpu: CpuUse,
    writes: usize,
}

impl IdleResult {
    fn total_statements(&self) -> i64 {
        self.statements.iter().map(|(n, _)| n).sum()
    }
}

impl Bench {
    async fn idle(&self, sizes: &Sizes) -> Result<IdleResult> {
        self.truncate().await?;
        let fga = FakeFga::start();
        let relay = self.start_relay(&fga, &[]).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.admin
            .batch_execute("SELECT pg_stat_statements_reset(); SELECT pg_stat_clear_snapshot()")
            .await?;
        let commits_sql =
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
        let c0 = self.count(commits_sql).await?;
        let cpu0 = self.cpu(Some(relay.pid())).await?;
        tokio::time::sleep(Duration::from_secs(sizes.idle_seconds)).await;
        let cpu1 = self.cpu(Some(relay.pid())).await?;
        // Statistics reach the shared counters within a second or so of the transaction.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        self.admin
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await?;
        let c1 = self.count(commits_sql).await?;
        let statements: Vec<(i64, String)> = self
            .admin
            .query(
                "SELECT calls, regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), \
                 '\\s+', ' ', 'g') FROM pg_stat_statements \
                 WHERE userid = 'fga_relay'::regrole ORDER BY calls DESC, query",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let writes = fga.write_count();
        self.stop_relay(relay, "idle", &[]).await;
        let r = IdleResult {
            secs: sizes.idle_seconds as f64,
            statements,
            commits: c1 - c0,
            cpu: cpu0.until(&cpu1),
            writes,
        };
        println!(
            "{} s of an idle relay (default settings: heartbeat 5 s, sweep 30 s)",
            sizes.idle_seconds
        );
        println!(
            "  statements the relay sent: {} ({:.2}/s); transactions committed in the database \
             (anyone's): {}; Writes: {}",
            r.total_statements(),
            r.total_statements() as f64 / r.secs,
            r.commits,
            r.writes
        );
        for (n, q) in &r.statements {
            let q: String = q.chars().take(110).collect();
            println!("    {n:>5}  {q}");
        }
        println!(
            "  relay CPU {:.3} s ({:.3}% of a core); its PostgreSQL sessions {:.3} s",
            r.cpu.relay,
            r.cpu.relay / r.cpu.wall * 100.0,
            r.cpu.relay_pg
        );
        Ok(r)
    }
}

// ------------------------------------------------------------------------------------------------
// Baseline: a timer-driven drainer as applications often write it
// ------------------------------------------------------------------------------------------------

/// Every second: select the pending rows (500 at a time, until none is left) and, for each row,
/// send one Write with its tuples, then mark it delivered. Plain autocommit statements on one
/// connection, one reqwest client: the code an application typically grows.
async fn baseline_drainer(
    db_url: String,
    fga_url: String,
    stop: CancellationToken,
) -> Result<usize> {
    let (client, conn) = tokio_postgres::connect(&db_url, NoTls).await?;
    let driver = tokio::spawn(conn);
    let http = reqwest::Client::new();
    let url = format!("{fga_url}/stores/{STORE_ID}/write");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut sent = 0usize;
    'ticks: loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => break,
        }
        loop {
            let rows = client
                .query(
                    "SELECT id, payload FROM fga_outbox WHERE processed_at IS NULL \
                     ORDER BY id LIMIT 500",
                    &[],
                )
                .await?;
            if rows.is_empty() {
                break;
            }
            for row in rows {
                if stop.is_cancelled() {
                    break 'ticks;
                }
                let id: i64 = row.get(0);
                let payload: Value = row.get(1);
                let body = json!({"writes": {"tuple_keys": payload["writes"]}});
                let resp = http.post(&url).json(&body).send().await?;
                sent += 1;
                if resp.status().is_success() {
                    client
                        .execute(
                            "UPDATE fga_outbox SET processed_at = now() WHERE id = $1",
                            &[&id],
                        )
                        .await?;
                } else {
                    bail!("baseline: OpenFGA answered {}", resp.status());
                }
            }
        }
    }
    drop(client);
    let _ = driver.await;
    Ok(sent)
}

#[derive(Clone, Debug, Default)]
struct BaselineResult {
    latency: LatencyResult,
    rows: usize,
    secs: f64,
    writes: usize,
}

impl BaselineResult {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.secs
    }
}

impl Bench {
    async fn baseline(&self, sizes: &Sizes) -> Result<BaselineResult> {
        // Latency.
        self.truncate().await?;
        let fga = FakeFga::start();
        let stop = CancellationToken::new();
        let drainer = tokio::spawn(baseline_drainer(
            self.db.url().to_owned(),
            fga.url(),
            stop.clone(),
        ));
        let latency = measure_latency(&self.db, &fga, "bl", sizes, Duration::from_secs(30)).await?;
        stop.cancel();
        drainer.await??;
        drop(fga);
        // Burn-down.
        self.truncate().await?;
        let n = sizes.baseline_backlog;
        self.admin.batch_execute(&rows_sql("bb", n, false)).await?;
        self.admin
            .batch_execute("ANALYZE fga_outbox; CHECKPOINT")
            .await?;
        let fga = FakeFga::start();
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let drainer = tokio::spawn(baseline_drainer(
            self.db.url().to_owned(),
            fga.url(),
            stop.clone(),
        ));
        let done = self
            .wait_drained(
                Duration::from_secs(120 + n as u64 / 100),
                Duration::from_millis(10),
            )
            .await?;
        stop.cancel();
        let writes = drainer.await??;
        let r = BaselineResult {
            latency,
            rows: n,
            secs: (done - t0).as_secs_f64(),
            writes,
        };
        println!("a timer-driven drainer (poll every 1 s; per row one Write, then an UPDATE)");
        println!("  commit → OpenFGA Write:      {}", r.latency.relay.line());
        println!(
            "  burn-down: {} rows in {:.2} s: {:.0} rows/s, {} Writes",
            r.rows,
            r.secs,
            r.rows_per_s(),
            r.writes
        );
        Ok(r)
    }
}

// ------------------------------------------------------------------------------------------------
// Summary
// ------------------------------------------------------------------------------------------------

#[derive(Default)]
struct Results {
    latency: Option<LatencyResult>,
    burndown: Option<BurnDown>,
    history: Option<History>,
    writers: Vec<WriterRun>,
    idle: Option<IdleResult>,
    baseline: Option<BaselineResult>,
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

impl Results {
    /// Whether a target is met; a smoke run's sizes are too small to say.
    fn verdict(&self, sizes: &Sizes, ok: bool) -> &'static str {
        if sizes.smoke { "(smoke)" } else { verdict(ok) }
    }
}

impl Results {
    fn print_summary(&self, sizes: &Sizes) {
        println!("\n=== Summary ===\n");
        println!("| scenario | measured | target | |");
        println!("|---|---|---|---|");
        if let Some(l) = &self.latency {
            println!(
                "| latency, {} commits at {}/s | p50 {} ms, p90 {} ms, p99 {} ms, max {} ms | p50 ≤ 2 ms, p99 ≤ 10 ms | {} |",
                sizes.latency_commits,
                sizes.latency_rate,
                ms(l.relay.p50),
                ms(l.relay.p90),
                ms(l.relay.p99),
                ms(l.relay.max),
                self.verdict(sizes, l.relay.p50 <= 2.0 && l.relay.p99 <= 10.0)
            );
            println!(
                "| (floor: commit → plain LISTENer) | p50 {} ms, p99 {} ms; insert+commit p50 {} ms | | |",
                ms(l.notify_floor.p50),
                ms(l.notify_floor.p99),
                ms(l.commit.p50)
            );
        }
        let burn = self
            .burndown
            .as_ref()
            .or(self.history.as_ref().map(|h| &h.none));
        if let Some(b) = burn {
            println!(
                "| burn-down, {} rows × 2 tuples | {:.0} rows/s, {:.0} tuples/s, {} Writes | ≥ 20,000 rows/s | {} |",
                b.rows,
                b.rows_per_s(),
                b.tuples_per_s(),
                b.writes,
                self.verdict(sizes, b.rows_per_s() >= 20_000.0)
            );
        }
        if !self.writers.is_empty() {
            let med = |c: u32, k: TriggerKind| {
                self.writers
                    .iter()
                    .find(|r| r.clients == c && r.trigger == k)
                    .map_or(f64::NAN, WriterRun::median)
            };
            for &c in &sizes.pgbench_clients {
                let none = med(c, TriggerKind::None);
                let relay = med(c, TriggerKind::Relay);
                let plain = med(c, TriggerKind::PlainNotify);
                let relay_ratio = round_ratio(&self.writers, c, TriggerKind::Relay);
                let plain_ratio = round_ratio(&self.writers, c, TriggerKind::PlainNotify);
                let target = if c == 8 {
                    "trigger costs ≤ 10%"
                } else {
                    "(no target at 1 client)"
                };
                let v = if c == 8 {
                    self.verdict(sizes, relay_ratio >= 0.90)
                } else {
                    ""
                };
                let rate = |k: TriggerKind| {
                    self.writers
                        .iter()
                        .find(|r| r.clients == c && r.trigger == k)
                        .map_or(f64::NAN, WriterRun::notify_rate)
                };
                println!(
                    "| writers, {c} client(s), tps | none {none:.0}; relay's trigger {relay:.0} ({:+.0}%, {:.1} NOTIFYs per 1000 tx); plain NOTIFY {plain:.0} ({:+.0}%) | {target} | {v} |",
                    (relay_ratio - 1.0) * 100.0,
                    rate(TriggerKind::Relay),
                    (plain_ratio - 1.0) * 100.0
                );
            }
        }
        if let Some(h) = &self.history {
            let ratio = h.full.rows_per_s() / h.none.rows_per_s();
            // Finding pending rows: what the claim reads, with and without the history. The
            // burn-down rates say the same with the machine's noise on top.
            let (idle_full, idle_none) = (top_buffers(&h.idle_full), top_buffers(&h.idle_none));
            let (busy_full, busy_none) =
                (top_buffers(&h.full.explain), top_buffers(&h.none.explain));
            println!(
                "| history: {} delivered rows vs none | claim with nothing pending: {idle_full} vs {idle_none} buffers, {:.3} vs {:.3} ms; claim of a page of the backlog: {busy_full} vs {busy_none} buffers, {:.2} vs {:.2} ms; burn-down {:.0} vs {:.0} rows/s ({ratio:.2}×) | as fast | {} |",
                sizes.history,
                exec_ms(&h.idle_full),
                exec_ms(&h.idle_none),
                exec_ms(&h.full.explain),
                exec_ms(&h.none.explain),
                h.full.rows_per_s(),
                h.none.rows_per_s(),
                self.verdict(
                    sizes,
                    idle_full <= 4 && busy_full as f64 <= 1.1 * busy_none as f64
                )
            );
        }
        if let Some(i) = &self.idle {
            let pct = i.cpu.relay / i.cpu.wall * 100.0;
            println!(
                "| idle, {:.0} s | {} statements ({:.2}/s), {} Writes; relay CPU {:.3}% of a core | only sweeps and heartbeats, ~0% CPU | {} |",
                i.secs,
                i.total_statements(),
                i.total_statements() as f64 / i.secs,
                i.writes,
                pct,
                self.verdict(sizes, pct < 0.5 && i.writes == 0)
            );
        }
        if let Some(b) = &self.baseline {
            let rl = self.latency.as_ref().map(|l| &l.relay);
            let lat_ratio = rl.map_or(String::from("-"), |r| {
                format!(
                    "p50 {:.0}×, p99 {:.0}× the relay's",
                    b.latency.relay.p50 / r.p50,
                    b.latency.relay.p99 / r.p99
                )
            });
            println!(
                "| baseline drainer, latency | p50 {} ms, p99 {} ms, max {} ms; {lat_ratio} | | |",
                ms(b.latency.relay.p50),
                ms(b.latency.relay.p99),
                ms(b.latency.relay.max)
            );
            let burn_ratio = burn.map_or(String::from("-"), |r| {
                format!("relay {:.0}× faster", r.rows_per_s() / b.rows_per_s())
            });
            println!(
                "| baseline drainer, burn-down of {} rows | {:.0} rows/s, {} Writes; {burn_ratio} | | |",
                b.rows,
                b.rows_per_s(),
                b.writes
            );
        }
    }
}
