//! `fga-relay retry`: sends dead rows back to pending.

use super::failure::Failure;
use super::open::open_store;
use crate::settings::DbArgs;
use clap::Args;
use std::process::ExitCode;
use tracing::{info, warn};

#[derive(Args, Debug)]
pub struct Retry {
    #[command(flatten)]
    db: DbArgs,
    /// Every dead row.
    #[arg(long, conflicts_with = "ids")]
    dead: bool,
    /// These rows (ids).
    #[arg(required_unless_present = "dead")]
    ids: Vec<i64>,
}

impl Retry {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let Retry { db, dead, ids } = self;
        let store = open_store(&db.settings()?, "fga-relay retry").await?;
        let sent = store.retry((!dead).then_some(ids.as_slice())).await?;
        for (id, last_error) in &sent {
            info!(
                id,
                last_error = last_error.as_deref().unwrap_or(""),
                "dead row sent back to pending"
            );
        }
        if !dead {
            for id in ids.iter().filter(|id| !sent.iter().any(|(s, _)| s == *id)) {
                warn!(id, "not a dead row: left as it is");
            }
        }
        println!("{} row(s) sent back to pending", sent.len());
        Ok(ExitCode::SUCCESS)
    }
}
