//! `fga-relay retry`: sends dead rows back to pending, or (`--dry-run`) lists what the relay would
//! replay of them and what it would skip.
//!
//! A dead row comes back after rows that may have been delivered meanwhile. The relay never
//! applies one of its operations over a later row's operation on the same tuple: when it first
//! reads a row that came back (the schema's trigger sets `retried_at` whatever brings it back),
//! it skips the operations whose tuple a later delivered row touches (see
//! `sql/queries/superseded.sql`), logs each, and records them in the row's `last_error`.
//! `--dry-run` runs the same query now, with the configured store as `run` has it
//! (`--store-id`, `FGA_STORE_ID`); the relay's own look, when it sends the row, also sees the
//! rows delivered in between.
//!
//! Exit status: 1 when an id given was left as it is (each said on its own line, why), so that a
//! script running `retry 123` can tell that nothing was done; `--dry-run` exits as the retry
//! would.

use super::failure::Failure;
use super::lock_wait;
use super::open::{open_store, store_failure};
use crate::config::{ConfigError, DbSettings};
use crate::output;
use crate::payload::{Op, Payload, TupleKey, store_filter};
use crate::settings::DbArgs;
use crate::store::{RowState, Store, StoreError};
use clap::Args;
use std::process::ExitCode;
use tracing::info;

#[derive(Args, Debug)]
// Shown by clap's errors too, which otherwise show the flags the environment gave as if required.
#[command(
    override_usage = "fga-relay retry [OPTIONS] --dead\n       fga-relay retry [OPTIONS] <ID>...",
    group(clap::ArgGroup::new("which").required(true).args(["dead", "ids"]))
)]
pub struct Retry {
    #[command(flatten)]
    db: DbArgs,
    /// Every dead row.
    #[arg(long, conflicts_with = "ids")]
    dead: bool,
    /// Change nothing: list, for each dead row, the error that killed it, and the operations
    /// the relay would replay and those it would skip (a later delivered row touches their
    /// tuple).
    #[arg(long)]
    dry_run: bool,
    /// Only rows of this store: the store id the rows name, or `none` for the rows that name
    /// no store (they go to the relay's configured store).
    #[arg(long)]
    store: Option<String>,
    /// The relay's configured store, as `run` takes it: `--dry-run` counts a row naming this id
    /// and a row naming none as one store, as the relay does when it skips a retried row's
    /// superseded operations. Without it, a row naming it is previewed as another store's.
    #[arg(long = "store-id", env = "FGA_STORE_ID", value_name = "ID")]
    configured: Option<String>,
    /// These rows (ids).
    #[arg(value_name = "ID")]
    ids: Vec<i64>,
}

/// What `retry` was asked to do.
struct Asked {
    /// `--dead`: every dead row, not `ids`.
    dead: bool,
    dry_run: bool,
    /// `--store`: only rows naming this store (`""`: none).
    only: Option<String>,
    /// `--store-id`: the relay's configured store, when given.
    configured: Option<String>,
    ids: Vec<i64>,
}

impl Retry {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let Retry {
            db,
            dead,
            dry_run,
            store: only,
            configured,
            mut ids,
        } = self;
        // An id given twice is one row: said once, counted once.
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| seen.insert(*id));
        let only = only
            .as_deref()
            .map(store_filter)
            .transpose()
            .map_err(|e| ConfigError::new("--store", e))?;
        let configured = super::configured_store(configured);
        let asked = Asked {
            dead,
            dry_run,
            only,
            configured,
            ids,
        };
        let db = db.settings()?;
        lock_wait::bounded("retry", &db, retry(&db, asked)).await
    }
}

async fn retry(db: &DbSettings, asked: Asked) -> Result<ExitCode, Failure> {
    let store = open_store(db, "fga-relay retry").await?;
    match retry_rows(&store, asked).await {
        Ok(exit) => Ok(exit),
        // A role without the relay's grants is told the GRANT, as `status` tells it.
        Err(e) => Err(store_failure(&store, e).await),
    }
}

/// What `retry` does once the table is there.
async fn retry_rows(store: &Store, asked: Asked) -> Result<ExitCode, StoreError> {
    let which = (!asked.dead).then_some(asked.ids.as_slice());
    let only = asked.only.as_deref();
    if asked.dry_run {
        let rows = store.dead_rows(which, only).await?;
        if asked.configured.is_none() && !rows.is_empty() {
            output::line(
                "the relay's configured store is not known here: a row naming its id is \
                 previewed as another store's, where the relay takes it with the rows naming \
                 none; give it as run has it (--store-id, or FGA_STORE_ID)",
            );
        }
        for row in &rows {
            output::line(format_args!(
                "row {}: dead: {}",
                row.id,
                row.last_error.as_deref().unwrap_or("(no error recorded)")
            ));
            for line in preview(store, row.id, &row.payload, asked.configured.as_deref()).await? {
                output::line(line);
            }
        }
        let left: Vec<i64> = asked
            .ids
            .iter()
            .copied()
            .filter(|id| !rows.iter().any(|r| r.id == *id))
            .collect();
        for line in left_alone(store, &left, only).await? {
            output::line(line);
        }
        output::line(format_args!(
            "{} dead row(s) would be sent back to pending (dry run: nothing changed)",
            rows.len()
        ));
        return Ok(exit(&left, asked.ids.len(), true));
    }
    let sent = store.retry(which, only).await?;
    for (id, last_error) in &sent {
        info!(
            id,
            last_error = last_error.as_deref().unwrap_or(""),
            "dead row sent back to pending (operations superseded by later delivered rows \
                 are skipped when the relay reads it)"
        );
    }
    let left: Vec<i64> = asked
        .ids
        .iter()
        .copied()
        .filter(|id| !sent.iter().any(|(s, _)| s == id))
        .collect();
    for line in left_alone(store, &left, only).await? {
        output::line(line);
    }
    output::line(format_args!("{} row(s) sent back to pending", sent.len()));
    Ok(exit(&left, asked.ids.len(), false))
}

/// The exit status: 1, said on stderr, when any of the `given` ids was (or, in a dry run, would
/// be) left as it is; the lines on stdout say why for each.
fn exit(left: &[i64], given: usize, dry_run: bool) -> ExitCode {
    if left.is_empty() {
        return ExitCode::SUCCESS;
    }
    let was = match (left.len(), dry_run) {
        (_, true) => "would be",
        (1, false) => "was",
        (_, false) => "were",
    };
    let them = if left.len() == 1 { "it is" } else { "they are" };
    crate::telemetry::error_line(&format!(
        "retry: {} of the {given} rows given {was} left as {them} (each line above says why); \
         `fga-relay retry --dead --dry-run` lists the dead rows, which retry takes",
        left.len()
    ));
    ExitCode::from(1)
}

/// Why each of `ids`, which `retry` was given and did not take, was left as it is: no such row,
/// delivered, pending, or dead but of another store than `--store` (`only`).
async fn left_alone(
    store: &Store,
    ids: &[i64],
    only: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let states = store.row_states(ids).await?;
    Ok(ids
        .iter()
        .map(|id| {
            let why = match states.iter().find(|(s, _)| s == id).map(|(_, s)| s) {
                None => "no such row".to_owned(),
                Some(RowState::Delivered) => "delivered, not dead".to_owned(),
                Some(RowState::Pending) => "pending, not dead (the relay delivers it)".to_owned(),
                Some(RowState::Dead(named)) => {
                    let named = named.as_deref().unwrap_or("");
                    match only {
                        Some(only) if only != named => format!(
                            "dead, but of {}, not of --store {}",
                            store_name(named),
                            if only.is_empty() { "none" } else { only }
                        ),
                        // Dead since retry looked: another retry finds it.
                        _ => "dead only since retry looked: run retry again".to_owned(),
                    }
                }
            };
            format!("row {id}: {why}; left as it is")
        })
        .collect())
}

/// A store as rows name it: "store X", or "no store" (the relay's configured one).
fn store_name(named: &str) -> String {
    if named.is_empty() {
        "no store (the relay's configured one)".to_owned()
    } else {
        format!("store {named}")
    }
}

/// What the relay would do with dead row `id` if it came back now: a line per operation.
/// `configured`: the relay's configured store, when given.
async fn preview(
    store: &Store,
    id: i64,
    text: &Result<String, String>,
    configured: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    let payload = match text {
        Ok(t) => Payload::parse_text(t).map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    let (ops, row_store) = match payload {
        Ok(p) => (p.ops, p.store),
        Err(e) => return Ok(vec![format!("row {id}: {e} (dead-lettered again)")]),
    };
    let keys: Vec<&TupleKey> = ops.iter().map(Op::key).collect();
    let conn = store.pool().get().await?;
    // As the relay keys a row's store (`Target::store_key`): "" for the configured store, whether
    // the row names it or none. Not known, a row naming it is taken as another store's.
    let row_store = row_store
        .as_deref()
        .filter(|named| Some(*named) != configured)
        .unwrap_or("");
    let skipped = store
        .superseded(&conn, id, &keys, row_store, configured)
        .await?;
    Ok(ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let kind = if op.is_write() { "write" } else { "delete" };
            match skipped.iter().find(|(s, _)| *s == i) {
                Some((_, by)) => format!(
                    "row {id}: skip {kind} {} (superseded by row {by}, delivered)",
                    op.key()
                ),
                None => format!("row {id}: replay {kind} {}", op.key()),
            }
        })
        .collect())
}
