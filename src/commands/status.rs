//! `fga-relay status`: pending, dead and delivered counts, the oldest pending row's age, what
//! the statistics say of the table's vacuuming, and pending and dead rows per store (all of them
//! in `--json`, the few with the most pending rows in text), and the newest dead rows with the
//! error that killed each and the commands that list and retry them.

use super::failure::Failure;
use super::lock_wait;
use super::open::{open_store, store_failure};
use crate::config::DbSettings;
use crate::output;
use crate::settings::DbArgs;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct Status {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON: {"pending","dead","delivered","oldest_pending_age_seconds",
    /// "dead_row_versions","last_vacuum_age_seconds","stores","newest_dead"} (the vacuum figures
    /// null when unknown; "stores": every store with rows not delivered,
    /// [{"store_id","pending","dead"}], the most pending first, "store_id" null for rows naming
    /// none; "dead_by_reason": dead rows by the error's words before its first colon, the ten
    /// most common, [{"reason","rows","newest_id"}]; "newest_dead": the five most recently dead
    /// rows, [{"id","last_error"}]).
    #[arg(long)]
    json: bool,
}

/// Stores the text output lists (the most pending rows first); `--json` lists every one.
const TEXT_STORES: usize = 5;

/// Kinds of failure shown, the most rows first.
const DEAD_REASONS: i64 = 10;

/// Dead rows shown, the most recently dead first: enough to see what is wrong; `retry --dead
/// --dry-run` lists them all.
const DEAD_SHOWN: i64 = 5;

#[derive(serde::Serialize)]
struct Report {
    #[serde(flatten)]
    counts: crate::store::StatusCounts,
    stores: Vec<crate::store::StoreCounts>,
    dead_by_reason: Vec<crate::store::DeadReason>,
    newest_dead: Vec<crate::store::DeadRow>,
}

impl Status {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let db = self.db.settings()?;
        let report = lock_wait::bounded("status", &db, report(&db)).await?;
        if self.json {
            output::line(format_args!(
                "{}",
                serde_json::to_string(&report).expect("status always serialises")
            ));
        } else {
            report.print();
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// What `status` says, read from the table.
async fn report(db: &DbSettings) -> Result<Report, Failure> {
    let store = open_store(db, "fga-relay status").await?;
    let counted = async {
        let counts = store.status().await?;
        let stores = store.status_stores().await?;
        let (dead_by_reason, newest_dead) = if counts.dead > 0 {
            (
                store.dead_reasons(DEAD_REASONS).await?,
                store.dead_newest(Default::default(), DEAD_SHOWN).await?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Report {
            counts,
            stores,
            dead_by_reason,
            newest_dead,
        })
    };
    match counted.await {
        Ok(report) => Ok(report),
        Err(e) => Err(store_failure(&store, e).await),
    }
}

impl Report {
    /// The text output.
    fn print(&self) {
        let s = &self.counts;
        output::line(format_args!("pending    {}", s.pending));
        output::line(format_args!("dead       {}", s.dead));
        self.print_dead();
        output::line(format_args!("delivered  {}", s.delivered));
        match s.oldest_pending_age_seconds {
            Some(age) => output::line(format_args!("oldest pending row: {age:.1}s old")),
            None => output::line("oldest pending row: none"),
        }
        // What every claim walks past until VACUUM: worth a look when latency creeps up.
        let versions = s
            .dead_row_versions
            .map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        let vacuumed = s
            .last_vacuum_age_seconds
            .map_or_else(|| "never".to_owned(), |age| format!("{age:.0}s ago"));
        output::line(format_args!(
            "old row versions awaiting vacuum: {versions} (last vacuum: {vacuumed})"
        ));
        self.print_stores();
    }

    /// The dead rows by reason, and the newest, with what to do about them.
    fn print_dead(&self) {
        if !self.dead_by_reason.is_empty() {
            output::line("  by reason (the error's first words):");
            for r in &self.dead_by_reason {
                output::line(format_args!(
                    "    {:>6}  {} (newest: row {})",
                    r.rows, r.reason, r.newest_id
                ));
            }
        }
        if !self.newest_dead.is_empty() {
            output::line("  the newest dead rows, with the error that killed each:");
            for row in &self.newest_dead {
                output::line(format_args!(
                    "    row {}: {}",
                    row.id,
                    row.last_error.as_deref().unwrap_or("(no error recorded)")
                ));
            }
            output::line(
                "  list them all, with what a retry would replay: fga-relay retry --dead \
                 --dry-run; send them back to pending: fga-relay retry --dead (or ID...)",
            );
        }
    }

    /// The stores with the most rows not delivered, when rows name stores (with only rows
    /// naming none, there is one store, and nothing to add).
    fn print_stores(&self) {
        let stores = &self.stores;
        if !stores.iter().any(|c| c.store_id.is_some()) {
            return;
        }
        output::line(format_args!(
            "by store ({} with rows not delivered):",
            stores.len()
        ));
        for c in stores.iter().take(TEXT_STORES) {
            let id = c
                .store_id
                .as_deref()
                .unwrap_or("(none named: configured store)");
            output::line(format_args!(
                "  {id}  pending {}, dead {}",
                c.pending, c.dead
            ));
        }
        if stores.len() > TEXT_STORES {
            output::line(format_args!(
                "  … and {} more (fga-relay status --json lists them all)",
                stores.len() - TEXT_STORES
            ));
        }
    }
}
