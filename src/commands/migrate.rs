//! `fga-relay migrate`: creates the outbox schema or upgrades it, keeping every row.

use super::failure::Failure;
use super::lock_wait;
use crate::config::DbSettings;
use crate::output;
use crate::schema::{self, SchemaProblem};
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
        lock_wait::bounded("migrate", &db, self.migrate(&db)).await
    }

    async fn migrate(self, db: &DbSettings) -> Result<ExitCode, Failure> {
        let cfg = crate::db::pg_config(db, "fga-relay migrate")?;
        let (mut client, conn) = crate::db::connect_dedicated(&cfg).await.map_err(|e| {
            anyhow::anyhow!("cannot connect: {}", crate::db::hint::explain(&e, &cfg))
        })?;
        let driver = tokio::spawn(conn);
        crate::db::bound_lock_waits(&client).await.map_err(|e| {
            anyhow::anyhow!("cannot set up the session: {}", crate::db::describe(&e))
        })?;
        if self.check {
            let changes = schema::pending_changes(&client, &db.table).await?;
            drop(client);
            let _ = driver.await;
            if changes.is_empty() {
                output::line(format_args!(
                    "schema is current (version {})",
                    schema::VERSION
                ));
                return Ok(ExitCode::SUCCESS);
            }
            output::line("migrate would:");
            for change in changes {
                output::line(format_args!("  {change}"));
            }
            return Ok(ExitCode::from(1));
        }
        let done = match schema::migrate_saying(&mut client, &db.table).await {
            Ok(done) => done,
            Err(SchemaProblem::Db(e)) if crate::db::is_lock_wait(&e) => {
                return Err(Failure::lock_wait(&e));
            }
            Err(SchemaProblem::Db(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
            {
                return Err(anyhow::anyhow!(
                    "migrate failed: {}: migrate creates and alters the table, its indexes, \
                     triggers and functions, which only their owner may (not the relay's role, \
                     by design): {}",
                    crate::db::describe(&e),
                    super::open::run_as_owner(&client, &db.table, "migrate").await
                )
                .into());
            }
            Err(SchemaProblem::Db(e)) => {
                return Err(anyhow::anyhow!("migrate failed: {}", crate::db::describe(&e)).into());
            }
            Err(other) => return Err(other.into()),
        };
        // A table that was there already is kept as it is: say now if the relay cannot use it.
        schema::check(&client, &db.table).await?;
        drop(client);
        let _ = driver.await;
        if done.is_empty() {
            output::line(format_args!(
                "schema is current (version {}): nothing to change in {}",
                schema::VERSION,
                db.table
            ));
        } else {
            output::line(format_args!(
                "migrated {} to schema version {}:",
                db.table,
                schema::VERSION
            ));
            for change in &done {
                output::line(format_args!("  {}", change.did(&db.table)));
            }
        }
        info!(table = %db.table, changes = done.len(), "schema is up to date");
        Ok(ExitCode::SUCCESS)
    }
}
