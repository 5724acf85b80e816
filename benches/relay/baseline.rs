//! Scenario: a timer-driven drainer as applications often write it, for comparison.

use crate::args::Sizes;
use crate::burndown::{RowState, rows_sql};
use crate::harness::Bench;
use crate::latency::{LatencyResult, measure_latency};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

/// Every second: select the pending rows (500 at a time, until none is left) and, for each row,
/// send one Write with its tuples, then mark it delivered. Plain autocommit statements on one
/// connection, one reqwest client: the code an application typically grows.
pub(crate) async fn baseline_drainer(
    db_url: String,
    fga_url: String,
    store_id: String,
    stop: CancellationToken,
) -> Result<usize> {
    let (client, conn) = tokio_postgres::connect(&db_url, NoTls).await?;
    let driver = tokio::spawn(conn);
    let http = reqwest::Client::new();
    let url = format!("{fga_url}/stores/{store_id}/write");
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
pub(crate) struct BaselineResult {
    pub(crate) latency: LatencyResult,
    pub(crate) rows: usize,
    pub(crate) secs: f64,
    pub(crate) writes: usize,
}

impl BaselineResult {
    pub(crate) fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.secs
    }
}

impl Bench {
    pub(crate) async fn baseline(&self, sizes: &Sizes) -> Result<BaselineResult> {
        // Latency.
        self.truncate().await?;
        let fga = self.fga();
        let stop = CancellationToken::new();
        let drainer = tokio::spawn(baseline_drainer(
            self.db.url().to_owned(),
            fga.url(),
            fga.store_id().to_owned(),
            stop.clone(),
        ));
        let latency = measure_latency(&self.db, &fga, "bl", sizes, Duration::from_secs(30)).await?;
        stop.cancel();
        drainer.await??;
        drop(fga);
        // Burn-down.
        self.truncate().await?;
        let n = sizes.baseline_backlog;
        self.admin
            .batch_execute(&rows_sql("bb", n, RowState::Pending))
            .await?;
        self.admin
            .batch_execute("ANALYZE fga_outbox; CHECKPOINT")
            .await?;
        let fga = self.fga();
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let drainer = tokio::spawn(baseline_drainer(
            self.db.url().to_owned(),
            fga.url(),
            fga.store_id().to_owned(),
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
