//! Scenario: `fga_outbox_wait`'s ways of waiting, side by side. The candidates are the shipped
//! function (sql/schema/0005_wait.sql) and variants made from its text:
//! - `lock`, the shipped one: while the rows are in flight, queues for the advisory lock the
//!   relay's Write transaction holds; otherwise sleeps 1 ms doubling to 256 ms between looks.
//! - `row-lock`: the same, but queues for the rows' own locks (`FOR KEY SHARE`, what the function
//!   did before): the wait then takes a transaction id, writes its lock into the row and ends
//!   with a commit record to flush.
//! - `poll`: never locks; sleeps 1 ms doubling to 256 ms between looks, in flight or not.
//! - `poll-fine`: never locks; sleeps 1 ms between looks while the rows are in flight.
//! - `spin`, for the latency floor only: never sleeps.
//!
//! Measured for each: the time from the relay's mark to the wait's return; what waiters on a
//! backlog's last rows cost its burn-down; what waiters cost 8 writers; and what waits that time
//! out cost (the relay down, or the row in flight to an OpenFGA that never answers).

use crate::args::Sizes;
use crate::common::fga::{Fault, FaultRule};
use crate::common::relay::{RelayProc, WAIT_CALL, insert_with, tk, wait_for, writes};
use crate::cpu::{loadavg, task_cpu_seconds};
use crate::harness::Bench;
use crate::stats::{Dist, median};
use anyhow::{Context, Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_postgres::Client;

const WAIT_SQL: &str = include_str!("../../sql/schema/0005_wait.sql");
pub(crate) const CANDIDATES: [&str; 4] = [SHIPPED, "row-lock", "poll", "poll-fine"];
/// The candidate `sql/schema/0005_wait.sql` is, unchanged.
pub(crate) const SHIPPED: &str = "lock";
/// Not a candidate: looks again at once, without sleeping, for the floor of what any way of
/// waiting can reach (the relay's own commit after its mark, one look, the reply).
const FLOOR: &str = "spin";
/// Not a candidate either: beside the writers, the waiters' sessions send `SELECT 1` instead of
/// each wait, as often, for the floor of what any statement at that rate costs them.
pub(crate) const ROUND_TRIP: &str = "select-1";

/// The function's text for a candidate.
fn candidate_sql(name: &str) -> Result<String> {
    let mut sql = WAIT_SQL.to_owned();
    let mut swap = |from: &str, to: &str| -> Result<()> {
        if !sql.contains(from) {
            bail!("0005_wait.sql no longer has {from:?}");
        }
        sql = sql.replace(from, to);
        Ok(())
    };
    let lock_wait = "lock_wait  boolean := NOT pg_is_in_recovery();";
    let no_lock = "lock_wait  boolean := false;";
    match name {
        SHIPPED => {}
        "row-lock" => swap(
            "PERFORM pg_advisory_xact_lock_shared(1718051123, h) FROM unnest(holders) h;",
            "PERFORM FROM fga_outbox WHERE id = ANY (wanted) \
             AND processed_at IS NULL AND failed_at IS NULL FOR KEY SHARE;",
        )?,
        "poll" => swap(lock_wait, no_lock)?,
        "poll-fine" => {
            swap(lock_wait, no_lock)?;
            swap(
                "PERFORM pg_sleep(least(nap,",
                "PERFORM pg_sleep(least(CASE WHEN holders IS NULL THEN nap ELSE first_nap END,",
            )?;
        }
        "spin" => {
            swap(lock_wait, no_lock)?;
            swap(
                "first_nap  constant float8 := 0.001;",
                "first_nap  constant float8 := 0;",
            )?;
            swap(
                "max_nap    constant float8 := 0.256;",
                "max_nap    constant float8 := 0;",
            )?;
        }
        other => bail!("no candidate {other}"),
    }
    Ok(sql)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The candidates (and `extra`) in a different order each round, so that a drift in the
/// machine's load does not always favour the same one.
fn rotated(round: usize, extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = CANDIDATES.to_vec();
    v.extend_from_slice(extra);
    let n = v.len();
    v.rotate_left(round % n);
    v
}

/// Per candidate, a list of figures, one a round.
#[derive(Default)]
struct PerCandidate(Vec<(&'static str, Vec<f64>)>);

impl PerCandidate {
    fn push(&mut self, name: &'static str, v: f64) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, acc)) => acc.push(v),
            None => self.0.push((name, vec![v])),
        }
    }

    fn median(&self, name: &str) -> f64 {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(f64::NAN, |(_, v)| median(v.clone()))
    }

    fn all(&self, name: &str) -> Vec<f64> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(Vec::new(), |(_, v)| v.clone())
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct WaitResult {
    /// (OpenFGA's delay in ms, candidate, mark → return).
    pub(crate) latency: Vec<(u64, &'static str, Dist)>,
    /// Burn-down time with waiters / without, median of the rounds, per candidate.
    pub(crate) burn_down: Vec<(&'static str, f64)>,
    /// Writers' tps with waiters / without, median of the rounds, and waits a second.
    pub(crate) writers: Vec<(&'static str, f64, f64)>,
}

impl Bench {
    pub(crate) async fn wait(&self, sizes: &Sizes) -> Result<WaitResult> {
        let mut out = WaitResult::default();
        let rounds = sizes.wait_rounds;
        let n = sizes.wait_latency_writes;
        println!(
            "latency: relay's mark -> the wait returns ({rounds} round(s) of {n} writes at 100/s, \
             each waited for)"
        );
        for delay in [0u64, 5] {
            let fga = self.fga();
            if delay > 0 {
                fga.push_fault(FaultRule::times(
                    Fault::Delay(Duration::from_millis(delay)),
                    1_000_000,
                ));
            }
            let relay = self.start_relay(&fga, &[]).await?;
            let cpu0 = self.cpu(None).await?;
            let mut all: Vec<(&'static str, Vec<f64>)> = Vec::new();
            let mut inserts = Vec::new();
            for round in 0..rounds {
                for name in rotated(round, &[]).into_iter().chain([FLOOR]) {
                    self.use_candidate(name).await?;
                    self.mark_to_return(n / 10 + 1, 100).await?;
                    let (v, ins) = self.mark_to_return(n, 100).await?;
                    inserts.extend(ins);
                    match all.iter_mut().find(|(k, _)| *k == name) {
                        Some((_, acc)) => acc.extend(v),
                        None => all.push((name, v)),
                    }
                }
            }
            let cpu = cpu0.until(&self.cpu(None).await?);
            println!(
                "  OpenFGA answering in {delay} ms; machine busy {:.0}% of {}%, load {}",
                cpu.machine / cpu.wall * 100.0,
                100 * std::thread::available_parallelism().map_or(1, |n| n.get()),
                loadavg()
            );
            for (name, v) in all {
                let d = Dist::of(v);
                println!("    {name:<10} {}", d.line());
                out.latency.push((delay, name, d));
            }
            println!(
                "    (the writer's own INSERT + commit) {}",
                Dist::of(inserts).line()
            );
            self.stop_relay(relay, "wait latency", &[]).await;
        }

        let rows = sizes.wait_backlog;
        let waiters = sizes.waiters;
        println!(
            "burn-down of {rows} rows, with {waiters} waiters on its last rows / without \
             ({rounds} round(s))"
        );
        let (mut ratios, mut cpus) = (PerCandidate::default(), PerCandidate::default());
        for round in 0..rounds {
            for name in rotated(round, &[]) {
                self.use_candidate(name).await?;
                let (none, _) = self.burn_down_waited(rows, 0).await?;
                let (with, cpu) = self.burn_down_waited(rows, waiters).await?;
                ratios.push(name, with / none);
                cpus.push(name, cpu);
            }
        }
        println!("  load {}", loadavg());
        for name in CANDIDATES {
            println!(
                "    {name:<10} time with/without: median {:.3} {:.3?}; waiters' CPU {:.1}% of \
                 a core (median)",
                ratios.median(name),
                ratios.all(name),
                cpus.median(name) * 100.0
            );
            out.burn_down.push((name, ratios.median(name)));
        }

        let secs = sizes.wait_writer_seconds;
        println!(
            "writers: 8 clients, {secs} s, with {waiters} sessions each waiting for the newest row \
             every 100 ms / without ({rounds} round(s)); {ROUND_TRIP}: those sessions send \
             SELECT 1 instead of each wait"
        );
        let (mut ratios, mut rates, mut cpus) = (
            PerCandidate::default(),
            PerCandidate::default(),
            PerCandidate::default(),
        );
        for round in 0..rounds {
            for name in rotated(round, &[ROUND_TRIP]) {
                self.use_candidate(name).await?;
                let (none, _, _) = self.writers_waited(secs, 0, name).await?;
                let (with, waits, cpu) = self.writers_waited(secs, waiters, name).await?;
                ratios.push(name, with / none);
                rates.push(name, waits);
                cpus.push(name, cpu);
            }
        }
        println!("  load {}", loadavg());
        for name in CANDIDATES.into_iter().chain([ROUND_TRIP]) {
            println!(
                "    {name:<10} tps with/without: median {:.3} {:.3?}; {:.0} waits/s; waiters' \
                 CPU {:.0}% of a core",
                ratios.median(name),
                ratios.all(name),
                rates.median(name),
                cpus.median(name) * 100.0
            );
            out.writers
                .push((name, ratios.median(name), rates.median(name)));
        }

        let secs = sizes.wait_timeout_seconds;
        println!("waits that time out after {secs} s");
        for (hang, what) in [
            (false, "relay down"),
            (true, "OpenFGA hanging, row in flight"),
        ] {
            for name in CANDIDATES {
                if !hang && name != SHIPPED {
                    // With no relay nothing is in flight: every candidate runs the same code.
                    continue;
                }
                self.use_candidate(name).await?;
                for n in [1, waiters] {
                    let (cpu, looks) = self.timeouts(secs, n, hang).await?;
                    println!(
                        "    {what}: {name:<10} {n:>2} waiters: backends' CPU {:.2}% of a core in \
                         all, {looks:.0} looks/s each; load {}",
                        cpu * 100.0,
                        loadavg()
                    );
                }
            }
        }
        self.use_candidate(SHIPPED).await?;
        Ok(out)
    }

    /// Installs a candidate; `select-1` leaves the shipped function in place (its waiters do
    /// not call it).
    async fn use_candidate(&self, name: &str) -> Result<()> {
        let name = if name == ROUND_TRIP { SHIPPED } else { name };
        self.admin.batch_execute(&candidate_sql(name)?).await?;
        Ok(())
    }

    /// `n` writes, each committed then waited for, at about `rate` a second: from the relay's
    /// mark (`processed_at`) to the wait's return, in ms. Also the writer's own INSERT
    /// (autocommit) times, for scale: a commit on the same disk.
    async fn mark_to_return(&self, n: usize, rate: u64) -> Result<(Vec<f64>, Vec<f64>)> {
        let c = self.db.connect().await;
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
            let answer = wait_for(&c, &[id], "10s").await?;
            let returned = unix_now();
            if answer != "delivered" {
                bail!("row {id}: {answer}");
            }
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
                .await?
                .get(0);
            out.push((returned - at) * 1000.0);
        }
        Ok((out, inserts))
    }

    /// A connection and its backend's pid.
    async fn session(&self) -> Result<(Client, u32)> {
        let c = self.db.connect().await;
        let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
        Ok((c, pid as u32))
    }

    /// Seconds to burn down `n` pending rows, with `waiters` sessions waiting for the last rows
    /// throughout; and the CPU the waiters' backends used meanwhile, as a share of one core.
    async fn burn_down_waited(&self, n: usize, waiters: usize) -> Result<(f64, f64)> {
        self.truncate().await?;
        let fga = self.fga();
        let relay = self.start_relay(&fga, &crate::burndown::PAUSED).await?;
        relay.signal(libc::SIGSTOP);
        let c = self.db.connect().await;
        c.execute(
            "INSERT INTO fga_outbox (payload) SELECT jsonb_build_object('writes', \
             jsonb_build_array(jsonb_build_object('user', 'user:b' || i, 'relation', 'viewer', \
             'object', 'document:b'))) FROM generate_series(1, $1::bigint) i",
            &[&(n as i64)],
        )
        .await?;
        c.batch_execute("ANALYZE fga_outbox").await?;
        let last: i64 = c
            .query_one("SELECT max(id) FROM fga_outbox", &[])
            .await?
            .get(0);
        let mut tasks = Vec::new();
        let mut pids = Vec::new();
        for k in 0..waiters as i64 {
            let (w, pid) = self.session().await?;
            pids.push(pid);
            // Once, so that the function is compiled and its statements planned before the clock.
            wait_for(&w, &[last - k], "0s").await?;
            // Each task hands its connection back, so that its backend is still there to be
            // measured.
            tasks.push(tokio::spawn(async move {
                let answer = wait_for(&w, &[last - k], "300s").await;
                (answer, w)
            }));
        }
        while waiters > 0 && in_wait(&c).await? < waiters as i64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let cpu0: f64 = pids.iter().map(|p| task_cpu_seconds(*p)).sum();
        let started = Instant::now();
        relay.signal(libc::SIGCONT);
        self.wait_drained(Duration::from_secs(600), Duration::from_millis(2))
            .await?;
        let took = started.elapsed().as_secs_f64();
        let mut sessions = Vec::new();
        for t in tasks {
            let (answer, w) = t.await?;
            let answer = answer?;
            if answer != "delivered" {
                bail!("a waiter got {answer}");
            }
            sessions.push(w);
        }
        let cpu = pids.iter().map(|p| task_cpu_seconds(*p)).sum::<f64>() - cpu0;
        self.stop_relay(relay, "wait burn-down", &[]).await;
        Ok((took, cpu / took))
    }

    /// Transactions a second of 8 writers inserting one row each, for `secs`, while `waiters`
    /// sessions each wait for the newest row a writer inserted, then pause 100 ms, and again
    /// (with `select-1` as the candidate, send `SELECT 1` instead of each wait); the waits a
    /// second they completed, and the CPU their backends used, as a share of one core. Each
    /// session prepares its statement once, as the writers do: one round trip a wait.
    async fn writers_waited(
        &self,
        secs: u64,
        waiters: usize,
        candidate: &str,
    ) -> Result<(f64, f64, f64)> {
        self.truncate().await?;
        let fga = self.fga();
        let relay = self.start_relay(&fga, &[]).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicU64::new(0));
        let waits = Arc::new(AtomicU64::new(0));
        let mut tasks: Vec<tokio::task::JoinHandle<Result<()>>> = Vec::new();
        let c = self.db.connect().await;
        // The newest id a writer got back (`RETURNING id`, as an application has its own ids).
        let newest = Arc::new(AtomicI64::new(
            insert_with(&c, writes(&[tk("user:w", "viewer", "document:w")])).await,
        ));
        let mut pids = Vec::new();
        let round_trip_only = candidate == ROUND_TRIP;
        let call_sql = if round_trip_only {
            "SELECT 1"
        } else {
            WAIT_CALL
        };
        for _ in 0..waiters {
            let (w, pid) = self.session().await?;
            pids.push(pid);
            let (stop, waits, newest) = (stop.clone(), waits.clone(), newest.clone());
            tasks.push(tokio::spawn(async move {
                let call = w.prepare(call_sql).await?;
                while !stop.load(Ordering::Relaxed) {
                    if round_trip_only {
                        w.query_one(&call, &[]).await?;
                    } else {
                        let id = [newest.load(Ordering::Relaxed)];
                        w.query_one(&call, &[&&id[..], &"10s"]).await?;
                    }
                    waits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(())
            }));
        }
        for k in 0..8 {
            let w = self.db.connect().await;
            let (stop, commits, newest) = (stop.clone(), commits.clone(), newest.clone());
            tasks.push(tokio::spawn(async move {
                let stmt = w
                    .prepare("INSERT INTO fga_outbox (payload) VALUES ($1) RETURNING id")
                    .await?;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = writes(&[tk(&format!("user:w{k}-{i}"), "viewer", "document:w")]);
                    let id: i64 = w.query_one(&stmt, &[&p]).await?.get(0);
                    newest.fetch_max(id, Ordering::Relaxed);
                    commits.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                Ok(())
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (c0, w0, t0) = (
            commits.load(Ordering::Relaxed),
            waits.load(Ordering::Relaxed),
            Instant::now(),
        );
        let cpu0: f64 = pids.iter().map(|p| task_cpu_seconds(*p)).sum();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (c1, w1, dt) = (
            commits.load(Ordering::Relaxed),
            waits.load(Ordering::Relaxed),
            t0.elapsed().as_secs_f64(),
        );
        let cpu = pids.iter().map(|p| task_cpu_seconds(*p)).sum::<f64>() - cpu0;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await??;
        }
        self.stop_relay(relay, "wait writers", &[]).await;
        Ok(((c1 - c0) as f64 / dt, (w1 - w0) as f64 / dt, cpu / dt))
    }

    /// `waiters` waits for one row that time out after `secs`: with no relay running, or with
    /// the row in flight for longer (`hang`: OpenFGA never answers). Returns the CPU their
    /// backends used (share of one core, all together) and the looks each made a second.
    async fn timeouts(&self, secs: u64, waiters: usize, hang: bool) -> Result<(f64, f64)> {
        self.truncate().await?;
        let fga = self.fga();
        let relay: Option<RelayProc> = if hang {
            fga.push_fault(FaultRule::times(Fault::Hang, 1));
            // The Write stays in flight through the waits, and not much longer: the relay's
            // stop waits for it.
            let deadline = format!("{}s", secs + 2);
            Some(
                self.start_relay(&fga, &[("FGA_RELAY_REQUEST_TIMEOUT", deadline.as_str())])
                    .await?,
            )
        } else {
            None
        };
        let c = self.db.connect().await;
        let id = insert_with(&c, writes(&[tk("user:t", "viewer", "document:t")])).await;
        while hang && in_flight(&c).await? == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut sessions = Vec::new();
        for _ in 0..waiters {
            sessions.push(self.session().await?);
        }
        let pids: Vec<u32> = sessions.iter().map(|(_, p)| *p).collect();
        let before: f64 = pids.iter().map(|p| task_cpu_seconds(*p)).sum();
        let started = Instant::now();
        let timeout = format!("{secs}s");
        let tasks: Vec<_> = sessions
            .into_iter()
            .map(|(w, _)| {
                let timeout = timeout.clone();
                tokio::spawn(async move {
                    // In a transaction of its own, to read its own statistics: each look is
                    // one index scan of the table.
                    w.batch_execute("BEGIN").await?;
                    let answer = wait_for(&w, &[id], &timeout).await?;
                    let scans: i64 = w
                        .query_one(
                            "SELECT coalesce(idx_scan, 0) + seq_scan FROM pg_stat_xact_user_tables \
                             WHERE relname = 'fga_outbox'",
                            &[],
                        )
                        .await?
                        .get(0);
                    w.batch_execute("COMMIT").await?;
                    Ok::<_, tokio_postgres::Error>((answer, scans, w))
                })
            })
            .collect();
        let mut scans = 0;
        let mut sessions = Vec::new();
        for t in tasks {
            let (answer, n, w) = t.await??;
            if answer != "pending" {
                bail!("a wait that should time out got {answer}");
            }
            scans += n;
            sessions.push(w);
        }
        let took = started.elapsed().as_secs_f64();
        let used: f64 = pids.iter().map(|p| task_cpu_seconds(*p)).sum::<f64>() - before;
        drop(sessions);
        if let Some(relay) = relay {
            fga.clear_faults();
            self.stop_relay(relay, "wait timeouts", &["write failed"])
                .await;
        }
        Ok((used / took, scans as f64 / took / waiters as f64))
    }
}

/// The relay's sessions inside a transaction: a Write in flight.
async fn in_flight(c: &Client) -> Result<i64> {
    Ok(c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'fga_relay' \
         AND state LIKE 'idle in transaction%'",
        &[],
    )
    .await
    .context("pg_stat_activity")?
    .get(0))
}

/// Sessions inside `fga_outbox_wait`.
async fn in_wait(c: &Client) -> Result<i64> {
    Ok(c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT fga_outbox_wait%' \
         AND state = 'active'",
        &[],
    )
    .await
    .context("pg_stat_activity")?
    .get(0))
}
