//! Scenario: burn-down and the claim's plan with a million delivered rows in the table, against
//! none.

use crate::args::Sizes;
use crate::burndown::{BurnDown, RowState};
use crate::harness::Bench;
use anyhow::Result;

impl Bench {
    pub(crate) async fn history(&self, sizes: &Sizes) -> Result<History> {
        // None delivered before: an empty table, then the backlog.
        self.empty_vacuumed().await?;
        let idle_none = self.explain_claim().await?;
        let none = self.burn(sizes.backlog, "hn").await?;
        // A million delivered rows before, as a relay leaves them behind.
        let fill_secs = self.fill("h", sizes.history, RowState::Delivered).await?;
        let size: String = self
            .admin
            .query_one(
                "SELECT pg_size_pretty(pg_total_relation_size('fga_outbox'))",
                &[],
            )
            .await?
            .get(0);
        let idle_full = self.explain_claim().await?;
        let full = self.burn(sizes.backlog, "hf").await?;
        // Right after it, the backlog's rows are delivered and their entries in the claim index
        // not yet vacuumed away (autovacuum looks once a minute): every pass walks past them.
        let idle_unvacuumed = self.explain_claim().await?;
        // Autovacuum may have run meanwhile: what the statistics say of the table then.
        let vacuum_state: String = self
            .admin
            .query_one(
                "SELECT format('n_dead_tup %s, autovacuums so far %s', n_dead_tup, \
                 autovacuum_count) FROM pg_stat_user_tables WHERE relname = 'fga_outbox'",
                &[],
            )
            .await?
            .get(0);
        println!(
            "backlog of {} rows, with no delivered row in the table vs. {} ({size}, filled and \
             vacuumed in {fill_secs:.1} s)",
            sizes.backlog, sizes.history
        );
        none.print("none delivered  ");
        full.print("with the history");
        println!(
            "  ratio: {:.2} (rows/s with the history / without)",
            full.rows_per_s() / none.rows_per_s()
        );
        println!("  the claim with nothing pending, no history:\n{idle_none}");
        println!(
            "  the claim with nothing pending, {} delivered rows:\n{idle_full}",
            sizes.history
        );
        println!(
            "  the claim with nothing pending, right after the burn-down (its {} rows not yet \
             vacuumed; {vacuum_state}):\n{idle_unvacuumed}",
            sizes.backlog
        );
        println!(
            "  the claim over the backlog, no history:\n{}",
            none.explain
        );
        println!(
            "  the claim over the backlog, {} delivered rows:\n{}",
            sizes.history, full.explain
        );
        Ok(History {
            none,
            full,
            idle_none,
            idle_full,
            idle_unvacuumed,
        })
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct History {
    pub(crate) none: BurnDown,
    pub(crate) full: BurnDown,
    pub(crate) idle_none: String,
    pub(crate) idle_full: String,
    /// The claim with nothing pending right after the burn-down over the history.
    pub(crate) idle_unvacuumed: String,
}
