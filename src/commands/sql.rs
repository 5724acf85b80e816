//! `fga-relay sql`: the schema SQL, or the least-privilege roles, for the user's own migration tool.

use super::failure::Failure;
use crate::output;
use crate::schema;
use clap::Args;
use std::process::ExitCode;

/// `sql/roles.sql`: the writer and relay roles, printed by `fga-relay sql --roles`.
const ROLES_SQL: &str = include_str!("../../sql/roles.sql");

#[derive(Args, Debug)]
pub struct Sql {
    /// The outbox table's name [default: fga_outbox]; FGA_OUTBOX_TABLE, its former name, is
    /// still read.
    #[arg(long = "table", env = "FGA_RELAY_OUTBOX_TABLE")]
    table: Option<String>,
    /// Print the least-privilege roles instead (a writer role and a relay role), to run
    /// after `migrate`.
    #[arg(long)]
    roles: bool,
}

impl Sql {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let table = crate::settings::table(self.table.as_deref())?;
        if self.roles {
            output::text(schema::render(ROLES_SQL, &table));
        } else {
            output::text(schema::full_sql(&table));
        }
        Ok(ExitCode::SUCCESS)
    }
}
