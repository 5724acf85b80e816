//! The real scenario's latency: single-row commits paced by a schedule (the n-th at
//! t0 + n/rate, however long the others take), each timed from its commit's return to the
//! moment OpenFGA answered the relay's Write carrying it (then a Check of every tuple must
//! answer allowed), beside a bare client's one-tuple Write at the same rate through the same
//! proxy. Both go through the tests' proxy, whose hop they then share, and which times the
//! relay's Writes without asking OpenFGA anything: a Check loop per commit (tried first) loads
//! OpenFGA enough to measure itself. Measured at 200 and at 1,000 commits/s, and at 200/s with
//! the proxy holding every Write 10 ms before passing it on (the relay's and the bare
//! client's alike), as a slower OpenFGA would.

use crate::args::Sizes;
use crate::common::fga::{Fga, Latency};
use crate::harness::Bench;
use crate::latency::{commit_steadily, first_seen};
use crate::stats::{Dist, ms};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// One configuration of the latency runs: commits a second, and how long the proxy holds
/// every Write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LatencyConfig {
    pub(crate) rate: u32,
    pub(crate) slowed_ms: Option<u64>,
}

pub(crate) const LATENCY_CONFIGS: [LatencyConfig; 3] = [
    LatencyConfig {
        rate: 200,
        slowed_ms: None,
    },
    LatencyConfig {
        rate: 1_000,
        slowed_ms: None,
    },
    LatencyConfig {
        rate: 200,
        slowed_ms: Some(10),
    },
];

impl LatencyConfig {
    pub(crate) fn label(&self) -> String {
        match self.slowed_ms {
            Some(d) => format!("{}/s, OpenFGA slowed to {d} ms", self.rate),
            None => format!("{}/s", self.rate),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct RealLatency {
    pub(crate) config: LatencyConfig,
    /// Commit returned → OpenFGA answered the relay's Write carrying the row.
    pub(crate) applied: Dist,
    /// Commit returned → the proxy received that Write: the relay's own part of `applied`.
    pub(crate) sent: Dist,
    /// Those Writes' round trips from the proxy to OpenFGA and back.
    pub(crate) relay_write: Dist,
    /// OpenFGA's own single-tuple Write, at the same rate, from the bare client.
    pub(crate) write: Dist,
    /// The same, while the same commits go into the outbox (no relay running): what the
    /// machine's other work does to OpenFGA's Write, without the relay.
    pub(crate) write_beside_commits: Dist,
    /// Those of the bare client's Writes beside the commits that OpenFGA did not accept (left
    /// out of `write_beside_commits`), and the first such answer.
    pub(crate) beside_failed: usize,
    pub(crate) beside_error: Option<String>,
    /// The bare client's Writes OpenFGA did not accept (left out of `write`), and the first
    /// such answer.
    pub(crate) write_failed: usize,
    pub(crate) write_error: Option<String>,
}

impl RealLatency {
    /// What the relay adds to OpenFGA's own Write, at p50 and at p99.
    pub(crate) fn added(&self) -> (f64, f64) {
        (
            self.applied.p50 - self.write.p50,
            self.applied.p99 - self.write.p99,
        )
    }

    /// What the relay adds over OpenFGA's own Write while the same commits run, p50 and p99.
    pub(crate) fn added_beside_commits(&self) -> (f64, f64) {
        (
            self.applied.p50 - self.write_beside_commits.p50,
            self.applied.p99 - self.write_beside_commits.p99,
        )
    }

    /// The bare client's Writes in flight on average (the rate × their mean time, Little's
    /// law). Above the relay's window, OpenFGA could not keep up with one Write a commit: they
    /// queued, and the comparison says nothing of the relay.
    pub(crate) fn bare_in_flight(&self) -> f64 {
        f64::from(self.config.rate) * self.write.mean / 1e3
    }

    pub(crate) fn bare_saturated(&self) -> bool {
        self.bare_in_flight() > crate::real::DEFAULT_WINDOW as f64
    }

    /// The target: ≤ 1 ms at p50, ≤ 3 ms at p99.
    pub(crate) fn met(&self) -> bool {
        let (p50, p99) = self.added();
        p50 <= 1.0 && p99 <= 3.0
    }
}

/// The bare client's run: each Write's round trip, and those that failed.
struct Steady {
    ms: Dist,
    failed: usize,
    first_error: Option<String>,
}

/// `n` single-tuple operations at `rate` a second, each started on schedule (the i-th at
/// t0 + i/rate, however long the others take): `act(i)` is timed from its start. One that
/// fails is counted, not waited for again: an overloaded OpenFGA answering a few Writes with
/// its deadline must not end the whole run.
async fn steadily<F, Fut>(n: usize, rate: u32, act: F) -> Result<Steady>
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
    let (mut ms, mut failed, mut first_error) = (Vec::new(), 0, None);
    while let Some(done) = tasks.join_next().await {
        match done? {
            Ok(t) => ms.push(t),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Ok(Steady {
        ms: Dist::of(ms),
        failed,
        first_error,
    })
}

/// The bare client: `n` one-tuple Writes through the proxy at `rate` a second, the body the
/// relay sends for one row, each for a user of its own under `tag`.
async fn bare_writes(
    http: &reqwest::Client,
    url: &str,
    tag: &str,
    n: usize,
    rate: u32,
) -> Result<Steady> {
    let object = format!("document:{tag}");
    steadily(n, rate, |i| {
        let (http, url) = (http.clone(), url.to_owned());
        let body = json!({"writes": {"tuple_keys": [
            {"user": format!("user:{tag}{i}"), "relation": "viewer", "object": object}
        ], "on_duplicate": "ignore"}});
        async move {
            let t = Instant::now();
            let answer = http.post(&url).json(&body).send().await?;
            if !answer.status().is_success() {
                bail!(
                    "OpenFGA answered {}: {}",
                    answer.status(),
                    answer.text().await.unwrap_or_default()
                );
            }
            Ok(t.elapsed().as_secs_f64() * 1e3)
        }
    })
    .await
}

/// Whether OpenFGA's Check allows `user viewer object`.
async fn allowed(http: &reqwest::Client, url: &str, user: &str, object: &str) -> Result<bool> {
    let body = json!({"tuple_key": {"user": user, "relation": "viewer", "object": object}});
    let answer: Value = http.post(url).json(&body).send().await?.json().await?;
    Ok(answer["allowed"] == json!(true))
}

impl Bench {
    /// One configuration: a relay with default settings through the proxy, then the bare
    /// client. The number of commits is the latency scenarios' at 200/s, as many more as the
    /// rate is higher (the same seconds of commits).
    pub(crate) async fn real_latency(
        &self,
        fga: &Fga,
        http: &reqwest::Client,
        sizes: &Sizes,
        k: usize,
        config: LatencyConfig,
    ) -> Result<RealLatency> {
        fga.set_latency(
            config
                .slowed_ms
                .map(|d| Latency::Fixed(Duration::from_millis(d))),
        );
        let result = self.real_latency_runs(fga, http, sizes, k, config).await;
        fga.set_latency(None);
        result
    }

    async fn real_latency_runs(
        &self,
        fga: &Fga,
        http: &reqwest::Client,
        sizes: &Sizes,
        k: usize,
        config: LatencyConfig,
    ) -> Result<RealLatency> {
        let rate = config.rate;
        let n = (sizes.latency_commits * rate as usize / 200).max(1);
        let warmup = sizes.latency_warmup * rate as usize / 200;
        let (tag, object) = (format!("rl{k}-"), format!("document:rl{k}-"));
        let (tag, object) = (tag.as_str(), object.as_str());
        let store = fga.store_id();
        let check_url = format!("{}/stores/{store}/check", fga.direct_url());
        self.truncate().await?;
        let relay_proc = self.start_relay(fga, &[]).await?;
        let writer = self.db.connect().await;
        commit_steadily(&writer, &format!("{tag}w"), warmup, rate).await?;
        let writes_before = fga.write_count();
        let commits = commit_steadily(&writer, tag, n, rate).await?;
        let wait = self
            .wait_drained(Duration::from_secs(30), Duration::from_millis(5))
            .await;
        self.stop_relay(relay_proc, "real latency", &[]).await;
        wait?;
        let answered = first_seen(fga, |w| w.answered_at);
        let received = first_seen(fga, |w| Some(w.received_at));
        let round_trips: Vec<f64> = fga
            .writes()
            .get(writes_before..)
            .unwrap_or_default()
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
            if !allowed(http, &check_url, &c.user, object).await? {
                refused += 1;
            }
        }
        if refused > 0 {
            bail!("{refused} of {n} delivered tuples not allowed by a Check");
        }
        let proxied_write = format!("{}/stores/{store}/write", fga.url());
        let write = bare_writes(http, &proxied_write, &format!("rw{tag}"), n, rate).await?;
        // Again with the same commits going into the outbox, no relay to deliver them (their
        // rows are left pending: the next run starts with an empty table). Without a relay the
        // trigger does not notify, and nothing reads or marks the rows: the baseline is the
        // commits without the relay's PostgreSQL work, which is the relay's to count.
        let (bare_tag, commit_tag) = (format!("rc{tag}"), format!("{tag}c"));
        let (beside, _) = tokio::try_join!(
            bare_writes(http, &proxied_write, &bare_tag, n, rate),
            commit_steadily(&writer, &commit_tag, n, rate)
        )?;
        let r = RealLatency {
            config,
            applied: Dist::of(applied),
            sent: Dist::of(sent),
            relay_write: Dist::of(round_trips),
            write: write.ms,
            write_beside_commits: beside.ms,
            beside_failed: beside.failed,
            beside_error: beside.first_error,
            write_failed: write.failed,
            write_error: write.first_error,
        };
        let (add50, add99) = r.added();
        println!(
            "  {n} commits at {}: commit → OpenFGA answered the relay's Write: {} (then all \
             allowed by a Check)",
            config.label(),
            r.applied.line()
        );
        println!(
            "    of which commit → the relay's Write sent: {}",
            r.sent.line()
        );
        println!("    and those Writes at OpenFGA: {}", r.relay_write.line());
        println!("    OpenFGA's own Write (bare client): {}", r.write.line());
        if let Some(e) = &r.beside_error {
            println!(
                "    note: {} of the bare client's {n} Writes beside the commits failed (left \
                 out); first: {e}",
                r.beside_failed
            );
        }
        let (beside50, beside99) = r.added_beside_commits();
        println!(
            "    the same while the same commits go into the outbox (no relay): {}; against it \
             the relay adds {} ms at p50, {} ms at p99",
            r.write_beside_commits.line(),
            ms(beside50),
            ms(beside99)
        );
        if r.bare_saturated() {
            println!(
                "    note: the bare client had {:.0} Writes in flight on average: OpenFGA did not \
                 keep up with one Write a commit at {rate}/s, and its Writes queued",
                r.bare_in_flight()
            );
        }
        if let Some(e) = &r.write_error {
            println!(
                "    note: {} of the bare client's {n} Writes failed (left out); first: {e}",
                r.write_failed
            );
        }
        println!(
            "    the relay adds {} ms at p50, {} ms at p99",
            ms(add50),
            ms(add99)
        );
        Ok(r)
    }
}
