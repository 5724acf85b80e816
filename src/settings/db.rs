//! Where the outbox is: `--database-url` and `--table`.

use super::DEFAULT_TABLE;
use super::renamed::TABLE;
use super::secret_file::SecretSource;
use crate::config::{ConfigError, DbSettings, Secret, TableName};
use clap::Args;

/// Where the outbox is.
#[derive(Args, Debug)]
pub struct DbArgs {
    /// PostgreSQL connection string (URL or key=value); sslmode as usual. What it leaves out
    /// comes from PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, ... and
    /// ~/.pgpass (PGPASSFILE), as for psql; without it they say it all.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// A file holding the connection string (a Docker or Kubernetes secret), instead of
    /// --database-url; or the systemd credential `database-url`.
    #[arg(long, env = "DATABASE_URL_FILE")]
    pub database_url_file: Option<String>,
    /// The outbox table's name (also the NOTIFY channel) [default: fga_outbox]; FGA_OUTBOX_TABLE,
    /// its former name, is still read.
    #[arg(long = "table", env = "FGA_RELAY_OUTBOX_TABLE")]
    pub table: Option<String>,
}

impl DbArgs {
    pub fn settings(&self) -> Result<DbSettings, ConfigError> {
        let url = DATABASE_URL
            .resolve(
                self.database_url.as_deref(),
                self.database_url_file.as_deref(),
            )?
            .filter(|s| !s.trim().is_empty());
        Ok(DbSettings {
            url: url.map(Secret::new),
            table: table(self.table.as_deref())?,
        })
    }

    /// The connection string's file (a `_FILE` or a systemd credential), if it is read from one.
    pub fn secret_file(&self) -> Option<String> {
        DATABASE_URL.file_origin(
            self.database_url.as_deref(),
            self.database_url_file.as_deref(),
        )
    }
}

/// The connection string's sources.
const DATABASE_URL: SecretSource<'static> = SecretSource {
    setting: "--database-url (DATABASE_URL)",
    file_setting: "--database-url-file (DATABASE_URL_FILE)",
    credential: "database-url",
};

/// The outbox table: `--table`, `FGA_RELAY_OUTBOX_TABLE`, the former `FGA_OUTBOX_TABLE`, or
/// `fga_outbox`.
pub(crate) fn table(given: Option<&str>) -> Result<TableName, ConfigError> {
    let found = TABLE.resolve(given)?;
    TableName::parse_setting(
        &found.setting,
        found.value.as_deref().unwrap_or(DEFAULT_TABLE),
    )
}
