//! Reading pending rows into a pass's queue: a page at a time, in id order; and, for a Write to
//! a store that rows name which the queue cannot fill (rows spread over many stores leave a row
//! or two of each store in a page), that store's next pending rows, read ahead in id order
//! (`sql/queries/claim_store.sql`). A store's rows read ahead are the next of that store: every
//! earlier one is in the queue already, or done with in this pass; so order per (store, tuple)
//! holds as with pages. The pages after pass over what was read ahead (read again, a row still
//! in flight would be planned once more, found done by its Write's lock and held for the pass).

use super::order::{Candidate, key_hash};
use super::write::{Spare, WriteTx};
use super::{Deliverer, PassReport};
use crate::openfga::Target;
use crate::payload::Payload;
use crate::store::{ClaimedRow, StoreError};
use deadpool_postgres::GenericClient;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How soon a row naming a store is looked at again while the configured store's id, which it
/// must be told apart from, cannot be resolved (`--store-name`, ListStores failing).
const UNRESOLVED_STORE_WAIT: Duration = Duration::from_secs(1);

/// The queue is not grown by reading ahead past this many pages' worth of rows: what a pass
/// holds in memory stays bounded however many stores its rows name.
pub(super) const AHEAD_PAGES: usize = 8;

/// What a pass has read ahead, per store rows name: the last id read, and whether the store
/// had no more pending rows then.
#[derive(Default)]
pub(super) struct Ahead(HashMap<Arc<str>, (i64, bool)>);

impl Ahead {
    /// Whether row `id`, naming `store`, was read ahead already in this pass.
    fn covers(&self, store: Option<&Arc<str>>, id: i64) -> bool {
        store
            .and_then(|s| self.0.get(s))
            .is_some_and(|(last, _)| id <= *last)
    }

    /// Whether reading ahead for `store` found its end already.
    pub(super) fn done(&self, store: &str) -> bool {
        self.0.get(store).is_some_and(|(_, done)| *done)
    }
}

impl Deliverer {
    /// Reads the next page of pending rows into the queue. Returns the last id read and how
    /// many rows, or `None` when there are no more. With `lock` (the first page of a pass), it
    /// reads them locked, and returns the transaction that holds them if every row read went
    /// into the queue.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn read_page(
        &mut self,
        from: i64,
        batch: usize,
        lock: bool,
        ahead: &Ahead,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<(Option<(i64, usize)>, Option<Spare>), StoreError> {
        // A connection left inside a transaction by an error is closed, not pooled.
        let tx = WriteTx(Some(self.store.pool().get().await?));
        let conn = tx.conn();
        let locked = match lock {
            true => self.store.claim_locked(conn, from, batch as i64).await?,
            false => None,
        };
        // A transaction is open, holding the rows read.
        let mut open = locked.is_some();
        let rows = match locked {
            Some(rows) => rows,
            None => self.store.claim(conn, from, batch as i64).await?,
        };
        let Some(last) = rows.last().map(|r| r.id) else {
            if open {
                tx.rollback().await?;
            } else {
                tx.finish();
            }
            return Ok((None, None));
        };
        let n = rows.len();
        let ids = self
            .queue_rows(conn, rows, &mut open, Some(ahead), queue, blocked, report)
            .await?;
        let spare = if open && ids.len() == n {
            Some(Spare { tx, ids })
        } else {
            if open {
                // A row held back: no Write will be this page.
                tx.rollback().await?;
            } else {
                tx.finish();
            }
            None
        };
        Ok((Some((last, n)), spare))
    }

    /// Takes rows read into the queue, in id order: a payload that cannot be read is
    /// dead-lettered (the transaction `open` says is open on `conn` rolled back first, as for
    /// anything written); a row held back blocks its tuples; a row `ahead` covers (read ahead
    /// already, this pass) is passed over. Returns the ids queued.
    #[allow(clippy::too_many_arguments)]
    async fn queue_rows(
        &mut self,
        conn: &deadpool_postgres::Client,
        rows: Vec<ClaimedRow>,
        open: &mut bool,
        ahead: Option<&Ahead>,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<Vec<i64>, StoreError> {
        let now = Instant::now();
        let mut ids = Vec::with_capacity(rows.len());
        // The configured store's id, looked up at the first row naming a store (resolved from
        // --store-name at the first need, so asked once a call at most); rows naming none go
        // to it without it.
        let mut configured: Option<Option<String>> = None;
        for row in rows {
            let parsed = match &row.payload {
                Ok(text) => Payload::parse_text(text).map_err(|e| e.to_string()),
                Err(e) => Err(format!("malformed payload: {e}")),
            };
            let payload = match parsed {
                Ok(p) => p,
                Err(e) => {
                    // Not in that transaction: the rows it holds may yet be let go.
                    if std::mem::take(open) {
                        conn.batch_execute("ROLLBACK").await?;
                    }
                    let read = row.payload.as_deref().ok();
                    if !self.dead_letter(conn, row.id, &e, read, report).await? {
                        // Held by another session, or changed since it was read: looked at
                        // again soon, with what it says then.
                        report.held += 1;
                        report.locked += 1;
                    }
                    continue;
                }
            };
            if ahead.is_some_and(|a| a.covers(payload.store.as_ref(), row.id)) {
                continue;
            }
            // A row naming a store is keyed by it, unless it names the configured one, which
            // must be known for that.
            let target = match &payload.store {
                None => Target::of(None, payload.model.as_ref(), ""),
                Some(_) => {
                    if configured.is_none() {
                        configured = Some(match self.client.configured_store_id() {
                            Some(id) => Some(id.to_owned()),
                            None => self.client.store_id().await.ok().map(str::to_owned),
                        });
                    }
                    let Some(Some(id)) = &configured else {
                        // Which store it is cannot be told yet: looked at again soon.
                        report.held += 1;
                        report.due(now + UNRESOLVED_STORE_WAIT);
                        continue;
                    };
                    Target::of(payload.store.as_ref(), payload.model.as_ref(), id)
                }
            };
            let hashes: Vec<u64> = payload
                .ops
                .iter()
                .map(|op| key_hash(target.store_key(), op.key()))
                .collect();
            let text: Arc<str> = row.payload.as_deref().unwrap_or_default().into();
            if let Some(at) = self.memo.get(&row.id).and_then(|m| m.retry_at)
                && at > now
            {
                blocked.extend(hashes.iter().copied());
                report.held += 1;
                report.due(at);
                continue;
            }
            if row.retried && !self.memo.get(&row.id).is_some_and(|m| m.checked) {
                // Not in the page's locked transaction: the note on the row must stay even if
                // that transaction is rolled back.
                if std::mem::take(open) {
                    conn.batch_execute("ROLLBACK").await?;
                }
                let configured = self.client.configured_store_id().map(str::to_owned);
                self.skip_superseded(conn, row.id, &payload.ops, &target, configured.as_deref())
                    .await?;
            }
            ids.push(row.id);
            queue.insert(
                row.id,
                Candidate {
                    id: row.id,
                    created_at: row.created_at,
                    ops: payload.ops,
                    target,
                    hashes,
                    text,
                },
            );
        }
        Ok(ids)
    }

    /// Reads ahead the next pending rows of `store` (a store rows name), from `from` (the
    /// pass's next page) or past what was read ahead for it before, into the queue, for its
    /// Write: at most `limit` (the caller reads ahead only while the queue holds fewer than
    /// [`AHEAD_PAGES`] pages). Returns how many rows were read.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn read_ahead(
        &mut self,
        store: &Arc<str>,
        from: i64,
        limit: usize,
        ahead: &mut Ahead,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<usize, StoreError> {
        if ahead.done(store) {
            return Ok(0);
        }
        let start = match ahead.0.get(store) {
            Some((last, _)) => last.saturating_add(1).max(from),
            None => from,
        };
        let conn = self.store.pool().get().await?;
        let rows = self
            .store
            .claim_store(&conn, store, start, limit as i64)
            .await?;
        let n = rows.len();
        let last = rows.last().map_or(start.saturating_sub(1), |r| r.id);
        ahead.0.insert(store.clone(), (last, n < limit));
        self.queue_rows(&conn, rows, &mut false, None, queue, blocked, report)
            .await?;
        Ok(n)
    }
}
