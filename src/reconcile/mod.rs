//! `fga-relay reconcile`: shows that OpenFGA holds what the delivered rows say it must, and
//! repairs drift through the outbox.
//!
//! # How it streams
//! Nothing proportional to the outbox or the store is held in the relay's memory. PostgreSQL does
//! the sorting and joining, in temporary tables of this session (`sql/queries/reconcile_*.sql`):
//! 1. The line: the newest row's id `M`; then the wait for transactions that were inserting rows
//!    at that moment, so that every row up to `M` is committed (or gone) for good.
//! 2. The expected state: per tuple that rows `from..=M` touch, its last operation in id order,
//!    computed by one `DISTINCT ON` statement into `reconcile_expected` (PostgreSQL sorts,
//!    spilling to disk past `work_mem`).
//! 3. What OpenFGA holds: each store the rows name (the configured one for rows naming none;
//!    every store, or the one of `--store`) read whole, page by page (Read returns tuples in
//!    insertion order, not key order, so the pages cannot be merge-joined as they come), each
//!    batch of pages inserted into `reconcile_actual` keeping only the tuples the outbox speaks
//!    of; or, with `--since`, one Read per compared tuple from its store, a page of keys at a
//!    time. Every tuple is a tuple in a store: the same tuple in two stores is compared twice.
//! 4. The tuples that rows after `M` touch (they changed while checking) into `reconcile_moved`.
//! 5. One join, read through a cursor a page at a time, yields every tuple not in step, in key
//!    order; each is printed as it comes (and recorded for `--repair`).
//!
//! Memory: a page of keys, a batch of Read pages, a page of the cursor: a few thousand tuples.
//!
//! # Why a report can be trusted while the relay runs
//! A tuple whose last operation is in a pending or dead row is reported as such, never as drift.
//! A delivered operation reached OpenFGA before its row was marked, so before step 2 reads it;
//! anything that changes the tuple later comes from a row after `M` (step 1 makes sure of that),
//! and such tuples are reported as changed, not compared. `--repair` checks that once more under
//! a short lock, right before it inserts: see `Db::repair` (`db.rs`).

mod compare;
mod db;
mod progress;
mod read;
mod report;
mod settings;

pub use settings::{Options, ReadBy};

use crate::config::{DbSettings, FgaSettings};
use crate::openfga::{FgaClient, PreflightError};
use compare::Summary;
use db::Db;
use progress::{Meter, Progress, peak_rss_kib};
use read::{read_stores, read_tuples};
use report::Report;
use std::sync::Arc;
use tracing::info;

/// What the check found.
pub enum Verdict {
    InStep,
    Drift,
}

/// Checks that OpenFGA holds what the delivered rows say it must, and with `--repair` enqueues
/// the corrections; the report goes to stdout as it is found.
pub async fn run(db: &DbSettings, fga: &FgaSettings, opts: &Options) -> anyhow::Result<Verdict> {
    log_start(db, fga, opts);
    let mut pg = Db::connect(db).await?;
    let (client, configured) = find_store(fga).await?;
    let only = opts
        .store
        .as_deref()
        .map(|s| if s == configured { "" } else { s });
    pg.setup(&configured).await?;

    let from = match opts.since {
        Some(d) => pg.first_row_since(d).await?,
        None => 0,
    };
    let through = pg.newest_row().await?;
    pg.wait_for_writers().await?;

    let mut progress = Progress::start("reading the outbox", Meter::Time);
    let tuples = pg.expected(from, through, only).await?;
    progress.add(tuples);
    progress.finish();

    let not_in_outbox = match opts.read_by {
        ReadBy::Store => Some(read_stores(&client, &pg, opts.all).await?),
        ReadBy::Tuple => {
            read_tuples(&client, &pg).await?;
            None
        }
    };
    pg.moved_since(through).await?;

    let mut summary = Summary {
        from,
        through,
        tuples,
        // Tuples only the store knows are meaningful only against the whole outbox.
        not_in_outbox: not_in_outbox.filter(|_| opts.since.is_none()),
        ..Summary::default()
    };
    let mut out = Report::new(opts.json);
    pg.compare(&mut out, &mut summary, opts.repair).await?;
    if opts.all {
        pg.list_unknown(&mut out).await?;
    }
    if opts.repair && summary.drift() > 0 {
        summary.repair = Some(pg.repair(through, fga.max_tuples_per_write).await?);
    }
    out.finish(&summary)?;
    log_finish(&summary);
    Ok(if summary.drift() > 0 {
        Verdict::Drift
    } else {
        Verdict::InStep
    })
}

/// What is checked, against what, in one line: never a connection string or a URL's userinfo.
fn log_start(db: &DbSettings, fga: &FgaSettings, opts: &Options) {
    info!(
        database = %crate::db::target::summary(db),
        table = %db.table,
        api_url = %crate::config::shown_url(&fga.api_url),
        store = %fga.store,
        only_store = opts.store.as_deref().unwrap_or("(every store)"),
        since = %opts
            .since
            .map_or_else(|| "all".to_owned(), |d| humantime::format_duration(d).to_string()),
        read_by = %opts.read_by.as_str(),
        repair = opts.repair,
        "fga-relay reconcile starting"
    );
}

/// The client, once its store is found, and the configured store's id: rows naming it are the
/// configured store's.
async fn find_store(fga: &FgaSettings) -> anyhow::Result<(Arc<FgaClient>, String)> {
    let client = Arc::new(FgaClient::new(fga)?);
    match client.preflight().await {
        Ok(name) => info!(store = %name, "OpenFGA store found"),
        Err(PreflightError::Config(e)) => return Err(e.into()),
        Err(PreflightError::Unavailable(e)) => anyhow::bail!("cannot reach OpenFGA: {e}"),
    }
    let configured = client.configured_store_id().unwrap_or_default().to_owned();
    Ok((client, configured))
}

fn log_finish(summary: &Summary) {
    match peak_rss_kib() {
        Some(kib) => info!(
            tuples = summary.tuples,
            drift = summary.drift(),
            peak_rss_kib = kib,
            "reconcile finished"
        ),
        None => info!(
            tuples = summary.tuples,
            drift = summary.drift(),
            "reconcile finished"
        ),
    }
}
