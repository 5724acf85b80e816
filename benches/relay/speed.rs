//! Scenario: burn-down against an OpenFGA that takes time to answer (fixed 5, 20 and 50 ms per
//! Write, and a long-tailed distribution), for several windows of Writes in flight, beside the
//! ceiling of one Write at a time; and what a crash with the window full leaves to send again.

use crate::args::Sizes;
use crate::burndown::{RowState, rows_sql};
use crate::common::fga::Latency;
use crate::cpu::loadavg;
use crate::harness::Bench;
use anyhow::Result;
use std::time::{Duration, Instant};

/// Rows of the bench's shape (2 tuples) in one Write of 100 tuples.
const ROWS_PER_WRITE: f64 = 50.0;

#[derive(Clone, Debug)]
pub(crate) struct SpeedRow {
    pub(crate) latency: String,
    /// Rows/s of one full Write at a time, back to back, at the mean latency.
    pub(crate) ceiling: f64,
    /// (window, rows/s).
    pub(crate) rates: Vec<(usize, f64)>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Speed {
    pub(crate) rows: Vec<SpeedRow>,
    /// Tuple operations OpenFGA accepted beyond those of the rows marked delivered, right after
    /// a kill -9 with the default window full (20 ms OpenFGA).
    pub(crate) crash_redelivery: i64,
}

fn latencies() -> Vec<(String, Option<Latency>, f64)> {
    let ms = Duration::from_millis;
    vec![
        ("instant".into(), None, 0.0),
        ("5 ms".into(), Some(Latency::Fixed(ms(5))), 5.0),
        ("20 ms".into(), Some(Latency::Fixed(ms(20))), 20.0),
        ("50 ms".into(), Some(Latency::Fixed(ms(50))), 50.0),
        // Log-normal, σ = 1: the mean is e^½ times the median.
        (
            "long tail, median 20 ms (mean 33, p99 205)".into(),
            Some(Latency::LongTail(ms(20))),
            20.0 * 0.5f64.exp(),
        ),
    ]
}

impl Bench {
    pub(crate) async fn speed(&self, sizes: &Sizes) -> Result<Speed> {
        let n = sizes.speed_backlog;
        let mut out = Speed::default();
        println!(
            "backlog of {n} rows (2 tuples each), Writes of 100 tuples; rows/s by --max-in-flight"
        );
        for (i, (name, latency, mean_ms)) in latencies().into_iter().enumerate() {
            let ceiling = if mean_ms > 0.0 {
                ROWS_PER_WRITE / (mean_ms / 1e3)
            } else {
                f64::INFINITY
            };
            let mut rates = Vec::new();
            for &w in &sizes.speed_windows {
                self.truncate().await?;
                let fga = self.fga();
                fga.set_latency(latency);
                let window = w.to_string();
                let r = self
                    .burn_with(
                        n,
                        &format!("s{i}w{w}"),
                        &fga,
                        &[("FGA_RELAY_MAX_IN_FLIGHT", &window)],
                    )
                    .await?;
                println!(
                    "  {name}, window {w}: {:.0} rows/s ({:.2}× the one-at-a-time ceiling), {} \
                     Writes; load {}",
                    r.rows_per_s(),
                    r.rows_per_s() / ceiling,
                    r.writes,
                    loadavg()
                );
                rates.push((w, r.rows_per_s()));
            }
            out.rows.push(SpeedRow {
                latency: name,
                ceiling,
                rates,
            });
        }
        out.crash_redelivery = self.crash_with_window_full(n).await?;
        println!(
            "  kill -9 with the default window full (20 ms OpenFGA): {} tuple operations accepted \
             by OpenFGA beyond those of the rows marked delivered (to be sent again)",
            out.crash_redelivery
        );
        Ok(out)
    }

    /// Kills a relay in the middle of a burn-down against a 20 ms OpenFGA, and counts what
    /// OpenFGA accepted beyond the rows marked delivered: what the crash will send again.
    async fn crash_with_window_full(&self, n: usize) -> Result<i64> {
        self.truncate().await?;
        let fga = self.fga();
        fga.set_latency(Some(Latency::Fixed(Duration::from_millis(20))));
        self.admin
            .batch_execute(&rows_sql("ck", n, RowState::Pending))
            .await?;
        let mut relay = self.start_relay(&fga, &[]).await?;
        // A quarter of the way in (20 Writes at most), when the window is full.
        let enough = (n / 200).clamp(1, 20);
        let t = Instant::now();
        while fga.write_count() < enough && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        relay.kill9();
        let t = Instant::now();
        while fga.writes().iter().any(|w| w.answered_at.is_none())
            && t.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let accepted: i64 = fga
            .writes()
            .iter()
            .filter(|w| w.status == 200)
            .map(|w| {
                w.body["writes"]["tuple_keys"]
                    .as_array()
                    .map_or(0, |a| a.len() as i64)
            })
            .sum();
        let marked = self
            .count("SELECT 2 * count(*) FROM fga_outbox WHERE processed_at IS NOT NULL")
            .await?;
        Ok(accepted - marked)
    }
}
