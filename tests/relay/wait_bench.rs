//! Measures `fga_outbox_wait`'s ways of waiting side by side. Not a test: run it by hand,
//!
//!     cargo build --release --bin fga-relay
//!     cargo test --test relay wait_bench -- --ignored --nocapture
//!
//! against a cluster of its own with production durability, the OpenFGA stand-in in-process and
//! the release relay (`target/release/fga-relay`, else the test build). The candidates are the
//! shipped function (sql/schema/0005_wait.sql) and two variants made from its text:
//! - `lock`, the shipped one: queues for the relay's row lock while the rows are in flight;
//!   otherwise sleeps 1 ms doubling to 256 ms between looks.
//! - `poll`: never locks; sleeps 1 ms doubling to 256 ms between looks, in flight or not.
//! - `poll-fine`: never locks; sleeps 1 ms between looks while the rows are in flight.
//! - `spin`, for the latency floor only: never sleeps.

use crate::common::fga::{FakeFga, Fault, FaultRule};
use crate::common::load::loadavg;
use crate::common::pg::{PgOptions, TestDb};
use crate::common::relay::{BIN, Env, RelayProc, insert_with, tk, writes};
use crate::wait::wait_for;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_postgres::Client;

const WAIT_SQL: &str = include_str!("../../sql/schema/0005_wait.sql");
const CANDIDATES: [&str; 3] = ["lock", "poll", "poll-fine"];
/// Not a candidate: looks again at once, without sleeping, for the floor of what any way of
/// waiting can reach (the relay's own commit after its mark, one look, the reply).
const FLOOR: &str = "spin";

/// The function's text for a candidate.
fn candidate_sql(name: &str) -> String {
    let mut sql = WAIT_SQL.to_owned();
    let mut swap = |from: &str, to: &str| {
        assert!(sql.contains(from), "0005_wait.sql no longer has {from:?}");
        sql = sql.replace(from, to);
    };
    let lock_wait = "lock_wait  boolean := current_setting('transaction_read_only') = 'off';";
    let no_lock = "lock_wait  boolean := false;";
    match name {
        "lock" => {}
        "poll" => swap(lock_wait, no_lock),
        "poll-fine" => {
            swap(lock_wait, no_lock);
            swap(
                "PERFORM pg_sleep(least(nap,",
                "PERFORM pg_sleep(least(CASE WHEN locked IS NULL THEN nap ELSE first_nap END,",
            );
        }
        "spin" => {
            swap(lock_wait, no_lock);
            swap(
                "first_nap  constant float8 := 0.001;",
                "first_nap  constant float8 := 0;",
            );
            swap(
                "max_nap    constant float8 := 0.256;",
                "max_nap    constant float8 := 0;",
            );
        }
        _ => unreachable!(),
    }
    sql
}

/// The time a process spent on a CPU, in seconds (`/proc/<pid>/schedstat`, in nanoseconds:
/// `/proc/<pid>/stat` counts whole clock ticks, and a waiter uses less than one at a time).
fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// The machine's busy and total time (all cores), in clock ticks.
fn machine_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The share of the machine busy between two readings of [`machine_ticks`].
fn busy_share(a: (u64, u64), b: (u64, u64)) -> f64 {
    (b.0 - a.0) as f64 / (b.1 - a.1).max(1) as f64
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

struct Bench {
    env: Env,
    relay_bin: String,
}

impl Bench {
    async fn start() -> Bench {
        let env = Env {
            db: TestDb::start_with(PgOptions {
                durable: true,
                ..PgOptions::default()
            }),
            fga: FakeFga::start(),
        };
        let out = env.command(&["migrate"]).output().unwrap();
        assert!(out.status.success());
        let release = concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/fga-relay");
        let relay_bin = if std::path::Path::new(release).exists() {
            release.to_owned()
        } else {
            BIN.to_owned()
        };
        Bench { env, relay_bin }
    }

    /// The relay with its default timings (the tests' quick ones are for tests).
    async fn relay(&self) -> RelayProc {
        let mut c = std::process::Command::new(&self.relay_bin);
        c.arg("run").env_clear().envs(self.env.vars());
        for k in [
            "FGA_RELAY_SWEEP_INTERVAL",
            "FGA_RELAY_HEARTBEAT_INTERVAL",
            "FGA_RELAY_REQUEST_TIMEOUT",
        ] {
            c.env_remove(k);
        }
        c.env("RUST_LOG", "info");
        let relay = RelayProc::spawn(c);
        relay.wait_for_log("delivering (leader)").await;
        relay
    }

    /// SIGTERM: the relay lets go cleanly, so that the next one delivers at once (after a
    /// crash, a new relay first waits one request timeout).
    async fn stop(relay: RelayProc) {
        let mut relay = relay;
        relay.term();
        relay.wait_exit(Duration::from_secs(30)).await;
    }

    async fn use_candidate(&self, name: &str) {
        let c = self.env.db.connect().await;
        c.batch_execute(&candidate_sql(name)).await.unwrap();
    }

    async fn clear(&self) {
        let c = self.env.db.connect().await;
        c.batch_execute("TRUNCATE fga_outbox").await.unwrap();
        c.batch_execute("VACUUM ANALYZE fga_outbox").await.unwrap();
    }

    /// `n` writes, each committed then waited for, at about `rate` a second: from the relay's
    /// mark (`processed_at`) to the wait's return, in ms.
    /// Also the writer's own INSERT (autocommit) times, for scale: a commit of the same disk.
    async fn latency(&self, n: usize, rate: u64) -> (Vec<f64>, Vec<f64>) {
        let c = self.env.db.connect().await;
        let mut marks = Vec::with_capacity(n);
        let mut inserts = Vec::with_capacity(n);
        for i in 0..n {
            let t = Instant::now();
            let id = insert_with(
                &c,
                writes(&[tk(&format!("user:l{i}"), "viewer", "document:l")]),
            )
            .await;
            inserts.push(t.elapsed().as_secs_f64() * 1000.0);
            let answer = wait_for(&c, &[id], "10s").await.unwrap();
            let returned = unix_now();
            assert_eq!(answer, "delivered");
            marks.push((id, returned));
            tokio::time::sleep(Duration::from_micros(1_000_000 / rate)).await;
        }
        let mut out = Vec::with_capacity(n);
        for (id, returned) in marks {
            let at: f64 = c
                .query_one(
                    "SELECT extract(epoch FROM processed_at)::float8 FROM fga_outbox WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .get(0);
            out.push((returned - at) * 1000.0);
        }
        out.sort_by(f64::total_cmp);
        (out, inserts)
    }

    /// A connection and its backend's pid.
    async fn session(&self) -> (Client, u32) {
        let c = self.env.db.connect().await;
        let pid: i32 = c
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        (c, pid as u32)
    }

    /// Seconds to burn down `n` pending rows, with `waiters` sessions waiting for the last rows
    /// throughout; and the CPU the waiters' backends used meanwhile, as a share of one core.
    async fn burn_down(&self, n: i64, waiters: usize) -> (f64, f64) {
        self.clear().await;
        let relay = self.relay().await;
        signal(&relay, libc::SIGSTOP);
        let c = self.env.db.connect().await;
        c.execute(
            "INSERT INTO fga_outbox (payload) SELECT jsonb_build_object('writes', \
             jsonb_build_array(jsonb_build_object('user', 'user:b' || i, 'relation', 'viewer', \
             'object', 'document:b'))) FROM generate_series(1, $1::bigint) i",
            &[&n],
        )
        .await
        .unwrap();
        c.batch_execute("ANALYZE fga_outbox").await.unwrap();
        let last: i64 = c
            .query_one("SELECT max(id) FROM fga_outbox", &[])
            .await
            .unwrap()
            .get(0);
        let mut tasks = Vec::new();
        let mut pids = Vec::new();
        for k in 0..waiters as i64 {
            let (w, pid) = self.session().await;
            pids.push(pid);
            // Once, so that the function is compiled and its statements planned before the clock.
            wait_for(&w, &[last - k], "0s").await.unwrap();
            // Each task hands its connection back, so that its backend is still there to be
            // measured.
            tasks.push(tokio::spawn(async move {
                let answer = wait_for(&w, &[last - k], "300s").await.unwrap();
                (answer, w)
            }));
        }
        while waiters > 0 && in_wait(&c).await < waiters as i64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let cpu0: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
        let started = Instant::now();
        signal(&relay, libc::SIGCONT);
        loop {
            let left: bool = c
                .query_one(
                    "SELECT EXISTS (SELECT FROM fga_outbox WHERE processed_at IS NULL)",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if !left {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let took = started.elapsed().as_secs_f64();
        let mut sessions = Vec::new();
        for t in tasks {
            let (answer, w) = t.await.unwrap();
            assert_eq!(answer, "delivered");
            sessions.push(w);
        }
        let cpu = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu0;
        Bench::stop(relay).await;
        (took, cpu / took)
    }

    /// Transactions a second of 8 writers inserting one row each, for `secs`, while `waiters`
    /// sessions each wait for the newest row, then pause 100 ms, and again; the waits a second
    /// they completed, and the CPU their backends used, as a share of one core.
    async fn writers(&self, secs: u64, waiters: usize) -> (f64, f64, f64) {
        self.clear().await;
        let relay = self.relay().await;
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicU64::new(0));
        let waits = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let c = self.env.db.connect().await;
        insert_with(&c, writes(&[tk("user:w", "viewer", "document:w")])).await;
        let mut pids = Vec::new();
        for _ in 0..waiters {
            let (w, pid) = self.session().await;
            pids.push(pid);
            let (stop, waits) = (stop.clone(), waits.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let id: i64 = w
                        .query_one("SELECT max(id) FROM fga_outbox", &[])
                        .await
                        .unwrap()
                        .get(0);
                    wait_for(&w, &[id], "10s").await.unwrap();
                    waits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        for k in 0..8 {
            let w = self.env.db.connect().await;
            let (stop, commits) = (stop.clone(), commits.clone());
            tasks.push(tokio::spawn(async move {
                let stmt = w
                    .prepare("INSERT INTO fga_outbox (payload) VALUES ($1)")
                    .await
                    .unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = writes(&[tk(&format!("user:w{k}-{i}"), "viewer", "document:w")]);
                    w.execute(&stmt, &[&p]).await.unwrap();
                    commits.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (c0, w0, t0) = (
            commits.load(Ordering::Relaxed),
            waits.load(Ordering::Relaxed),
            Instant::now(),
        );
        let cpu0: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (c1, w1, dt) = (
            commits.load(Ordering::Relaxed),
            waits.load(Ordering::Relaxed),
            t0.elapsed().as_secs_f64(),
        );
        let cpu = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu0;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        Bench::stop(relay).await;
        ((c1 - c0) as f64 / dt, (w1 - w0) as f64 / dt, cpu / dt)
    }

    /// `waiters` waits for one row that time out after `secs`: with no relay running, or with
    /// the row in flight for longer (`hang`: OpenFGA never answers). Returns the CPU their
    /// backends used (share of one core, all together) and the looks each made a second.
    async fn timeouts(&self, secs: u64, waiters: usize, hang: bool) -> (f64, f64) {
        self.clear().await;
        let relay = if hang {
            self.env.fga.push_fault(FaultRule::times(Fault::Hang, 1));
            Some(self.relay().await)
        } else {
            None
        };
        let c = self.env.db.connect().await;
        let id = insert_with(&c, writes(&[tk("user:t", "viewer", "document:t")])).await;
        while hang && in_flight(&c).await == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut sessions = Vec::new();
        for _ in 0..waiters {
            sessions.push(self.session().await);
        }
        let pids: Vec<u32> = sessions.iter().map(|(_, p)| *p).collect();
        let before: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
        let started = Instant::now();
        let timeout = format!("{secs}s");
        let tasks: Vec<_> = sessions
            .into_iter()
            .map(|(w, _)| {
                let timeout = timeout.clone();
                tokio::spawn(async move {
                    // In a transaction of its own, to read its own statistics: each look is
                    // one index scan of the table.
                    w.batch_execute("BEGIN").await.unwrap();
                    let answer = wait_for(&w, &[id], &timeout).await.unwrap();
                    let scans: i64 = w
                        .query_one(
                            "SELECT coalesce(idx_scan, 0) + seq_scan FROM pg_stat_xact_user_tables \
                             WHERE relname = 'fga_outbox'",
                            &[],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    w.batch_execute("COMMIT").await.unwrap();
                    (answer, scans, w)
                })
            })
            .collect();
        let mut scans = 0;
        let mut sessions = Vec::new();
        for t in tasks {
            let (answer, n, w) = t.await.unwrap();
            assert_eq!(answer, "pending");
            scans += n;
            sessions.push(w);
        }
        let took = started.elapsed().as_secs_f64();
        let used: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - before;
        drop(sessions);
        if let Some(relay) = relay {
            self.env.fga.clear_faults();
            Bench::stop(relay).await;
        }
        (used / took, scans as f64 / took / waiters as f64)
    }
}

/// Sessions of the relay's inside a transaction: a claimed page in flight.
async fn in_flight(c: &Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn in_wait(c: &Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT fga_outbox_wait%' \
         AND state = 'active'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

fn signal(relay: &RelayProc, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(relay.pid() as i32, sig);
    }
}

fn line(name: &str, v: &[f64]) -> String {
    format!(
        "{name:<10} p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n {})",
        pct(v, 0.5),
        pct(v, 0.9),
        pct(v, 0.99),
        v[v.len() - 1],
        v.len()
    )
}

/// The candidates in a different order each round, so that a drift in the machine's load does
/// not always favour the same one.
fn rotated(round: usize) -> Vec<&'static str> {
    let mut v = CANDIDATES.to_vec();
    v.rotate_left(round % CANDIDATES.len());
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn wait_bench() {
    let b = Bench::start().await;
    println!("relay: {}; load: {}", b.relay_bin, loadavg());
    // WAIT_BENCH_ONLY=latency,burn-down,writers,timeouts runs only those.
    let only = std::env::var("WAIT_BENCH_ONLY").unwrap_or_default();
    let run = |what: &str| only.is_empty() || only.split(',').any(|w| w == what);

    println!(
        "\n== latency: relay's mark -> wait returns (3 rounds of 100 writes at 100/s, each waited for)"
    );
    for delay in [0u64, 5].into_iter().filter(|_| run("latency")) {
        b.env.fga.clear_faults();
        if delay > 0 {
            b.env.fga.push_fault(FaultRule::times(
                Fault::Delay(Duration::from_millis(delay)),
                100_000,
            ));
        }
        let relay = b.relay().await;
        let m0 = machine_ticks();
        let mut all: Vec<(&str, Vec<f64>)> = Vec::new();
        let mut inserts = Vec::new();
        for round in 0..3 {
            for name in rotated(round).into_iter().chain([FLOOR]) {
                b.use_candidate(name).await;
                b.latency(10, 100).await;
                let (v, ins) = b.latency(100, 100).await;
                inserts.extend(ins);
                match all.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, acc)) => acc.extend(v),
                    None => all.push((name, v)),
                }
            }
        }
        println!(
            "-- OpenFGA answering in {delay} ms; machine busy {:.0}%, load {}",
            busy_share(m0, machine_ticks()) * 100.0,
            loadavg()
        );
        for (name, mut v) in all {
            v.sort_by(f64::total_cmp);
            println!("{}", line(name, &v));
        }
        inserts.sort_by(f64::total_cmp);
        println!("{}", line("(the writer's own INSERT + commit)", &inserts));
        Bench::stop(relay).await;
    }
    b.env.fga.clear_faults();

    println!("\n== burn-down of 50000 rows, with 50 waiters on its last rows / without (3 rounds)");
    let mut results: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    let m0 = machine_ticks();
    for round in (0..3).filter(|_| run("burn-down")) {
        for name in rotated(round) {
            b.use_candidate(name).await;
            let (none, _) = b.burn_down(50_000, 0).await;
            let (with, cpu) = b.burn_down(50_000, 50).await;
            match results.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, r, c)) => {
                    r.push(with / none);
                    c.push(cpu);
                }
                None => results.push((name, vec![with / none], vec![cpu])),
            }
        }
    }
    println!(
        "machine busy {:.0}%, load {}",
        busy_share(m0, machine_ticks()) * 100.0,
        loadavg()
    );
    for (name, r, c) in results {
        println!(
            "{name:<10} time with/without: median {:.3} {r:.3?}; waiters' CPU {:.1}% of a core (median)",
            median(r.clone()),
            median(c) * 100.0
        );
    }

    println!(
        "\n== writers: 8 clients, 5 s, with 50 sessions each waiting for the newest row every 100 ms / without (3 rounds)"
    );
    // Per candidate: tps ratios, waits a second, the waiters' CPU.
    type Rounds = (&'static str, Vec<f64>, Vec<f64>, Vec<f64>);
    let mut results: Vec<Rounds> = Vec::new();
    let m0 = machine_ticks();
    for round in (0..3).filter(|_| run("writers")) {
        for name in rotated(round) {
            b.use_candidate(name).await;
            let (none, _, _) = b.writers(5, 0).await;
            let (with, waits, cpu) = b.writers(5, 50).await;
            match results.iter_mut().find(|(n, ..)| *n == name) {
                Some((_, r, w, c)) => {
                    r.push(with / none);
                    w.push(waits);
                    c.push(cpu);
                }
                None => results.push((name, vec![with / none], vec![waits], vec![cpu])),
            }
        }
    }
    println!(
        "machine busy {:.0}%, load {}",
        busy_share(m0, machine_ticks()) * 100.0,
        loadavg()
    );
    for (name, r, w, c) in results {
        println!(
            "{name:<10} tps with/without: median {:.3} {r:.3?}; {:.0} waits/s; waiters' CPU {:.0}% of a core",
            median(r.clone()),
            median(w),
            median(c) * 100.0
        );
    }

    println!("\n== waits that time out after 5 s");
    for (hang, what) in [
        (false, "relay down"),
        (true, "OpenFGA hanging, row in flight"),
    ]
    .into_iter()
    .filter(|_| run("timeouts"))
    {
        for name in CANDIDATES {
            if !hang && name != "lock" {
                // With no relay nothing is in flight: every candidate runs the same code.
                continue;
            }
            b.use_candidate(name).await;
            for n in [1, 50] {
                let m0 = machine_ticks();
                let (cpu, looks) = b.timeouts(5, n, hang).await;
                println!(
                    "{what}: {name:<10} {n:>2} waiters: backends' CPU {:.2}% of a core in all, {looks:.0} looks/s each; machine busy {:.0}%, load {}",
                    cpu * 100.0,
                    busy_share(m0, machine_ticks()) * 100.0,
                    loadavg()
                );
            }
        }
    }
    b.use_candidate("lock").await;
}
