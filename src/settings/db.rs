//! Where the outbox is: `--database-url` and `--table`.

use super::{DEFAULT_TABLE, or_default};
use crate::config::{ConfigError, DbSettings, Secret, TableName};
use clap::Args;

/// Where the outbox is.
#[derive(Args, Debug)]
pub struct DbArgs {
    /// PostgreSQL connection string (URL or key=value); sslmode as usual.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// The outbox table's name (also the NOTIFY channel).
    #[arg(long = "table", env = "FGA_OUTBOX_TABLE", default_value = DEFAULT_TABLE)]
    pub table: String,
}

impl DbArgs {
    pub fn settings(&self) -> Result<DbSettings, ConfigError> {
        let url = self
            .database_url
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| ConfigError::new("--database-url (DATABASE_URL)", "is required"))?;
        Ok(DbSettings {
            url: Secret::new(url),
            table: TableName::parse(or_default(&self.table, DEFAULT_TABLE))?,
        })
    }
}
