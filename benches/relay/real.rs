//! Scenario: a real OpenFGA (the newest the tests run) on its PostgreSQL datastore, a cluster of
//! its own with production durability.
//!
//! - The ceiling: a bare client sending the relay's Writes (100 tuples of the burn-down's rows)
//!   straight to OpenFGA, with as many in flight as the relay's default window, no outbox;
//!   measured before and after the relay's burn-down, which also talks to OpenFGA directly.
//! - The relay's burn-down of the same tuples, as a ratio of the two ceilings' mean.
//! - Latency, at the latency scenario's rate: commit → OpenFGA answered the relay's Write
//!   carrying the row (then a Check of every tuple must answer allowed), beside the bare
//!   client's single-tuple Write round trip. Both go through the tests' proxy, whose hop they
//!   then share, and which times the relay's Writes without asking OpenFGA anything: a Check
//!   loop per commit (tried first) loads OpenFGA enough to measure itself.
//! - The window: the bare client at 4, 8, 16 and 32 Writes in flight: what each does to
//!   OpenFGA's throughput and to its Write latency.

use crate::args::Sizes;
use crate::burndown::BurnDown;
use crate::cpu::loadavg;
use crate::harness::Bench;
use crate::latency::{commit_steadily, first_seen};
use crate::stats::Dist;
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The relay's default `--max-in-flight`.
const DEFAULT_WINDOW: usize = 16;
const WINDOWS: [usize; 4] = [4, 8, 16, 32];
const TUPLES_PER_WRITE: usize = 100;

/// A bare client's run: Writes of 100 tuples, `window` in flight.
#[derive(Clone, Debug, Default)]
pub(crate) struct Bare {
    pub(crate) window: usize,
    pub(crate) tuples: usize,
    pub(crate) secs: f64,
    /// Each Write's round trip.
    pub(crate) write: Dist,
}

impl Bare {
    pub(crate) fn tuples_per_s(&self) -> f64 {
        self.tuples as f64 / self.secs
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Real {
    pub(crate) ceiling: Bare,
    /// The ceiling measured again after the relay's burn-down.
    pub(crate) ceiling_after: Bare,
    pub(crate) relay: BurnDown,
    /// Commit returned → OpenFGA answered the relay's Write carrying the row.
    pub(crate) applied: Dist,
    /// Commit returned → the proxy received that Write: the relay's own part of `applied`.
    pub(crate) sent: Dist,
    /// Those Writes' round trips from the proxy to OpenFGA and back.
    pub(crate) relay_write: Dist,
    /// OpenFGA's own single-tuple Write, at the same rate, from the bare client.
    pub(crate) write: Dist,
    pub(crate) windows: Vec<Bare>,
    pub(crate) load: String,
}

impl Real {
    pub(crate) fn ceiling_tuples_per_s(&self) -> f64 {
        (self.ceiling.tuples_per_s() + self.ceiling_after.tuples_per_s()) / 2.0
    }

    pub(crate) fn ratio(&self) -> f64 {
        self.relay.tuples_per_s() / self.ceiling_tuples_per_s()
    }
}

/// The burn-down rows' tuples (`rows_sql`'s shape: two a row), in Writes of 100.
fn bodies(tag: &str, rows: usize) -> Vec<Value> {
    let tuples: Vec<Value> = (1..=rows)
        .flat_map(|g| {
            [
                json!({"user": format!("capture_job:{tag}{g}"), "relation": "parent",
                       "object": format!("archive:{tag}{g}")}),
                json!({"user": "organization:acme", "relation": "parent",
                       "object": format!("capture_job:{tag}{g}")}),
            ]
        })
        .collect();
    tuples
        .chunks(TUPLES_PER_WRITE)
        .map(|c| json!({"writes": {"tuple_keys": c, "on_duplicate": "ignore"}}))
        .collect()
}

/// Sends `bodies` to OpenFGA with `window` in flight; fails on any answer but success.
async fn send_all(
    http: &reqwest::Client,
    url: &str,
    bodies: Vec<Value>,
    window: usize,
) -> Result<(f64, Dist)> {
    let slots = Arc::new(Semaphore::new(window));
    let mut tasks = JoinSet::new();
    let t0 = Instant::now();
    for body in bodies {
        let slot = slots.clone().acquire_owned().await?;
        let (http, url) = (http.clone(), url.to_owned());
        tasks.spawn(async move {
            let t = Instant::now();
            let answer = http.post(&url).json(&body).send().await;
            drop(slot);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            match answer {
                Ok(a) if a.status().is_success() => Ok(ms),
                Ok(a) => bail!(
                    "OpenFGA answered {}: {}",
                    a.status(),
                    a.text().await.unwrap_or_default()
                ),
                Err(e) => bail!("OpenFGA: {e}"),
            }
        });
    }
    let mut ms = Vec::new();
    while let Some(done) = tasks.join_next().await {
        ms.push(done??);
    }
    Ok((t0.elapsed().as_secs_f64(), Dist::of(ms)))
}

async fn bare(
    http: &reqwest::Client,
    url: &str,
    tag: &str,
    rows: usize,
    window: usize,
) -> Result<Bare> {
    let bodies = bodies(tag, rows);
    let (secs, write) = send_all(http, url, bodies, window).await?;
    Ok(Bare {
        window,
        tuples: 2 * rows,
        secs,
        write,
    })
}

/// `n` single-tuple operations at `rate` a second, each started on schedule: `act(i)` is timed
/// from its start.
async fn steadily<F, Fut>(n: usize, rate: u32, act: F) -> Result<Dist>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<f64>> + Send + 'static,
{
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let mut tasks = JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until(start + period.mul_f64(i as f64)).await;
        tasks.spawn(act(i));
    }
    let mut ms = Vec::new();
    while let Some(done) = tasks.join_next().await {
        ms.push(done??);
    }
    Ok(Dist::of(ms))
}

/// Whether OpenFGA's Check allows `user viewer object`.
async fn allowed(http: &reqwest::Client, url: &str, user: &str, object: &str) -> Result<bool> {
    let body = json!({"tuple_key": {"user": user, "relation": "viewer", "object": object}});
    let answer: Value = http.post(url).json(&body).send().await?.json().await?;
    Ok(answer["allowed"] == json!(true))
}

impl Bench {
    pub(crate) async fn real(&self, sizes: &Sizes) -> Result<Real> {
        let fga = self.fga();
        let datastore = &self.fga_db;
        let base = fga.direct_url().to_owned();
        let store = fga.store_id().to_owned();
        let write_url = format!("{base}/stores/{store}/write");
        let check_url = format!("{base}/stores/{store}/check");
        let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
        let rows = sizes.real_backlog;
        println!(
            "OpenFGA {} on PostgreSQL (fsync on); {rows} rows of 2 tuples, Writes of 100",
            fga.version()
        );
        // Warm-up: connections, OpenFGA's caches and its tables' first pages; then statistics
        // for OpenFGA's tables, which otherwise arrive with autovacuum in the middle of a run
        // and change its plans (a first ceiling measured without them was 5× lower).
        bare(&http, &write_url, "rw", rows.min(5_000), DEFAULT_WINDOW).await?;
        datastore.connect().await.batch_execute("ANALYZE").await?;

        let ceiling = bare(&http, &write_url, "rc", rows, DEFAULT_WINDOW).await?;
        println!(
            "  ceiling, bare client, {DEFAULT_WINDOW} in flight: {:.0} tuples/s; Write {}",
            ceiling.tuples_per_s(),
            ceiling.write.line()
        );
        self.truncate().await?;
        let relay = self
            .burn_with(rows, "rb", &fga, &[("FGA_API_URL", &base)])
            .await?;
        relay.print("relay burn-down");
        let ceiling_after = bare(&http, &write_url, "rd", rows, DEFAULT_WINDOW).await?;
        println!(
            "  ceiling again: {:.0} tuples/s; Write {}",
            ceiling_after.tuples_per_s(),
            ceiling_after.write.line()
        );
        let mean = (ceiling.tuples_per_s() + ceiling_after.tuples_per_s()) / 2.0;
        println!(
            "  relay / ceilings' mean: {:.3}",
            relay.tuples_per_s() / mean
        );

        // Latency, through the proxy (the relay's default URL here).
        let n = sizes.latency_commits;
        let rate = sizes.latency_rate;
        self.truncate().await?;
        let relay_proc = self.start_relay(&fga, &[]).await?;
        let writer = self.db.connect().await;
        commit_steadily(&writer, "rlw", sizes.latency_warmup, rate).await?;
        let commits = commit_steadily(&writer, "rl", n, rate).await?;
        let wait = self
            .wait_drained(Duration::from_secs(30), Duration::from_millis(5))
            .await;
        self.stop_relay(relay_proc, "real latency", &[]).await;
        wait?;
        let answered = first_seen(&fga, |w| w.answered_at);
        let received = first_seen(&fga, |w| Some(w.received_at));
        let round_trips: Vec<f64> = fga
            .writes()
            .iter()
            .filter_map(|w| Some((w.answered_at? - w.received_at).as_secs_f64() * 1e3))
            .collect();
        let (mut applied, mut sent) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut refused = 0;
        for c in &commits {
            let Some(&at) = answered.get(&c.user) else {
                bail!("no answered Write carried {}", c.user);
            };
            applied.push(at.saturating_duration_since(c.committed).as_secs_f64() * 1e3);
            if let Some(&r) = received.get(&c.user) {
                sent.push(r.saturating_duration_since(c.committed).as_secs_f64() * 1e3);
            }
            if !allowed(&http, &check_url, &c.user, "document:rl").await? {
                refused += 1;
            }
        }
        if refused > 0 {
            bail!("{refused} of {n} delivered tuples not allowed by a Check");
        }
        let (applied, sent, relay_write) =
            (Dist::of(applied), Dist::of(sent), Dist::of(round_trips));
        let proxied_write = format!("{}/stores/{store}/write", fga.url());
        let write = steadily(n, rate, |i| {
            let (http, url) = (http.clone(), proxied_write.clone());
            async move {
                // The body the relay sends for one row.
                let body = json!({"writes": {"tuple_keys": [
                    {"user": format!("user:rw{i}"), "relation": "viewer", "object": "document:rw"}
                ], "on_duplicate": "ignore"}});
                let t = Instant::now();
                let answer = http.post(&url).json(&body).send().await?;
                if !answer.status().is_success() {
                    bail!("OpenFGA answered {}", answer.status());
                }
                Ok(t.elapsed().as_secs_f64() * 1e3)
            }
        })
        .await?;
        println!(
            "  commit → OpenFGA answered the relay's Write, at {rate}/s: {} (then all {n} \
             allowed by a Check)",
            applied.line()
        );
        println!(
            "    of which commit → the relay's Write sent: {}",
            sent.line()
        );
        println!("    and those Writes at OpenFGA: {}", relay_write.line());
        println!("  OpenFGA's own Write at {rate}/s:   {}", write.line());

        let mut windows = Vec::new();
        for (k, window) in WINDOWS.into_iter().enumerate() {
            let b = bare(&http, &write_url, &format!("rx{k}"), rows, window).await?;
            println!(
                "  bare client, {window:>2} in flight: {:.0} tuples/s; Write {}",
                b.tuples_per_s(),
                b.write.line()
            );
            windows.push(b);
        }
        Ok(Real {
            ceiling,
            ceiling_after,
            relay,
            applied,
            sent,
            relay_write,
            write,
            windows,
            load: loadavg(),
        })
    }
}
