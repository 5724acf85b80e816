//! Measures `fga_outbox_wait`'s ways of waiting side by side. Not a test: run it by hand,
//!
//!     cargo build --release --bin fga-relay
//!     cargo test --test relay wait_bench -- --ignored --nocapture
//!
//! against a cluster of its own with production durability, the OpenFGA stand-in in-process and
//! the release relay (`target/release/fga-relay`, else the test build). The candidates are the
//! shipped function (sql/schema/0004_wait.sql) and two variants made from its text:
//! - `lock`: the shipped one; queues for the relay's row lock while the rows are in flight.
//! - `poll`: never locks; sleeps 1 ms doubling to 16 ms between looks.
//! - `poll-fine`: never locks; sleeps 1 ms between looks while the rows are in flight.

use crate::common::fga::{FakeFga, Fault, FaultRule};
use crate::common::pg::{PgOptions, TestDb};
use crate::common::relay::{BIN, Env, RelayProc, insert_with, tk, writes};
use crate::wait::wait_for;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_postgres::Client;

const WAIT_SQL: &str = include_str!("../../sql/schema/0004_wait.sql");
const CANDIDATES: [&str; 3] = ["lock", "poll", "poll-fine"];

/// The function's text for a candidate.
fn candidate_sql(name: &str) -> String {
    let swap = |sql: String, from: &str, to: &str| {
        assert!(sql.contains(from), "0004_wait.sql no longer has {from:?}");
        sql.replace(from, to)
    };
    let no_lock = |sql: String| {
        swap(
            sql,
            "lock_wait  boolean := current_setting('transaction_read_only') = 'off';",
            "lock_wait  boolean := false;",
        )
    };
    match name {
        "lock" => WAIT_SQL.to_owned(),
        "poll" => no_lock(WAIT_SQL.to_owned()),
        "poll-fine" => swap(
            no_lock(WAIT_SQL.to_owned()),
            "PERFORM pg_sleep(least(nap,",
            "PERFORM pg_sleep(least(CASE WHEN locked IS NULL THEN nap ELSE first_nap END,",
        ),
        _ => unreachable!(),
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = text.rfind(')').map_or("", |i| &text[i + 1..]);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
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
        c.batch_execute("TRUNCATE fga_outbox; VACUUM ANALYZE fga_outbox")
            .await
            .unwrap();
    }

    /// `n` writes, each committed then waited for, at about `rate` a second: from the relay's
    /// mark (`processed_at`) to the wait's return, in ms.
    async fn latency(&self, n: usize, rate: u64) -> Vec<f64> {
        let c = self.env.db.connect().await;
        let mut marks = Vec::with_capacity(n);
        for i in 0..n {
            let id = insert_with(&c, writes(&[tk(&format!("user:l{i}"), "viewer", "document:l")]))
                .await;
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
        out
    }

    /// Seconds to burn down `n` pending rows, with `waiters` sessions waiting for the last rows
    /// throughout.
    async fn burn_down(&self, n: i64, waiters: usize) -> f64 {
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
        for k in 0..waiters as i64 {
            let w = self.env.db.connect().await;
            tasks.push(tokio::spawn(async move {
                wait_for(&w, &[last - k], "300s").await.unwrap()
            }));
        }
        while waiters > 0 && in_wait(&c).await < waiters as i64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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
        for t in tasks {
            assert_eq!(t.await.unwrap(), "delivered");
        }
        Bench::stop(relay).await;
        took
    }

    /// Transactions a second of 8 writers inserting one row each, for `secs`, while `waiters`
    /// sessions keep waiting for the newest row; and the waits they completed.
    async fn writers(&self, secs: u64, waiters: usize) -> (f64, u64) {
        self.clear().await;
        let relay = self.relay().await;
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicU64::new(0));
        let waits = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let c = self.env.db.connect().await;
        insert_with(&c, writes(&[tk("user:w", "viewer", "document:w")])).await;
        for _ in 0..waiters {
            let w = self.env.db.connect().await;
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
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (c1, w1, dt) = (
            commits.load(Ordering::Relaxed),
            waits.load(Ordering::Relaxed),
            t0.elapsed().as_secs_f64(),
        );
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        Bench::stop(relay).await;
        ((c1 - c0) as f64 / dt, ((w1 - w0) as f64 / dt) as u64)
    }

    /// `waiters` waits that time out after `secs` with no relay running: the CPU their backends
    /// used (share of one core, all of them together) and the looks each made a second.
    async fn timeouts(&self, secs: u64, waiters: usize) -> (f64, f64) {
        self.clear().await;
        let c = self.env.db.connect().await;
        let id = insert_with(&c, writes(&[tk("user:t", "viewer", "document:t")])).await;
        c.batch_execute("SELECT pg_stat_reset()").await.unwrap();
        let mut sessions = Vec::new();
        for _ in 0..waiters {
            let w = self.env.db.connect().await;
            let pid: i32 = w
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .unwrap()
                .get(0);
            sessions.push((w, pid as u32));
        }
        let before: f64 = sessions.iter().map(|(_, p)| cpu_seconds(*p)).sum();
        let pids: Vec<u32> = sessions.iter().map(|(_, p)| *p).collect();
        let started = Instant::now();
        let timeout = format!("{secs}s");
        let tasks: Vec<_> = sessions
            .into_iter()
            .map(|(w, _)| {
                let timeout = timeout.clone();
                tokio::spawn(async move { wait_for(&w, &[id], &timeout).await.unwrap() })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), "pending");
        }
        let took = started.elapsed().as_secs_f64();
        let used: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - before;
        // Each look is one index scan of the table; statistics reach the view shortly after.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let scans: i64 = c
            .query_one(
                "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'fga_outbox'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (used / took, scans as f64 / took / waiters as f64)
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn wait_bench() {
    let b = Bench::start().await;
    println!("relay: {}; load: {}", b.relay_bin, loadavg());

    println!("\n== latency: relay's mark -> wait returns (300 writes at 100/s, each waited for)");
    for delay in [0u64, 5] {
        b.env.fga.clear_faults();
        if delay > 0 {
            b.env.fga.push_fault(FaultRule::times(
                Fault::Delay(Duration::from_millis(delay)),
                100_000,
            ));
        }
        let relay = b.relay().await;
        println!("-- OpenFGA answering in {delay} ms");
        for name in CANDIDATES {
            b.use_candidate(name).await;
            b.latency(30, 100).await;
            let m0 = machine_ticks();
            let v = b.latency(300, 100).await;
            println!("{}  machine busy {:.0}%", line(name, &v), busy_share(m0, machine_ticks()) * 100.0);
        }
        Bench::stop(relay).await;
    }
    b.env.fga.clear_faults();

    println!("\n== burn-down of 20000 rows, with 0 or 50 waiters on its last rows (median of 3)");
    for name in CANDIDATES {
        b.use_candidate(name).await;
        let mut ratios = Vec::new();
        let mut line = String::new();
        for _ in 0..3 {
            let m0 = machine_ticks();
            let none = b.burn_down(20_000, 0).await;
            let with = b.burn_down(20_000, 50).await;
            ratios.push(with / none);
            line += &format!(
                " [{:.0} vs {:.0} rows/s, busy {:.0}%, load {}]",
                20_000.0 / none,
                20_000.0 / with,
                busy_share(m0, machine_ticks()) * 100.0,
                loadavg()
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!("{name:<10} time with/without waiters: {:.3}{line}", ratios[1]);
    }

    println!("\n== writers: 8 clients, 5 s; with 0 or 50 sessions waiting for the newest row (median of 3)");
    for name in CANDIDATES {
        b.use_candidate(name).await;
        let mut ratios = Vec::new();
        let mut line = String::new();
        for _ in 0..3 {
            let m0 = machine_ticks();
            let (none, _) = b.writers(5, 0).await;
            let (with, waits) = b.writers(5, 50).await;
            ratios.push(with / none);
            line += &format!(
                " [{none:.0} vs {with:.0} tps, {waits} waits/s, busy {:.0}%, load {}]",
                busy_share(m0, machine_ticks()) * 100.0,
                loadavg()
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!("{name:<10} tps with/without waiters: {:.3}{line}", ratios[1]);
    }

    println!("\n== waits that time out (no relay): 1 and 50 waiters for 5 s");
    for name in CANDIDATES {
        b.use_candidate(name).await;
        for n in [1, 50] {
            let m0 = machine_ticks();
            let (cpu, looks) = b.timeouts(5, n).await;
            println!(
                "{name:<10} {n:>2} waiters: backends' CPU {:.2}% of a core in all, {looks:.0} looks/s each; machine busy {:.0}%, load {}",
                cpu * 100.0,
                busy_share(m0, machine_ticks()) * 100.0,
                loadavg()
            );
        }
    }
    b.use_candidate("lock").await;
}
