//! Scenario: the linger's trade-off. For each `--linger`, the throughput of 8 writers (pgbench)
//! beside a relay woken by its trigger, against the same writers beside a relay without a
//! trigger that sweeps every second (the same rows delivered, in large Writes: the cheapest the
//! relay can be for writers), in the same round, with the floors below that (`FLOORS`); and the
//! commit → OpenFGA latency at 200 commits/s and under a steady stream of 1,000 commits/s from
//! one writer.

use crate::args::Sizes;
use crate::cpu::loadavg;
use crate::harness::Bench;
use crate::latency::measure_latency;
use crate::stats::{Dist, median, ms};
use crate::writers::TriggerKind;
use anyhow::Result;
use std::time::Duration;

/// The steady stream's rate: a row a millisecond, where the linger decides how many go together.
const STREAM_RATE: u32 = 1000;

#[derive(Clone, Debug)]
pub(crate) struct LingerRow {
    pub(crate) linger: String,
    /// Median over rounds of writers' tps with the relay's trigger / without a trigger (1 s
    /// sweep).
    pub(crate) writers: f64,
    /// The same against no trigger and no relay.
    pub(crate) bare: f64,
    pub(crate) relay_cpu: f64,
    pub(crate) at_200: Dist,
    pub(crate) stream: Dist,
}

/// The runs of a round besides the lingers: what writers can do with no trigger and no relay,
/// what firing a trigger costs them (one that does nothing, and the relay's with no relay
/// running, so that it never notifies), and the relay at its cheapest: no trigger, a sweep a
/// second (the same rows delivered, in large Writes).
/// A run of the floors: its label, the trigger, and the relay's settings (None: no relay).
type Floor = (
    &'static str,
    TriggerKind,
    Option<&'static [(&'static str, &'static str)]>,
);

const FLOORS: [Floor; 4] = [
    ("no trigger, no relay", TriggerKind::None, None),
    ("empty trigger, no relay", TriggerKind::Empty, None),
    ("relay's trigger, no relay", TriggerKind::Relay, None),
    (
        "no trigger, 1 s sweep",
        TriggerKind::None,
        Some(&[("FGA_RELAY_SWEEP_INTERVAL", "1s")]),
    ),
];
/// The relay at its cheapest, against which the lingers are compared.
const BASE: usize = 3;

impl Bench {
    pub(crate) async fn linger(&self, sizes: &Sizes) -> Result<Vec<LingerRow>> {
        let clients = sizes.pgbench_clients.iter().copied().max().unwrap_or(8);
        let secs = sizes.pgbench_seconds;
        let pg = self.pgbench_setup().await?;
        println!(
            "--linger {}: {clients} pgbench clients, {secs} s a run, {} round(s), back to back in \
             rotating order, of: {}, and the relay's trigger with the default sweep (30 s) at \
             each linger",
            sizes.lingers.join(", "),
            sizes.linger_rounds,
            FLOORS.map(|f| f.0).join("; ")
        );
        let lingers: Vec<(String, Vec<(&str, &str)>)> = sizes
            .lingers
            .iter()
            .map(|l| {
                (
                    format!("linger {l}"),
                    vec![
                        ("FGA_RELAY_LINGER", l.as_str()),
                        ("FGA_RELAY_SWEEP_INTERVAL", "30s"),
                    ],
                )
            })
            .collect();
        let slots = FLOORS.len() + lingers.len();
        let mut tps: Vec<Vec<f64>> = vec![Vec::new(); slots];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); slots];
        for round in 0..sizes.linger_rounds {
            let mut order: Vec<usize> = (0..slots).collect();
            order.rotate_left(round % slots);
            for slot in order {
                let (label, kind, relay) = match FLOORS.get(slot) {
                    Some(&(label, kind, relay)) => (label, kind, relay),
                    None => {
                        let (label, env) = &lingers[slot - FLOORS.len()];
                        (label.as_str(), TriggerKind::Relay, Some(env.as_slice()))
                    }
                };
                let one = self.writer_run(&pg, clients, secs, kind, relay).await?;
                println!("  round {round}, {label:<25} {}", one.line());
                tps[slot].push(one.tps);
                cpu[slot].push(one.cpu.relay / one.cpu.wall);
            }
        }
        // Each slot against a reference, the median of the rounds' ratios.
        let ratio = |slot: usize, reference: usize| {
            median(
                tps[slot]
                    .iter()
                    .zip(&tps[reference])
                    .map(|(a, b)| a / b)
                    .collect(),
            )
        };
        for (slot, (label, ..)) in FLOORS.iter().enumerate() {
            println!(
                "  {label:<25} median {:.0} tps, {:.3} of no trigger and no relay; relay CPU {:.0}%",
                median(tps[slot].clone()),
                ratio(slot, 0),
                median(cpu[slot].clone()) * 100.0
            );
        }
        self.set_trigger(TriggerKind::Relay).await?;
        let stream = Sizes {
            latency_rate: STREAM_RATE,
            latency_commits: if sizes.smoke { 40 } else { 2000 },
            ..sizes.clone()
        };
        let mut rows = Vec::new();
        for (i, l) in sizes.lingers.iter().enumerate() {
            let slot = FLOORS.len() + i;
            let mut lat = Vec::new();
            for (tag, s) in [("l2", sizes), ("l1k", &stream)] {
                self.truncate().await?;
                let fga = self.fga();
                let relay = self
                    .start_relay(&fga, &[("FGA_RELAY_LINGER", l.as_str())])
                    .await?;
                let r = measure_latency(
                    &self.db,
                    &fga,
                    &format!("{tag}{i}"),
                    s,
                    Duration::from_secs(10),
                )
                .await?;
                self.stop_relay(relay, "linger latency", &[]).await;
                lat.push(r.relay);
            }
            let row = LingerRow {
                linger: l.clone(),
                writers: ratio(slot, BASE),
                bare: ratio(slot, 0),
                relay_cpu: median(cpu[slot].clone()),
                stream: lat.pop().unwrap_or_default(),
                at_200: lat.pop().unwrap_or_default(),
            };
            println!(
                "  linger {:<6} writers {:.3} of no trigger with a 1 s sweep, {:.3} of no trigger and no relay (relay CPU {:.0}%); latency at {}/s p50 {} / p99 {} ms; at {STREAM_RATE}/s p50 {} / p99 {} ms; load {}",
                row.linger,
                row.writers,
                row.bare,
                row.relay_cpu * 100.0,
                sizes.latency_rate,
                ms(row.at_200.p50),
                ms(row.at_200.p99),
                ms(row.stream.p50),
                ms(row.stream.p99),
                loadavg()
            );
            rows.push(row);
        }
        Ok(rows)
    }
}
