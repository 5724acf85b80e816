//! The outbox schema: the SQL files in `sql/schema/`, embedded, and `migrate`.
//!
//! The files name the table `fga_outbox`; [`render`] substitutes the configured name, which also
//! renames the objects derived from it (`fga_outbox_notify`, `fga_outbox_pending_idx`, …) and the
//! NOTIFY channel.

use crate::config::TableName;
use tokio_postgres::Client;

/// The schema files, in the order they run.
pub const FILES: &[(&str, &str)] = &[
    (
        "0001_outbox.sql",
        include_str!("../sql/schema/0001_outbox.sql"),
    ),
    (
        "0002_wakeup.sql",
        include_str!("../sql/schema/0002_wakeup.sql"),
    ),
    (
        "0003_leader.sql",
        include_str!("../sql/schema/0003_leader.sql"),
    ),
    (
        "0004_lease.sql",
        include_str!("../sql/schema/0004_lease.sql"),
    ),
    ("0005_wait.sql", include_str!("../sql/schema/0005_wait.sql")),
    (
        "0006_claim_index.sql",
        include_str!("../sql/schema/0006_claim_index.sql"),
    ),
    (
        "0007_autovacuum.sql",
        include_str!("../sql/schema/0007_autovacuum.sql"),
    ),
    (
        "0008_retried.sql",
        include_str!("../sql/schema/0008_retried.sql"),
    ),
    (
        "0009_store_index.sql",
        include_str!("../sql/schema/0009_store_index.sql"),
    ),
    (
        "0010_unnamed_index.sql",
        include_str!("../sql/schema/0010_unnamed_index.sql"),
    ),
    (
        "0011_retried_index.sql",
        include_str!("../sql/schema/0011_retried_index.sql"),
    ),
];

/// The schema's version: the number of its parts. `migrate` records it in
/// `fga_outbox_schema_version()`, so that `check` and `migrate --check` can tell a schema an
/// older fga-relay made (which lacks later parts) from a current one.
pub const VERSION: i32 = FILES.len() as i32;

/// Records [`VERSION`], never lowering it: an older binary's `migrate` run after a newer one's
/// leaves the newer version recorded (its parts stay; every part only adds).
fn version_sql() -> String {
    format!(
        "-- The schema's version (its number of parts), for `fga-relay check` and \
         `fga-relay migrate --check`.\n\
         DO $$\n\
         BEGIN\n\
         \x20   IF to_regprocedure('fga_outbox_schema_version()') IS NULL THEN\n\
         \x20       CREATE FUNCTION fga_outbox_schema_version() RETURNS integer\n\
         \x20           LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT {VERSION}';\n\
         \x20   ELSIF fga_outbox_schema_version() < {VERSION} THEN\n\
         \x20       CREATE OR REPLACE FUNCTION fga_outbox_schema_version() RETURNS integer\n\
         \x20           LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT {VERSION}';\n\
         \x20   END IF;\n\
         END\n\
         $$;\n"
    )
}

/// The name the SQL files use for the table.
const PLACEHOLDER: &str = "fga_outbox";

/// First key of the advisory lock `migrate` holds; the second is derived from the table name.
const MIGRATE_LOCK_CLASS: i32 = 1_718_051_120;
/// First key of the lock a relay holds while it waits for a notification (see 0002_wakeup.sql).
pub const WAKE_LOCK_CLASS: i32 = 1_718_051_121;
/// First key of the lock the delivering relay holds (see 0003_leader.sql).
pub const LEADER_LOCK_CLASS: i32 = 1_718_051_122;

/// A SQL text with the table name substituted.
pub fn render(sql: &str, table: &TableName) -> String {
    if table.as_str() == PLACEHOLDER {
        sql.to_owned()
    } else {
        sql.replace(PLACEHOLDER, table.as_str())
    }
}

/// The whole schema, as `fga-relay sql` prints it.
pub fn full_sql(table: &TableName) -> String {
    let mut out = String::new();
    for (name, sql) in FILES {
        out.push_str(&format!("-- ==== {name} ====\n"));
        out.push_str(&render(sql, table));
        out.push('\n');
    }
    out.push_str("-- ==== version ====\n");
    out.push_str(&render(&version_sql(), table));
    out
}

/// Creates or upgrades the schema in one transaction, serialised with any concurrent `migrate`
/// by an advisory lock, keeping every existing row.
pub async fn migrate(client: &mut Client, table: &TableName) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&MIGRATE_LOCK_CLASS, &table.as_str()],
    )
    .await?;
    for (_, sql) in FILES {
        tx.batch_execute(&render(sql, table)).await?;
    }
    tx.batch_execute(&render(&version_sql(), table)).await?;
    tx.commit().await
}

/// The schema version `migrate` recorded; None when none is (a schema older than the record,
/// or made by hand).
pub async fn recorded_version(
    client: &Client,
    table: &TableName,
) -> Result<Option<i32>, tokio_postgres::Error> {
    let function = format!("{table}_schema_version");
    let exists: bool = client
        .query_one(
            "SELECT to_regprocedure($1 || '()') IS NOT NULL",
            &[&function],
        )
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    // The name is a checked identifier (TableName), so it can be put in the statement.
    let row = client
        .query_one(&format!("SELECT {function}()"), &[])
        .await?;
    Ok(row.try_get(0).ok())
}

/// What `migrate` would change, in words; empty when the schema is current. Reads only: what
/// the relay role may see is enough. A column of the wrong type is an error, as for `migrate`:
/// it keeps an adopted table's columns as they are, so no `migrate` can fix it.
pub async fn pending_changes(
    client: &Client,
    table: &TableName,
) -> Result<Vec<String>, SchemaProblem> {
    Ok(changes(client, table)
        .await?
        .iter()
        .map(|c| c.would(table))
        .collect())
}

/// One thing `migrate` would change, or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// No table: every part is applied.
    CreateTable,
    AddColumn(String),
    CreateLeaderTable,
    InstallTrigger,
    /// A schema an older fga-relay made, with this version recorded: the later parts are new.
    Upgrade {
        from: i32,
    },
    /// No version recorded (a schema older than the record, or a table adopted): every part is
    /// applied where what it makes is missing.
    RecordVersion,
}

impl Change {
    /// What `migrate` would do, for `migrate --check` and `check`.
    pub fn would(&self, table: &TableName) -> String {
        match self {
            Change::CreateTable => format!("table {table} does not exist"),
            Change::AddColumn(column) => format!("table {table} has no column {column}"),
            Change::CreateLeaderTable => format!("table {table}_leader does not exist"),
            Change::InstallTrigger => format!("install the trigger {table}_notify"),
            Change::Upgrade { from } => {
                format!("upgrade the schema from version {from} to {VERSION}")
            }
            Change::RecordVersion => {
                format!("record schema version {VERSION} (none is recorded)")
            }
        }
    }

    /// What `migrate` did, once it has.
    pub fn did(&self, table: &TableName) -> String {
        match self {
            Change::CreateTable => format!(
                "created table {table} with every part of the schema ({})",
                part_names(0)
            ),
            Change::AddColumn(column) => {
                format!("added the missing columns of {table} ({column} among them)")
            }
            Change::CreateLeaderTable => format!("created table {table}_leader"),
            Change::InstallTrigger => format!("installed the trigger {table}_notify"),
            Change::Upgrade { from } => format!(
                "upgraded the schema from version {from} to {VERSION}: applied {}",
                part_names(*from)
            ),
            Change::RecordVersion => format!(
                "recorded schema version {VERSION} (none was recorded: every part was applied \
                 where what it makes was missing, keeping the table's rows)"
            ),
        }
    }
}

/// The names of the parts after the first `done`, without `.sql`.
fn part_names(done: i32) -> String {
    FILES
        .iter()
        .skip(done.max(0) as usize)
        .map(|(name, _)| name.trim_end_matches(".sql"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `migrate` would change; empty when the schema is current. As [`pending_changes`].
pub async fn changes(client: &Client, table: &TableName) -> Result<Vec<Change>, SchemaProblem> {
    let mut changes = Vec::new();
    let mut table_exists = true;
    match check(client, table).await {
        Ok(info) if !info.trigger => changes.push(Change::InstallTrigger),
        Ok(_) => {}
        Err(e @ (SchemaProblem::Db(_) | SchemaProblem::ColumnType { .. })) => return Err(e),
        Err(SchemaProblem::MissingTable(_)) => {
            table_exists = false;
            changes.push(Change::CreateTable);
        }
        Err(SchemaProblem::MissingColumn { column, .. }) => changes.push(Change::AddColumn(column)),
        Err(SchemaProblem::MissingLeaderTable(_)) => changes.push(Change::CreateLeaderTable),
    }
    match recorded_version(client, table).await? {
        Some(v) if v >= VERSION => {}
        Some(v) => changes.push(Change::Upgrade { from: v }),
        // Creating the table records the version: one change says both.
        None if !table_exists => {}
        None => changes.push(Change::RecordVersion),
    }
    Ok(changes)
}

/// [`migrate`], saying what it changed: [`changes`] looked at under the lock `migrate` takes
/// (held for the session meanwhile; `migrate`'s own is then granted at once), so that of two
/// concurrent runs the first says what it did and the second that nothing was left to do. A
/// column of the wrong type is left for [`check`] to report after `migrate`, as before.
pub async fn migrate_saying(
    client: &mut Client,
    table: &TableName,
) -> Result<Vec<Change>, SchemaProblem> {
    let try_lock = "SELECT pg_try_advisory_lock($1, hashtext($2))";
    let got: bool = client
        .query_one(try_lock, &[&MIGRATE_LOCK_CLASS, &table.as_str()])
        .await?
        .try_get(0)?;
    if !got {
        // Another migrate of this table is under way: this one waits for it as long as it takes
        // (it may be building an index on a large table), since it would only fail what
        // succeeds once the other ends; but it says so, rather than wait without a word. The
        // session's lock_timeout bounds every other wait, and is put back after this one.
        tracing::warn!(
            table = %table,
            "another `fga-relay migrate` of this table is under way: waiting for it to finish \
             (pg_locks lists the session holding it: locktype advisory, classid {MIGRATE_LOCK_CLASS}); \
             interrupt this one to stop waiting"
        );
        let before: String = client
            .query_one("SELECT current_setting('lock_timeout')", &[])
            .await?
            .try_get(0)?;
        client
            .execute("SELECT set_config('lock_timeout', '0', false)", &[])
            .await?;
        let lock = "SELECT pg_advisory_lock($1, hashtext($2))";
        client
            .execute(lock, &[&MIGRATE_LOCK_CLASS, &table.as_str()])
            .await?;
        client
            .execute("SELECT set_config('lock_timeout', $1, false)", &[&before])
            .await?;
    }
    let done = async {
        let found = match changes(client, table).await {
            Ok(found) => found,
            Err(SchemaProblem::ColumnType { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        migrate(client, table).await?;
        Ok(found)
    }
    .await;
    let unlock = "SELECT pg_advisory_unlock($1, hashtext($2))";
    // Ended with the session anyway: the command ends after this.
    let _ = client
        .execute(unlock, &[&MIGRATE_LOCK_CLASS, &table.as_str()])
        .await;
    done
}

/// What is missing from the database for the relay to run.
#[derive(Debug, thiserror::Error)]
pub enum SchemaProblem {
    #[error("table {0} does not exist: run `fga-relay migrate`")]
    MissingTable(String),
    #[error("table {table} has no column {column}: run `fga-relay migrate`")]
    MissingColumn { table: String, column: String },
    #[error("table {0} does not exist: run `fga-relay migrate`")]
    MissingLeaderTable(String),
    #[error(
        "column {table}.{column} is {found}, and the relay reads it as {expected}: \
         ALTER TABLE {table} ALTER COLUMN {column} TYPE {expected} (which rewrites the table)"
    )]
    ColumnType {
        table: String,
        column: String,
        found: String,
        expected: &'static str,
    },
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
}

/// The columns the relay reads and writes, with the types it can read each as (the first is
/// the one `migrate` creates). NULL is allowed where an adopted table allows it: the relay reads
/// `created_at` and `attempts` through `coalesce`.
const COLUMNS: [(&str, &[&str]); 8] = [
    ("id", &["bigint"]),
    ("payload", &["jsonb"]),
    ("created_at", &["timestamp with time zone"]),
    ("processed_at", &["timestamp with time zone"]),
    ("attempts", &["integer"]),
    ("last_error", &["text", "character varying"]),
    ("failed_at", &["timestamp with time zone"]),
    ("retried_at", &["timestamp with time zone"]),
];

/// Checks that `migrate` has run; returns the table's oid (the second key of its advisory locks)
/// and whether the wake-up trigger is installed.
pub async fn check(client: &Client, table: &TableName) -> Result<TableInfo, SchemaProblem> {
    let row = client
        .query_one(
            "SELECT to_regclass($1)::oid::integer AS oid, to_regclass($2) IS NOT NULL AS leader, \
             (SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE c.oid = to_regclass($1)) AS schema",
            &[&table.as_str(), &format!("{table}_leader")],
        )
        .await?;
    let oid: Option<i32> = row.get("oid");
    let (Some(oid), Some(schema)) = (oid, row.get::<_, Option<String>>("schema")) else {
        return Err(SchemaProblem::MissingTable(table.to_string()));
    };
    let columns: Vec<(String, String)> = client
        .query(
            "SELECT attname::text, format_type(atttypid, NULL) FROM pg_attribute \
             WHERE attrelid = $1::integer::oid AND attnum > 0 AND NOT attisdropped",
            &[&oid],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // `migrate` adopts a table that exists as it is (an application's own outbox); a column of
    // another type would fail every pass, with the relay up and leading.
    for (column, types) in COLUMNS {
        let Some((_, found)) = columns.iter().find(|(c, _)| c == column) else {
            return Err(SchemaProblem::MissingColumn {
                table: table.to_string(),
                column: column.to_owned(),
            });
        };
        if !types.contains(&found.as_str()) {
            return Err(SchemaProblem::ColumnType {
                table: table.to_string(),
                column: column.to_owned(),
                found: found.clone(),
                expected: types[0],
            });
        }
    }
    if !row.get::<_, bool>("leader") {
        return Err(SchemaProblem::MissingLeaderTable(format!("{table}_leader")));
    }
    let trigger = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::integer::oid \
             AND tgname = $2 AND tgenabled <> 'D')",
            &[&oid, &format!("{table}_notify")],
        )
        .await?
        .get(0);
    Ok(TableInfo {
        oid,
        trigger,
        schema,
    })
}

/// What [`check`] found.
#[derive(Clone, Debug)]
pub struct TableInfo {
    /// The table's oid as an integer: the second key of the relay's advisory locks.
    pub oid: i32,
    /// Whether the wake-up trigger is installed and enabled.
    pub trigger: bool,
    /// The schema the connection's `search_path` found it in.
    pub schema: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_renames_the_table_and_everything_derived_from_it() {
        let t = TableName::parse("acl_outbox").unwrap();
        let sql = full_sql(&t);
        assert!(!sql.contains("fga_outbox"));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS acl_outbox ("));
        assert!(sql.contains("acl_outbox_pending_idx"));
        assert!(sql.contains("pg_notify('acl_outbox', TG_RELID::text)"));
        assert!(sql.contains("acl_outbox_leader"));
        assert!(sql.contains("acl_outbox_claim_idx"));
        assert!(sql.contains("acl_outbox_store_idx"));
        assert!(sql.contains("acl_outbox_unnamed_idx"));
        assert!(sql.contains("acl_outbox_retried_idx"));
        assert!(sql.contains("FUNCTION acl_outbox_wait(ids bigint[]"));
        assert!(sql.contains("FUNCTION acl_outbox_schema_version()"));
        assert!(sql.contains(&format!("AS 'SELECT {VERSION}'")));
    }
}
