//! `fga-relay status`: pending, dead and delivered counts, the oldest pending row's age, what
//! the statistics say of the table's vacuuming, and pending and dead rows per store (all of them
//! in `--json`, the few with the most pending rows in text).

use super::failure::Failure;
use super::open::{open_store, store_failure};
use crate::settings::DbArgs;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct Status {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON: {"pending","dead","delivered","oldest_pending_age_seconds",
    /// "dead_row_versions","last_vacuum_age_seconds","stores"} (the vacuum figures null when
    /// unknown; "stores": every store with rows not delivered, [{"store_id","pending","dead"}],
    /// the most pending first, "store_id" null for rows naming none).
    #[arg(long)]
    json: bool,
}

/// Stores the text output lists (the most pending rows first); `--json` lists every one.
const TEXT_STORES: usize = 5;

#[derive(serde::Serialize)]
struct Report {
    #[serde(flatten)]
    counts: crate::store::StatusCounts,
    stores: Vec<crate::store::StoreCounts>,
}

impl Status {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let store = open_store(&self.db.settings()?, "fga-relay status").await?;
        let counted = async { Ok((store.status().await?, store.status_stores().await?)) };
        let (s, stores) = match counted.await {
            Ok(counts) => counts,
            Err(e) => return Err(store_failure(&store, e).await),
        };
        if self.json {
            let report = Report { counts: s, stores };
            println!(
                "{}",
                serde_json::to_string(&report).expect("status always serialises")
            );
        } else {
            println!("pending    {}", s.pending);
            println!("dead       {}", s.dead);
            println!("delivered  {}", s.delivered);
            match s.oldest_pending_age_seconds {
                Some(age) => println!("oldest pending row: {age:.1}s old"),
                None => println!("oldest pending row: none"),
            }
            // What every claim walks past until VACUUM: worth a look when latency creeps up.
            let versions = s
                .dead_row_versions
                .map_or_else(|| "unknown".to_owned(), |n| n.to_string());
            let vacuumed = s
                .last_vacuum_age_seconds
                .map_or_else(|| "never".to_owned(), |age| format!("{age:.0}s ago"));
            println!("old row versions awaiting vacuum: {versions} (last vacuum: {vacuumed})");
            // Only rows naming no store: the one store there is, nothing to add.
            if stores.iter().any(|c| c.store_id.is_some()) {
                println!("by store ({} with rows not delivered):", stores.len());
                for c in stores.iter().take(TEXT_STORES) {
                    let id = c
                        .store_id
                        .as_deref()
                        .unwrap_or("(none named: configured store)");
                    println!("  {id}  pending {}, dead {}", c.pending, c.dead);
                }
                if stores.len() > TEXT_STORES {
                    println!(
                        "  … and {} more (fga-relay status --json lists them all)",
                        stores.len() - TEXT_STORES
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
