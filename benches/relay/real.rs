//! Scenario: a real OpenFGA (the newest the tests run) on its PostgreSQL datastore, a cluster of
//! its own with production durability.
//!
//! - The ceiling: a bare client sending the relay's Writes (100 tuples of the burn-down's rows)
//!   straight to OpenFGA, with as many in flight as the relay's default window, no outbox;
//!   measured before and after each of the relay's burn-downs (`--real-rounds`), which also
//!   talk to OpenFGA directly.
//! - The relay's burn-downs of the same tuples, each as a ratio of the mean of the ceilings on
//!   either side of it, and the median of those; the relay's own cost: the CPU of the relay,
//!   its sessions and the rest of the outbox's PostgreSQL per 1,000 tuples.
//! - The same again with OpenFGA and its PostgreSQL held to a CPU quota (`--fga-cpus`, a
//!   cgroup: `cgroup.rs`), the relay, the outbox's PostgreSQL and the bare client outside it:
//!   what the relay's side takes from the machine's CPUs then cannot slow OpenFGA down, and
//!   the ratio measures the relay.
//! - Latency (`real_latency.rs`): commit → OpenFGA answered the relay's Write, beside the bare
//!   client's single-tuple Write, at 200 and 1,000 commits/s and with OpenFGA slowed to 10 ms.
//! - The window: the bare client at 4, 8, 16 and 32 Writes in flight: what each does to
//!   OpenFGA's throughput and to its Write latency.

use crate::args::Sizes;
use crate::burndown::BurnDown;
use crate::cgroup::{CpuQuota, children};
use crate::common::fga::Fga;
use crate::cpu::loadavg;
use crate::harness::Bench;
use crate::real_latency::{LATENCY_CONFIGS, RealLatency};
use crate::stats::{Dist, median};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The relay's default `--max-in-flight`.
pub(crate) const DEFAULT_WINDOW: usize = 16;
const WINDOWS: [usize; 4] = [4, 8, 16, 32];
const TUPLES_PER_WRITE: usize = 100;
/// How often the bare client sends a Write that OpenFGA answered 5xx before it gives up.
const RETRIES: usize = 10;

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

/// The bare client's ceiling and the relay's burn-downs of as many rows, in turn: ceiling, relay,
/// ceiling, relay, …, ceiling. Each burn-down is set against the mean of the two ceilings on
/// either side of it, and the ratio is the median of those: OpenFGA's speed drifts over a run
/// (its tables grow, its autovacuum comes and goes), by up to 16% between two ceilings a
/// burn-down apart, as much as the gap to the target.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ceiling {
    /// One more than `relays`.
    pub(crate) ceilings: Vec<Bare>,
    pub(crate) relays: Vec<BurnDown>,
}

impl Ceiling {
    /// Each burn-down's tuples/s over the mean of the ceilings on either side of it.
    pub(crate) fn ratios(&self) -> Vec<f64> {
        self.ceilings
            .windows(2)
            .zip(&self.relays)
            .map(|(c, r)| r.tuples_per_s() / ((c[0].tuples_per_s() + c[1].tuples_per_s()) / 2.0))
            .collect()
    }

    /// The median of [`Ceiling::ratios`].
    pub(crate) fn ratio(&self) -> f64 {
        median(self.ratios())
    }

    /// The burn-down whose ratio is the median one (the lower of the middle two when even).
    pub(crate) fn median_relay(&self) -> Option<&BurnDown> {
        let ratios = self.ratios();
        let mut order: Vec<usize> = (0..ratios.len()).collect();
        order.sort_by(|&a, &b| ratios[a].total_cmp(&ratios[b]));
        let middle = order.get(order.len().saturating_sub(1) / 2)?;
        self.relays.get(*middle)
    }

    /// The median of the burn-downs' costs per 1,000 tuples.
    pub(crate) fn cost_ms_per_1000(&self) -> f64 {
        median(self.relays.iter().map(BurnDown::cost_ms_per_1000).collect())
    }

    /// The ceilings' tuples/s, in the order measured, for a table cell.
    pub(crate) fn ceilings_line(&self) -> String {
        let all: Vec<String> = self
            .ceilings
            .iter()
            .map(|c| format!("{:.0}", c.tuples_per_s()))
            .collect();
        all.join(" / ")
    }

    /// The ratios, in the order measured, for a table cell.
    pub(crate) fn ratios_line(&self) -> String {
        let all: Vec<String> = self.ratios().iter().map(|r| format!("{r:.3}")).collect();
        all.join(", ")
    }
}

/// The same, with OpenFGA and its PostgreSQL in a cgroup with a CPU quota.
#[derive(Clone, Debug, Default)]
pub(crate) struct Confined {
    pub(crate) cpus: f64,
    /// `cgroup v1` or `cgroup v2`.
    pub(crate) kind: &'static str,
    pub(crate) runs: Ceiling,
    /// Of the scheduler's periods during the runs, those in which the cgroup used up its quota,
    /// and the time its processes waited for the next period.
    pub(crate) periods: u64,
    pub(crate) throttled: u64,
    pub(crate) throttled_secs: f64,
}

#[derive(Clone, Debug)]
pub(crate) struct Real {
    /// Everything on the machine's CPUs alike.
    pub(crate) open: Ceiling,
    /// OpenFGA and its PostgreSQL held to a CPU quota; why not, when no cgroup could be made.
    pub(crate) confined: Result<Confined, String>,
    /// Commit → OpenFGA answered, at each rate and OpenFGA's speed.
    pub(crate) latency: Vec<RealLatency>,
    pub(crate) windows: Vec<Bare>,
    pub(crate) load: String,
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
            // A Write OpenFGA gives up on (its own deadline, under a CPU quota) is sent again,
            // as the relay sends its own again: the ceiling counts what OpenFGA applies.
            let t = Instant::now();
            let mut tries = 0;
            let answer = loop {
                tries += 1;
                let answer = http.post(&url).json(&body).send().await;
                match answer {
                    Ok(a) if a.status().is_server_error() && tries < RETRIES => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    other => break other,
                }
            };
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

impl Bench {
    pub(crate) async fn real(&self, sizes: &Sizes) -> Result<Real> {
        let fga = self.fga();
        let datastore = &self.fga_db;
        let base = fga.direct_url().to_owned();
        let store = fga.store_id().to_owned();
        let write_url = format!("{base}/stores/{store}/write");
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

        println!("everything on the machine's CPUs alike:");
        let open = self
            .ceiling(&fga, &http, "r", rows, sizes.real_rounds)
            .await?;
        println!(
            "with OpenFGA and its PostgreSQL held to {} CPUs (the relay, the outbox's PostgreSQL \
             and the bare client outside):",
            sizes.fga_cpus
        );
        let confined = match CpuQuota::create(sizes.fga_cpus) {
            Ok(quota) => Ok(self
                .confined(&fga, &http, rows, sizes.real_rounds, quota)
                .await?),
            Err(e) => {
                println!("  not measured: no cgroup for the quota: {e:#}");
                Err(format!("{e:#}"))
            }
        };

        let mut latency = Vec::new();
        for (k, &config) in LATENCY_CONFIGS.iter().enumerate() {
            latency.push(self.real_latency(&fga, &http, sizes, k, config).await?);
        }

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
            open,
            confined,
            latency,
            windows,
            load: loadavg(),
        })
    }

    /// The bare client's ceiling and `rounds` burn-downs of the relay of as many rows in turn,
    /// ending with a ceiling; all straight to OpenFGA. `tag` keeps each run's tuples apart.
    async fn ceiling(
        &self,
        fga: &Fga,
        http: &reqwest::Client,
        tag: &str,
        rows: usize,
        rounds: usize,
    ) -> Result<Ceiling> {
        let base = fga.direct_url();
        let write_url = format!("{base}/stores/{}/write", fga.store_id());
        let mut c = Ceiling::default();
        for round in 0..=rounds {
            let bare = bare(
                http,
                &write_url,
                &format!("{tag}c{round}"),
                rows,
                DEFAULT_WINDOW,
            )
            .await?;
            println!(
                "  ceiling, bare client, {DEFAULT_WINDOW} in flight: {:.0} tuples/s; Write {}",
                bare.tuples_per_s(),
                bare.write.line()
            );
            c.ceilings.push(bare);
            if round == rounds {
                break;
            }
            self.truncate().await?;
            let relay = self
                .burn_with(
                    rows,
                    &format!("{tag}b{round}"),
                    fga,
                    &[("FGA_API_URL", base)],
                )
                .await?;
            relay.print("relay burn-down");
            let per_1000 = |secs: f64| secs * 1e6 / relay.tuples.max(1) as f64;
            println!(
                "    the relay's own cost: {:.1} ms of CPU per 1,000 tuples: the relay {:.1}, its \
                 sessions {:.1}, the rest of the outbox's PostgreSQL {:.1}",
                relay.cost_ms_per_1000(),
                per_1000(relay.cpu.relay),
                per_1000(relay.cpu.relay_pg),
                per_1000(relay.cpu.pg_other.max(0.0))
            );
            c.relays.push(relay);
        }
        println!(
            "  relay / the ceilings on either side: {}; median {:.3}",
            c.ratios_line(),
            c.ratio()
        );
        Ok(c)
    }

    /// [`Bench::ceiling`] with OpenFGA's server and its PostgreSQL cluster in `quota`. The
    /// cluster's postmaster goes in with the sessions it has: the sessions it forks later are
    /// born in it. Checked before and after, from `/proc/PID/cgroup`.
    async fn confined(
        &self,
        fga: &Fga,
        http: &reqwest::Client,
        rows: usize,
        rounds: usize,
        quota: CpuQuota,
    ) -> Result<Confined> {
        let server = fga.server_pid();
        quota.add(server)?;
        quota.add_cluster(self.fga_postmaster)?;
        let inside = |quota: &CpuQuota| -> Result<usize> {
            let mut pids = children(self.fga_postmaster);
            pids.extend([server, self.fga_postmaster]);
            let outside = quota.outside(&pids);
            if !outside.is_empty() {
                bail!("processes of OpenFGA or its PostgreSQL outside the cgroup: {outside:?}");
            }
            let ours = [self.postmaster, std::process::id()];
            if ours.iter().any(|&p| quota.holds(p)) {
                bail!("the outbox's PostgreSQL or the bench in the cgroup");
            }
            Ok(pids.len())
        };
        let n = inside(&quota)?;
        println!(
            "  {} {}: OpenFGA (pid {server}) and its PostgreSQL (postmaster {}), {n} processes; \
             quota {} CPUs",
            quota.kind,
            quota.path().display(),
            self.fga_postmaster,
            quota.cpus
        );
        let (p0, t0, s0) = quota.throttling();
        let runs = self.ceiling(fga, http, "q", rows, rounds).await?;
        let (p1, t1, s1) = quota.throttling();
        let n = inside(&quota)?;
        let c = Confined {
            cpus: quota.cpus,
            kind: quota.kind,
            runs,
            periods: p1 - p0,
            throttled: t1 - t0,
            throttled_secs: s1 - s0,
        };
        println!(
            "  throttled in {} of {} periods ({:.1} s waited); {n} processes in the cgroup at the \
             end, none of them outside",
            c.throttled, c.periods, c.throttled_secs
        );
        drop(quota);
        Ok(c)
    }
}
