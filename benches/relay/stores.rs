//! Scenario: one relay for many OpenFGA stores. The same burn-down twice: every row naming one
//! store, then the rows spread over many stores (row `g` names store `g % stores`), each row of
//! 2 tuples. A Write carries one store's rows, so spread rows make smaller Writes: the figures
//! are the tuples/s of each, their ratio, and the Writes each row took.

use crate::args::Sizes;
use crate::burndown::BurnDown;
use crate::harness::Bench;
use anyhow::Result;

pub(crate) struct StoresResult {
    pub(crate) stores: usize,
    pub(crate) one: BurnDown,
    pub(crate) spread: BurnDown,
}

impl StoresResult {
    /// Tuples/s spread over the stores, as a share of tuples/s in one store.
    pub(crate) fn ratio(&self) -> f64 {
        self.spread.tuples_per_s() / self.one.tuples_per_s()
    }
}

/// Writes per row of a burn-down.
pub(crate) fn writes_per_row(b: &BurnDown) -> f64 {
    b.writes as f64 / b.rows.max(1) as f64
}

impl Bench {
    pub(crate) async fn stores(&self, sizes: &Sizes) -> Result<StoresResult> {
        let fga = self.fga();
        let ids: Vec<String> = (0..sizes.stores).map(|_| fga.add_store()).collect();
        let n = sizes.stores_backlog;
        println!(
            "{n} rows of 2 tuples, in one store, then spread over {} stores (each made with \
             the same model on one OpenFGA)",
            ids.len()
        );
        self.truncate().await?;
        let one = self.burn_in(n, "so", &fga, &[], &ids[..1]).await?;
        one.print("one store");
        self.truncate().await?;
        let spread = self.burn_in(n, "sm", &fga, &[], &ids).await?;
        spread.print(&format!("{} stores", ids.len()));
        let r = StoresResult {
            stores: ids.len(),
            one,
            spread,
        };
        println!(
            "  spread / one store: {:.3} of the tuples/s; Writes per row {:.3} (one store) vs \
             {:.3} ({} stores)",
            r.ratio(),
            writes_per_row(&r.one),
            writes_per_row(&r.spread),
            r.stores
        );
        Ok(r)
    }
}
