//! `fga-relay status`: pending, dead and delivered counts, the oldest pending row's age, and
//! what the statistics say of the table's vacuuming.

use super::failure::Failure;
use super::open::open_store;
use crate::settings::DbArgs;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct Status {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON: {"pending","dead","delivered","oldest_pending_age_seconds",
    /// "dead_row_versions","last_vacuum_age_seconds"} (the last two null when unknown).
    #[arg(long)]
    json: bool,
}

impl Status {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let store = open_store(&self.db.settings()?, "fga-relay status").await?;
        let s = store.status().await?;
        if self.json {
            println!(
                "{}",
                serde_json::to_string(&s).expect("status always serialises")
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
        }
        Ok(ExitCode::SUCCESS)
    }
}
