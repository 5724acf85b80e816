//! Scenario: one store's trouble must not hold another's rows. A store whose every Write the
//! proxy answers 500 has a backlog of pending rows (2 tuples each) at the head of the table;
//! while the relay keeps failing them, another store's rows are committed one every 0.5 s, paced
//! by a schedule (the n-th at t0 + n × 0.5 s), for `--isolation-seconds`. Measured: each of
//! those rows' commit → OpenFGA answered the Write carrying it (at the proxy; a row never
//! delivered counts as infinitely late), the relay's resident memory every 0.5 s (it must stay
//! flat: a held store's backlog is not read again and again), and the CPU of the relay and the
//! outbox's PostgreSQL over the run.

use crate::args::Sizes;
use crate::burndown::RowState;
use crate::cpu::{CpuUse, loadavg, rss_kib};
use crate::harness::Bench;
use crate::latency::first_seen;
use crate::stats::Dist;
use anyhow::{Context, Result};
use serde_json::json;
use std::time::{Duration, Instant};

/// The healthy store's commits: one every this.
const EVERY: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub(crate) struct IsolationResult {
    pub(crate) backlog: usize,
    pub(crate) secs: u64,
    pub(crate) commits: usize,
    /// The healthy store's rows: commit → OpenFGA answered the Write carrying the row.
    pub(crate) latency: Dist,
    pub(crate) undelivered: usize,
    /// The relay's RSS (seconds since the first commit, KiB), every 0.5 s.
    pub(crate) rss: Vec<(f64, u64)>,
    pub(crate) cpu: CpuUse,
    /// Writes to the failing store, all answered 500.
    pub(crate) failing_writes: usize,
    /// The failing store's rows still pending at the end, and rows dead-lettered.
    pub(crate) pending: i64,
    pub(crate) dead: i64,
    pub(crate) load: String,
}

impl IsolationResult {
    pub(crate) fn rss_first(&self) -> u64 {
        self.rss.first().map_or(0, |r| r.1)
    }

    pub(crate) fn rss_max(&self) -> u64 {
        self.rss.iter().map(|r| r.1).max().unwrap_or(0)
    }

    pub(crate) fn rss_last(&self) -> u64 {
        self.rss.last().map_or(0, |r| r.1)
    }

    /// Flat: the run's second half never above its first half's peak by more than 10% (and
    /// 1 MiB, the allocator's slack).
    pub(crate) fn rss_flat(&self) -> bool {
        let (first, second) = self.rss.split_at(self.rss.len() / 2);
        let peak = |h: &[(f64, u64)]| h.iter().map(|r| r.1).max().unwrap_or(0);
        peak(second) as f64 <= peak(first) as f64 * 1.1 + 1024.0
    }

    /// The outbox's PostgreSQL (the relay's sessions and the rest of it, not the bench's
    /// session), in % of a core.
    pub(crate) fn outbox_pg_pct(&self) -> f64 {
        (self.cpu.relay_pg + self.cpu.pg_other.max(0.0)) / self.cpu.wall.max(1e-9) * 100.0
    }

    pub(crate) fn relay_pct(&self) -> f64 {
        self.cpu.relay / self.cpu.wall.max(1e-9) * 100.0
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl Bench {
    pub(crate) async fn isolation(&self, sizes: &Sizes) -> Result<IsolationResult> {
        let fga = self.fga();
        let failing = fga.store_id().to_owned();
        let healthy = fga.add_store();
        fga.push_fault(
            crate::common::fga::FaultRule::times(crate::common::fga::Fault::internal(), usize::MAX)
                .when_store(&failing),
        );
        let backlog = sizes.isolation_backlog;
        let secs = sizes.isolation_seconds;
        // The failing store's rows name no store: they go to the relay's own (FGA_STORE_ID).
        self.fill("if", backlog, RowState::Pending).await?;
        println!(
            "{backlog} pending rows of a store whose Writes are answered 500, then a row of \
             another store every {} ms for {secs} s",
            EVERY.as_millis()
        );
        let relay = self.start_relay(&fga, &[]).await?;
        let pid = relay.pid();
        crate::common::relay::poll_until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            || async { fga.write_count() > 0 },
        )
        .await
        .context("the relay sent no Write to the failing store within 30 s")?;

        let writer = self.db.connect().await;
        let insert = writer
            .prepare("INSERT INTO fga_outbox (payload) VALUES ($1)")
            .await?;
        let delivered_sql = format!(
            "SELECT count(*) FROM fga_outbox WHERE processed_at IS NOT NULL \
             AND payload->>'store_id' = '{healthy}'"
        );
        let n = (Duration::from_secs(secs).as_millis() / EVERY.as_millis()).max(1) as usize;
        let cpu0 = self.cpu(Some(pid)).await?;
        let start = tokio::time::Instant::now() + Duration::from_millis(20);
        let t0 = Instant::now();
        let mut commits = Vec::with_capacity(n);
        let mut rss = Vec::with_capacity(n);
        for i in 0..n {
            tokio::time::sleep_until(start + EVERY * i as u32).await;
            let user = format!("user:iso{i}");
            let payload = json!({"store_id": healthy, "writes": [
                {"user": user, "relation": "viewer", "object": "document:iso"}
            ]});
            writer.execute(&insert, &[&payload]).await?;
            commits.push((user, Instant::now()));
            if let Some(kib) = rss_kib(pid) {
                rss.push((t0.elapsed().as_secs_f64(), kib));
            }
            if (i + 1) % 120 == 0 {
                println!(
                    "  {:.0} s: {} of {} rows of the healthy store delivered; relay RSS {:.1} MiB",
                    t0.elapsed().as_secs_f64(),
                    self.count(&delivered_sql).await?,
                    i + 1,
                    mib(rss.last().map_or(0, |r| r.1))
                );
            }
        }
        let last_delivered = crate::common::relay::poll_until(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || async { self.count(&delivered_sql).await.unwrap_or(0) as usize >= n },
        )
        .await;
        let cpu = cpu0.until(&self.cpu(Some(pid)).await?);
        self.stop_relay(
            relay,
            "isolation",
            &["write failed", "Internal Server Error", "internal_error"],
        )
        .await;
        if last_delivered.is_none() {
            println!(
                "  note: not every row of the healthy store was delivered 10 s after the last"
            );
        }

        let answered = first_seen(&fga, |w| w.answered_at);
        let mut undelivered = 0;
        let latency: Vec<f64> = commits
            .iter()
            .map(|(user, committed)| match answered.get(user) {
                Some(at) => at.saturating_duration_since(*committed).as_secs_f64() * 1e3,
                None => {
                    undelivered += 1;
                    f64::INFINITY
                }
            })
            .collect();
        let failing_writes = fga.writes().iter().filter(|w| w.store == failing).count();
        let pending = self
            .count(
                "SELECT count(*) FROM fga_outbox \
                 WHERE processed_at IS NULL AND failed_at IS NULL",
            )
            .await?;
        let dead = self
            .count("SELECT count(*) FROM fga_outbox WHERE failed_at IS NOT NULL")
            .await?;
        self.truncate().await?;
        let r = IsolationResult {
            backlog,
            secs,
            commits: n,
            latency: Dist::of(latency),
            undelivered,
            rss,
            cpu,
            failing_writes,
            pending,
            dead,
            load: loadavg(),
        };
        println!(
            "  the healthy store's {n} rows, commit → OpenFGA answered: {} ({undelivered} never \
             delivered)",
            r.latency.line()
        );
        println!(
            "  relay RSS: first {:.1} MiB, max {:.1} MiB, last {:.1} MiB ({} samples)",
            mib(r.rss_first()),
            mib(r.rss_max()),
            mib(r.rss_last()),
            r.rss.len()
        );
        println!(
            "  the failing store: {failing_writes} Writes (all answered 500); rows pending at \
             the end {pending}, dead-lettered {dead}"
        );
        println!("  {}", r.cpu.line());
        Ok(r)
    }
}
