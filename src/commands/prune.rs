//! `fga-relay prune`: deletes delivered rows older than a duration, in small batches.

use super::failure::Failure;
use super::lock_wait;
use super::open::{open_store, run_as_owner};
use crate::config::{self, ConfigError, DbSettings};
use crate::output;
use crate::payload::store_filter;
use crate::settings::DbArgs;
use crate::store::{Store, StoreError};
use clap::Args;
use std::process::ExitCode;
use tokio_postgres::error::SqlState;
use tracing::info;

/// Rows deleted per `prune` statement: small enough that no batch holds locks for long.
const PRUNE_BATCH: i64 = 1000;

#[derive(Args, Debug)]
pub struct Prune {
    #[command(flatten)]
    db: DbArgs,
    /// How long to keep delivered rows, e.g. 90d, 12h; longer than zero.
    #[arg(long, value_name = "DURATION")]
    older_than: String,
    /// Only rows of this store: the store id the rows name, or `none` for the rows that name
    /// no store (they go to the relay's configured store).
    #[arg(long)]
    store: Option<String>,
    /// The relay's configured store, as `run` takes it: rows naming none and rows naming this id
    /// are one store for what prune keeps below a retried row. Without it, the rows naming none
    /// are kept with every store's.
    #[arg(long = "store-id", env = "FGA_STORE_ID", value_name = "ID")]
    configured: Option<String>,
}

/// The shortest `--older-than` taken: shorter keeps no evidence worth the name.
const MIN_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl Prune {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let Prune {
            db,
            older_than,
            store: only,
            configured,
        } = self;
        let age = config::parse_duration("--older-than", &older_than)?;
        if age < MIN_AGE {
            // Down to rows delivered moments ago: the evidence that `retry`'s look for
            // superseded operations and `reconcile` read. Zero is the usual slip; a few
            // milliseconds or seconds is the same one.
            return Err(ConfigError::new(
                "--older-than",
                format!(
                    "{:?} is under a minute: it would delete rows delivered moments ago, which \
                     retry (to skip what later rows superseded) and reconcile read as \
                     evidence: give how long to keep delivered rows, such as 90d (as long as \
                     you may want to reconcile)",
                    older_than.trim()
                ),
            )
            .into());
        }
        let only = only
            .as_deref()
            .map(store_filter)
            .transpose()
            .map_err(|e| ConfigError::new("--store", e))?;
        let cutoff = std::time::SystemTime::now()
            .checked_sub(age)
            .ok_or_else(|| ConfigError::new("--older-than", "is too long"))?;
        let db = db.settings()?;
        lock_wait::bounded(
            "prune",
            &db,
            prune(
                &db,
                cutoff,
                &older_than,
                only,
                super::configured_store(configured),
            ),
        )
        .await
    }
}

async fn prune(
    db: &DbSettings,
    cutoff: std::time::SystemTime,
    older_than: &str,
    only: Option<String>,
    configured: Option<String>,
) -> Result<ExitCode, Failure> {
    let store = open_store(db, "fga-relay prune").await?;
    let (mut total, mut held, mut held_by, mut after) = (0u64, 0u64, None::<i64>, 0i64);
    let mut kept_rows: Vec<i64> = Vec::new();
    let kept_from = loop {
        let batch = match store
            .prune_batch(
                cutoff,
                PRUNE_BATCH,
                only.as_deref(),
                configured.as_deref(),
                after,
                &kept_rows,
            )
            .await
        {
            Ok(batch) => batch,
            Err(e) => return Err(prune_failure(&store, e).await),
        };
        total += batch.deleted;
        held += batch.held;
        held_by = held_by.into_iter().chain(batch.held_by).min();
        kept_rows.extend(&batch.held_ids);
        match batch.last {
            Some(last) if batch.looked_at >= PRUNE_BATCH as u64 => after = last,
            _ => break batch.kept_from,
        }
    };
    info!(rows = total, older_than = %older_than, kept_from, held, held_by,
          "pruned delivered rows");
    output::line(format_args!("{total} delivered row(s) deleted"));
    if let Some(dead) = held_by {
        // A dead row is what `retry` may bring back, and the relay then skips its operations
        // that later delivered rows superseded: those rows must be there to be found.
        output::line(format_args!(
            "kept {held} delivered row(s) older than --older-than on the tuples of dead rows \
             below them (the lowest: row {dead}): `retry` needs them to skip what they \
             superseded rather than replay it over them; they go once those dead rows are \
             retried, delivered and older than --older-than, or deleted (`fga-relay status` \
             lists the dead rows)"
        ));
    }
    if let Some(id) = kept_from {
        // Rows older than the cutoff may remain: say why, and when they go, so that nobody
        // deletes them by hand (which would let `reconcile --repair` replay a skipped grant).
        output::line(format_args!(
            "kept its store's rows from id {id} up (and the rows naming none, unless \
             FGA_STORE_ID or --store-id names another store): row {id} was dead and is pending \
             again or was delivered after the cutoff, out of id order, or is dead with \
             operations that cannot be read; `reconcile` and `retry` need the later rows on its \
             tuples; they are pruned once row {id} is delivered and older than --older-than \
             (a dead row: fixed and retried, or deleted)"
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prune's database error; where the role may not delete (the relay's own role, by design), with
/// the role to run it as.
async fn prune_failure(store: &Store, e: StoreError) -> Failure {
    if let StoreError::Db(db) = &e
        && db.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
        && let Ok(client) = store.pool().get().await
    {
        let table = store.table();
        return Failure::Other(anyhow::anyhow!(
            "{e}: prune deletes rows, which the relay's role may not (by design): {}, or as a \
             role granted DELETE on {table} (and SELECT and UPDATE, which its row locks need)",
            run_as_owner(&client, table, "prune").await
        ));
    }
    e.into()
}
