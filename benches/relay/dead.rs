//! Scenario: latency and burn-down with a pile of dead rows in front of the backlog, against a
//! clean table. Dead rows keep `processed_at` NULL; the claim must not walk past them on every
//! pass.

use crate::args::Sizes;
use crate::burndown::{BurnDown, RowState};
use crate::harness::Bench;
use crate::latency::{LatencyResult, measure_latency};
use crate::stats::median;
use anyhow::Result;
use std::time::Duration;

#[derive(Clone, Debug, Default)]
pub(crate) struct DeadPile {
    pub(crate) dead: usize,
    pub(crate) clean_latency: LatencyResult,
    pub(crate) dead_latency: LatencyResult,
    pub(crate) clean: BurnDown,
    pub(crate) with_dead: BurnDown,
    /// Burn-down with the pile / clean, a pair of burn-downs a round (the first is the pair
    /// above), and their median: single burn-downs move by ±20% on a shared 2-core machine.
    pub(crate) burn_ratios: Vec<f64>,
    pub(crate) burn_ratio: f64,
    pub(crate) explain_clean: String,
    pub(crate) explain_dead: String,
}

impl Bench {
    /// Latency of single-row commits, then a burn-down, on the table as it is.
    async fn latency_and_burn(
        &self,
        sizes: &Sizes,
        tag: &str,
    ) -> Result<(LatencyResult, BurnDown)> {
        let fga = self.fga();
        let relay = self.start_relay(&fga, &[]).await?;
        let lat = measure_latency(&self.db, &fga, tag, sizes, Duration::from_secs(10)).await?;
        self.stop_relay(relay, "dead rows", &[]).await;
        let burn = self.burn(sizes.backlog, &format!("{tag}b")).await?;
        Ok((lat, burn))
    }

    pub(crate) async fn dead(&self, sizes: &Sizes) -> Result<DeadPile> {
        self.empty_vacuumed().await?;
        let (clean_latency, clean) = self.latency_and_burn(sizes, "dc").await?;
        let explain_clean = clean.explain.clone();
        let fill = self.fill("dd", sizes.dead, RowState::Dead).await?;
        let (dead_latency, with_dead) = self.latency_and_burn(sizes, "dp").await?;
        let explain_dead = with_dead.explain.clone();
        let mut burn_ratios = vec![with_dead.rows_per_s() / clean.rows_per_s()];
        for round in 1..sizes.dead_rounds {
            self.empty_vacuumed().await?;
            let clean = self.burn(sizes.backlog, &format!("dc{round}")).await?;
            self.fill(&format!("dd{round}"), sizes.dead, RowState::Dead)
                .await?;
            let with_dead = self.burn(sizes.backlog, &format!("dp{round}")).await?;
            burn_ratios.push(with_dead.rows_per_s() / clean.rows_per_s());
        }
        let burn_ratio = median(burn_ratios.clone());
        println!(
            "clean table vs {} dead rows in front (filled and vacuumed in {fill:.1} s)",
            sizes.dead
        );
        println!("  latency, clean:     {}", clean_latency.relay.line());
        println!("  latency, dead rows: {}", dead_latency.relay.line());
        clean.print("burn-down, clean    ");
        with_dead.print("burn-down, dead rows");
        println!(
            "  ratios (dead rows / clean): latency p50 {:.2}, p99 {:.2}; burn-down {burn_ratio:.2} \
             (median of {} round(s): {burn_ratios:.2?})",
            dead_latency.relay.p50 / clean_latency.relay.p50,
            dead_latency.relay.p99 / clean_latency.relay.p99,
            burn_ratios.len()
        );
        println!("  the claim over the backlog, clean:\n{explain_clean}");
        println!(
            "  the claim over the backlog, {} dead rows:\n{explain_dead}",
            sizes.dead
        );
        Ok(DeadPile {
            dead: sizes.dead,
            clean_latency,
            dead_latency,
            clean,
            with_dead,
            burn_ratios,
            burn_ratio,
            explain_clean,
            explain_dead,
        })
    }
}
