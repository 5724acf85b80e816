//! Scenario: the linger's trade-off. For each `--linger`, what the relay's trigger costs 8
//! writers (pgbench, against no trigger in the same round) and the commit → OpenFGA latency at
//! 200 commits/s and under a steady stream of 1,000 commits/s from one writer.

use crate::args::Sizes;
use crate::common::fga::FakeFga;
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
    /// Median over rounds of writers' tps with the relay's trigger / without a trigger.
    pub(crate) writers: f64,
    pub(crate) relay_cpu: f64,
    pub(crate) at_200: Dist,
    pub(crate) stream: Dist,
}

impl Bench {
    pub(crate) async fn linger(&self, sizes: &Sizes) -> Result<Vec<LingerRow>> {
        let clients = sizes.pgbench_clients.iter().copied().max().unwrap_or(8);
        let secs = sizes.pgbench_seconds;
        let Some(pg) = self.pgbench_setup().await? else {
            return Ok(Vec::new());
        };
        println!(
            "--linger {}: {clients} pgbench clients, {secs} s a run, {} round(s) of no trigger and \
             the relay's trigger at each linger, back to back in rotating order",
            sizes.lingers.join(", "),
            sizes.linger_rounds
        );
        // Slot 0 is no trigger (the linger does not matter there: the relay sweeps every 100 ms).
        let slots = sizes.lingers.len() + 1;
        let mut tps: Vec<Vec<f64>> = vec![Vec::new(); slots];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); slots];
        for round in 0..sizes.linger_rounds {
            let mut order: Vec<usize> = (0..slots).collect();
            order.rotate_left(round % slots);
            for slot in order {
                let (kind, env, label) = match slot {
                    0 => (TriggerKind::None, vec![], "no trigger".to_owned()),
                    i => {
                        let l = sizes.lingers[i - 1].as_str();
                        (
                            TriggerKind::Relay,
                            vec![("FGA_RELAY_LINGER", l)],
                            format!("linger {l}"),
                        )
                    }
                };
                let one = self.writer_run(&pg, clients, secs, kind, &env).await?;
                println!("  round {round}, {label:<16} {}", one.line());
                tps[slot].push(one.tps);
                cpu[slot].push(one.cpu.relay / one.cpu.wall);
            }
        }
        self.set_trigger(TriggerKind::Relay).await?;
        let stream = Sizes {
            latency_rate: STREAM_RATE,
            latency_commits: if sizes.smoke { 40 } else { 2000 },
            ..sizes.clone()
        };
        let mut rows = Vec::new();
        for (i, l) in sizes.lingers.iter().enumerate() {
            let ratios: Vec<f64> = tps[i + 1].iter().zip(&tps[0]).map(|(a, b)| a / b).collect();
            let mut lat = Vec::new();
            for (tag, s) in [("l2", sizes), ("l1k", &stream)] {
                self.truncate().await?;
                let fga = FakeFga::start();
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
                writers: median(ratios),
                relay_cpu: median(cpu[i + 1].clone()),
                stream: lat.pop().unwrap_or_default(),
                at_200: lat.pop().unwrap_or_default(),
            };
            println!(
                "  linger {:<6} writers {:.3} of no trigger (relay CPU {:.0}%); latency at {}/s p50 {} / p99 {} ms; at {STREAM_RATE}/s p50 {} / p99 {} ms; load {}",
                row.linger,
                row.writers,
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
        println!(
            "  no trigger: median {:.0} tps, relay CPU {:.0}%",
            median(tps[0].clone()),
            median(cpu[0].clone()) * 100.0
        );
        Ok(rows)
    }
}
