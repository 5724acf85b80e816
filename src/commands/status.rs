//! `fga-relay status`: pending, dead and delivered counts, and the oldest pending row's age.

use super::failure::Failure;
use super::open::open_store;
use crate::settings::DbArgs;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct Status {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON: {"pending","dead","delivered","oldest_pending_age_seconds"}.
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
        }
        Ok(ExitCode::SUCCESS)
    }
}
