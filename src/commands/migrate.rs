//! `fga-relay migrate`: creates the outbox schema or upgrades it, keeping every row.

use super::failure::Failure;
use crate::schema;
use crate::settings::DbArgs;
use clap::Args;
use std::process::ExitCode;
use tracing::info;

#[derive(Args, Debug)]
pub struct Migrate {
    #[command(flatten)]
    db: DbArgs,
    /// Change nothing: exit 0 when the schema is current, 1 when `migrate` would change
    /// something (listed), for deploy gates.
    #[arg(long)]
    check: bool,
}

impl Migrate {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let db = self.db.settings()?;
        let cfg = crate::db::pg_config(&db, "fga-relay migrate")?;
        let (mut client, conn) = crate::db::connect_dedicated(&cfg).await.map_err(|e| {
            anyhow::anyhow!("cannot connect: {}", crate::db::hint::explain(&e, &cfg))
        })?;
        let driver = tokio::spawn(conn);
        if self.check {
            let changes = schema::pending_changes(&client, &db.table).await?;
            drop(client);
            let _ = driver.await;
            if changes.is_empty() {
                println!("schema is current (version {})", schema::VERSION);
                return Ok(ExitCode::SUCCESS);
            }
            println!("migrate would:");
            for change in changes {
                println!("  {change}");
            }
            return Ok(ExitCode::from(1));
        }
        schema::migrate(&mut client, &db.table)
            .await
            .map_err(|e| anyhow::anyhow!("migrate failed: {}", crate::db::describe(&e)))?;
        // A table that was there already is kept as it is: say now if the relay cannot use it.
        schema::check(&client, &db.table).await?;
        drop(client);
        let _ = driver.await;
        info!(table = %db.table, "schema is up to date");
        Ok(ExitCode::SUCCESS)
    }
}
