//! Reading OpenFGA back: the whole store page by page, or each compared tuple by its key, into
//! the session's `reconcile_actual`.

use super::db::Db;
use super::progress::{Meter, Progress};
use crate::backoff::Backoff;
use crate::openfga::{FailureClass, FgaClient, MAX_READ_PAGE, ReadPage};
use crate::payload::TupleKey;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tracing::warn;

/// Tuples read one by one at once, with `--read-by tuple`.
pub(super) const READ_CONCURRENCY: usize = 8;
/// Keys taken from the database at a time for reads one by one.
pub(super) const KEYS_PAGE: i64 = 500;
/// Tuples read from OpenFGA gathered before they are written to the database at once.
pub(super) const ACTUAL_BATCH: usize = 1000;
/// Attempts at one Read before OpenFGA counts as unavailable.
pub(super) const READ_ATTEMPTS: u32 = 6;
pub(super) const READ_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(250), Duration::from_secs(4));

/// One Read page, retried with backoff while OpenFGA fails transiently; any other failure, or
/// too many, ends the check.
pub(super) async fn read_page(
    client: &FgaClient,
    store: &str,
    filter: Option<&TupleKey>,
    token: &str,
) -> anyhow::Result<ReadPage> {
    let mut attempt = 0;
    // `""` is the configured store.
    let store = (!store.is_empty()).then_some(store);
    loop {
        match client.read(store, filter, MAX_READ_PAGE, token).await {
            Ok(page) => return Ok(page),
            Err(e) if e.class() == FailureClass::Transient && attempt + 1 < READ_ATTEMPTS => {
                attempt += 1;
                let wait = e
                    .retry_after()
                    .unwrap_or_else(|| READ_BACKOFF.delay(attempt));
                warn!(error = %e, attempt, "OpenFGA Read failed; trying again");
                tokio::time::sleep(wait).await;
            }
            Err(e) => anyhow::bail!("OpenFGA Read failed: {e}"),
        }
    }
}

/// Reads every store the compared tuples are in (with `all`, every store the outbox speaks of)
/// whole, each into `reconcile_actual`; returns how many tuples they hold that the outbox does
/// not speak of.
pub(super) async fn read_stores(client: &FgaClient, pg: &Db, all: bool) -> anyhow::Result<u64> {
    let mut progress = Progress::start("reading OpenFGA", Meter::Count);
    let mut unknown = 0;
    for store in pg.stores(all).await? {
        unknown += read_store(client, pg, &store, all, &mut progress).await?;
    }
    progress.finish();
    Ok(unknown)
}

/// Reads one store whole, page after page, into `reconcile_actual`; returns how many tuples it
/// holds that the outbox does not speak of.
async fn read_store(
    client: &FgaClient,
    pg: &Db,
    store: &str,
    all: bool,
    progress: &mut Progress,
) -> anyhow::Result<u64> {
    let mut token = String::new();
    let mut batch = Vec::with_capacity(ACTUAL_BATCH + MAX_READ_PAGE as usize);
    let mut unknown = 0;
    loop {
        let page = read_page(client, store, None, &token).await?;
        progress.add(page.tuples.len() as u64);
        batch.extend(page.tuples);
        if batch.len() >= ACTUAL_BATCH {
            unknown += pg.record_actual(store, &batch, all).await?;
            batch.clear();
        }
        if page.continuation_token.is_empty() {
            break;
        }
        if page.continuation_token == token {
            anyhow::bail!("OpenFGA Read answered the same continuation token twice");
        }
        token = page.continuation_token;
    }
    unknown += pg.record_actual(store, &batch, all).await?;
    Ok(unknown)
}

/// Reads each compared tuple by its key, [`READ_CONCURRENCY`] at a time, into
/// `reconcile_actual`.
pub(super) async fn read_tuples(client: &Arc<FgaClient>, pg: &Db) -> anyhow::Result<()> {
    let total = pg.delivered_tuples().await?;
    let mut progress = Progress::start("reading OpenFGA", Meter::Total(total));
    let mut after = (
        String::new(),
        TupleKey {
            object: String::new(),
            relation: String::new(),
            user: String::new(),
        },
    );
    loop {
        let keys = pg.keys_after(&after, KEYS_PAGE).await?;
        let Some(last) = keys.last() else { break };
        after = last.clone();
        let mut held: Vec<(String, crate::openfga::ReadTuple)> = Vec::new();
        let mut reads = JoinSet::new();
        for (store, key) in keys {
            while reads.len() >= READ_CONCURRENCY {
                held.extend(joined(reads.join_next().await)?);
                progress.add(1);
            }
            let client = client.clone();
            reads.spawn(async move {
                let mut found = Vec::new();
                let mut token = String::new();
                loop {
                    let page = read_page(&client, &store, Some(&key), &token).await?;
                    found.extend(
                        page.tuples
                            .into_iter()
                            .filter(|t| t.key == key)
                            .map(|t| (store.clone(), t)),
                    );
                    if page.continuation_token.is_empty() || page.continuation_token == token {
                        return anyhow::Ok(found);
                    }
                    token = page.continuation_token;
                }
            });
        }
        while let Some(r) = reads.join_next().await {
            held.extend(joined(Some(r))?);
            progress.add(1);
        }
        // Recorded store by store (a page of keys spans few).
        held.sort_by(|a, b| a.0.cmp(&b.0));
        for chunk in held.chunk_by(|a, b| a.0 == b.0) {
            let tuples: Vec<crate::openfga::ReadTuple> =
                chunk.iter().map(|(_, t)| t.clone()).collect();
            pg.record_actual(&chunk[0].0, &tuples, false).await?;
        }
    }
    progress.finish();
    Ok(())
}

pub(super) fn joined<T>(
    r: Option<Result<anyhow::Result<Vec<T>>, tokio::task::JoinError>>,
) -> anyhow::Result<Vec<T>> {
    match r {
        None => Ok(Vec::new()),
        Some(Ok(found)) => found,
        Some(Err(e)) => Err(anyhow::anyhow!("a Read task failed: {e}")),
    }
}
