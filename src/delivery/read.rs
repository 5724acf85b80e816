//! Reading rows into the stream's queue: the lowest pending rows not in hand, in id order, with
//! the rows of held stores left out (sql/queries/claim.sql); and, for a Write to a store that
//! rows name which the queue cannot fill (rows spread over many stores leave a row or two of
//! each store in a read), that store's lowest pending rows not in hand (claim_store.sql).
//!
//! There is no cursor: every read starts again from the lowest pending id, leaving out what the
//! relay holds. A row committed late, with an id below rows read already, is found by the next
//! read; and any snapshot that sees a row also sees every row committed before it with a lower
//! id (a writer serialised behind another commits after it), so that a later row on a tuple is
//! never read before an earlier one: order per (store, tuple) holds as rows come in.

use super::Deliverer;
use super::order::{Candidate, Plan, key_hash};
use super::write::{Spare, WriteTx};
use crate::openfga::Target;
use crate::payload::Payload;
use crate::recurring::Recurring;
use crate::store::{ClaimedRow, StoreError};
use deadpool_postgres::GenericClient;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::warn;

/// How soon rows are looked at again while the configured store's id, which rows naming a
/// store must be told apart from, cannot be resolved (`--store-name`, ListStores failing).
const UNRESOLVED_STORE_WAIT: Duration = Duration::from_secs(1);

/// The queue is not grown past this many reads' worth of rows: what the stream holds in memory
/// stays bounded however many stores its rows name and however many rows are held back.
pub(super) const AHEAD_PAGES: usize = 8;

/// For the stores rows name, whether reading ahead found no more of their pending rows, since
/// the last read (which may have brought more).
#[derive(Default)]
pub(super) struct Ahead(HashMap<Arc<str>, bool>);

impl Ahead {
    /// Whether reading ahead for `store` found its end already.
    fn done(&self, store: &str) -> bool {
        self.0.get(store).copied().unwrap_or(false)
    }
}

/// What a read brought.
pub(super) struct Read {
    /// Rows read.
    pub(super) rows: usize,
    /// Whether more rows may be pending that it did not read.
    pub(super) more: bool,
}

/// How a read finds its rows.
enum Claim {
    /// In id order, locked in a transaction kept for the next Write (nothing in hand).
    Locked,
    /// In id order, nothing locked.
    InIdOrder,
    /// A store held: in id order no further than the settings bound, then, if that fell short,
    /// each lane not left out from its own index; nothing locked. With the configured store's
    /// id, whose rows are in one lane with the rows naming none.
    ByLane(String),
    /// The stores with no row in hand: each lane not left out from its own index, no walk in id
    /// order (see `turn::FAIR_READ`). With the configured store's id, as `ByLane`.
    Lanes(String),
    /// The queue at its bound with rows of stores not trusted: the trusted stores' lanes, each
    /// from its own index (see `Deliverer::trusted_read`). With the configured store's id, as
    /// `ByLane`.
    Trusted(String),
}

/// Which rows a read takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// The lowest pending rows not in hand.
    Lowest,
    /// Those of the stores with no row in hand (see `turn::FAIR_READ`).
    Others,
    /// Those of the trusted stores (see `Deliverer::trusted_read`).
    Trusted,
}

/// Why a row read cannot be queued yet.
enum Unqueued {
    /// The configured store's id is not known, so which lane the row is in is not either.
    Unresolved,
}

/// Says why row `id` (naming `store`, or none: `""`) and the rows after it wait: `what` needs
/// the configured store's id, and `--store-name` cannot be resolved. Said when first seen, then
/// once a minute while it lasts: the read looks again every second.
fn unresolved(said: &Recurring, id: i64, store: &str, what: &'static str) -> Unqueued {
    if said.due(what) {
        warn!(
            id,
            store,
            "{what}, and the configured store's id is not known yet (--store-name cannot be \
             resolved: is OpenFGA's ListStores answering?); the row and those after it wait \
             until it is"
        );
    }
    Unqueued::Unresolved
}

impl Deliverer {
    /// Reads the lowest pending rows not in hand (of stores not held) into the queue: at most
    /// `limit`. With `lock` (nothing in hand, no store held), it reads them locked, and keeps
    /// the transaction that holds them for the next Write when every row read went into the
    /// queue. `scope` [`Scope::Others`]: only the stores with no row in hand, each from its own
    /// index (see `turn::FAIR_READ`); [`Scope::Trusted`]: only the trusted stores' (see
    /// `Deliverer::trusted_read`); neither is asked without the configured store's id.
    pub(super) async fn read_page(
        &mut self,
        limit: usize,
        lock: bool,
        scope: Scope,
    ) -> Result<Read, StoreError> {
        let hand = self.core.hand();
        self.full = self.core.full();
        let mut out = self.full.clone();
        if scope == Scope::Others {
            out.extend(self.core.served());
        }
        let closed = self
            .core
            .closed(self.client.configured_store_id(), &out, Instant::now());
        let closed: Vec<&str> = closed.iter().map(String::as_str).collect();
        let now = Instant::now();
        self.read_at = Some(now);
        self.left_out = self.core.lanes.held_stores(now);
        // A store held: a read walks no further than the settings bound, then reads each other
        // lane through an index of its own, so that the held stores' backlogs are not walked
        // past at every read. Only once the configured store's id is known: the rows naming it
        // are in one lane with the rows naming none, read together in id order.
        let configured = self.client.configured_store_id();
        let how = match (self.left_out.is_empty(), configured) {
            (_, Some(id)) if scope == Scope::Others => Claim::Lanes(id.to_owned()),
            (_, Some(id)) if scope == Scope::Trusted => Claim::Trusted(id.to_owned()),
            (true, _) if lock => Claim::Locked,
            (false, Some(id)) => Claim::ByLane(id.to_owned()),
            _ => Claim::InIdOrder,
        };
        self.left_out.extend(out);
        // Cleared on every way out, errors included: the rows looked at again later are not of
        // this read.
        let read = self.claim_into_queue(&hand, &closed, limit, how).await;
        self.left_out.clear();
        read
    }

    /// [`Deliverer::read_page`]'s reading, with the lanes left out of it set.
    async fn claim_into_queue(
        &mut self,
        hand: &[i64],
        closed: &[&str],
        limit: usize,
        how: Claim,
    ) -> Result<Read, StoreError> {
        // A connection left inside a transaction by an error is closed, not pooled.
        let tx = WriteTx::new(self.store.pool().get().await?);
        let conn = tx.conn();
        let limit = limit as i64;
        let locked = match &how {
            Claim::Locked => self.store.claim_locked(conn, hand, closed, limit).await?,
            Claim::InIdOrder | Claim::ByLane(_) | Claim::Lanes(_) | Claim::Trusted(_) => None,
        };
        // A transaction is open, holding the rows read.
        let mut open = locked.is_some();
        let rows = match (locked, &how) {
            (Some(rows), _) => rows,
            (None, Claim::ByLane(configured)) => {
                self.store
                    .claim_lanes(conn, hand, closed, limit, configured, false)
                    .await?
            }
            (None, Claim::Lanes(configured)) => {
                self.store
                    .claim_lanes(conn, hand, closed, limit, configured, true)
                    .await?
            }
            (None, Claim::Trusted(configured)) => {
                let stores = self.core.trusted_lanes(closed, Instant::now());
                let stores: Vec<&str> = stores.iter().map(String::as_str).collect();
                self.store
                    .claim_trusted(conn, hand, &stores, limit, configured)
                    .await?
            }
            (None, _) => self.store.claim(conn, hand, closed, limit).await?,
        };
        let n = rows.len();
        let (ids, stopped) = self.queue_rows(conn, rows, &mut open).await?;
        if open && ids.len() == n && n > 0 {
            self.spare = Some(Spare { tx, ids });
        } else if open {
            // A row held back: no Write will be this read.
            tx.rollback().await?;
        } else {
            tx.finish();
        }
        // Stopped at a row that must wait: the rest is read again when it is due.
        if stopped {
            return Ok(Read {
                rows: 0,
                more: false,
            });
        }
        // Read by lane, a lane's share may have been less than it has pending: more is read
        // while reads bring rows.
        let more = match how {
            Claim::ByLane(_) | Claim::Lanes(_) | Claim::Trusted(_) => n > 0,
            Claim::Locked | Claim::InIdOrder => n as i64 >= limit,
        };
        Ok(Read { rows: n, more })
    }

    /// Takes rows read into the queue, in id order: a payload that cannot be read is
    /// dead-lettered (the transaction `open` says is open on `conn` rolled back first, as for
    /// anything written). Returns the ids queued, and whether it stopped at a row whose lane
    /// cannot be told yet: no later row may overtake it; it is read again soon.
    async fn queue_rows(
        &mut self,
        conn: &deadpool_postgres::Client,
        rows: Vec<ClaimedRow>,
        open: &mut bool,
    ) -> Result<(Vec<i64>, bool), StoreError> {
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            match self.queue_row(conn, row, open).await? {
                Ok(Some(id)) => ids.push(id),
                Ok(None) => {}
                Err(Unqueued::Unresolved) => {
                    self.read_again_by(Instant::now() + UNRESOLVED_STORE_WAIT);
                    return Ok((ids, true));
                }
            }
        }
        Ok((ids, false))
    }

    /// Queues one row read; `Ok(None)` when it was dead-lettered (or could not be, and is looked
    /// at again soon).
    async fn queue_row(
        &mut self,
        conn: &deadpool_postgres::Client,
        row: ClaimedRow,
        open: &mut bool,
    ) -> Result<Result<Option<i64>, Unqueued>, StoreError> {
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
                if self.dead_letter(conn, row.id, &e, read).await? {
                    self.core.dead(row.id);
                    return Ok(Ok(None));
                }
                // Held by another session, or changed since it was read: looked at again soon,
                // with what it says then. Meanwhile it bars the later rows of its store.
                if let Err(e) = self
                    .bar(row.id, row.created_at, read.unwrap_or_default())
                    .await
                {
                    return Ok(Err(e));
                }
                self.core.report.locked += 1;
                return Ok(Ok(Some(row.id)));
            }
        };
        let Some(target) = self.target_of(&payload).await else {
            let store = payload.store.as_deref().unwrap_or("");
            return Ok(Err(unresolved(
                &self.said,
                row.id,
                store,
                "a row names a store",
            )));
        };
        if self.left_out.contains(&target.store) {
            // Its lane's rows below it were left out of this read: read again with them once
            // its lane is open.
            return Ok(Ok(None));
        }
        let hashes: Vec<u64> = payload
            .ops
            .iter()
            .map(|op| key_hash(target.store_key(), op.key()))
            .collect();
        let c = Candidate {
            id: row.id,
            created_at: row.created_at,
            ops: payload.ops,
            target,
            hashes,
            text: row.payload.as_deref().unwrap_or_default().into(),
            malformed: false,
            anywhere: false,
        };
        self.core.unchecked.remove(&row.id);
        if let Some(at) = row.retried
            && self.core.memo.get(&row.id).and_then(|m| m.checked) != Some(at)
        {
            match self.check_on_read(conn, &c, at, open).await? {
                Ok(true) => {}
                Ok(false) => return Ok(Ok(None)),
                Err(e) => return Ok(Err(e)),
            }
        }
        self.core.admit(c);
        Ok(Ok(Some(row.id)))
    }

    /// Looks at a retried row `c` as it is read (`at`: when it came back) for later rows of its
    /// store that superseded it: now, or, while a Write on its tuples is in flight, once that
    /// Write has landed and its rows are marked (a later row it carries supersedes this one only
    /// then; the row waits in its place meanwhile). Ok(false) when the row is gone.
    async fn check_on_read(
        &mut self,
        conn: &deadpool_postgres::Client,
        c: &Candidate,
        at: std::time::SystemTime,
        open: &mut bool,
    ) -> Result<Result<bool, Unqueued>, StoreError> {
        if c.hashes.iter().any(|h| self.core.in_flight.contains_key(h)) {
            self.core.unchecked.insert(c.id, at);
            return Ok(Ok(true));
        }
        // Not in the read's locked transaction: the note on the row must stay even if that
        // transaction is rolled back.
        if std::mem::take(open) {
            conn.batch_execute("ROLLBACK").await?;
        }
        let Ok(configured) = self.client.store_id().await.map(str::to_owned) else {
            // Which later rows are of its store cannot be told: a row naming the configured
            // store's id is of its store.
            let store = c.target.store.as_deref().unwrap_or("");
            let what = "a retried row is to be checked for later rows of its store that \
                superseded it";
            return Ok(Err(unresolved(&self.said, c.id, store, what)));
        };
        let noted = self
            .skip_superseded(conn, c.id, &c.ops, &c.target, Some(&configured))
            .await?;
        Ok(Ok(self.core.superseded_checked(
            c.id,
            at,
            noted,
            Instant::now(),
        )))
    }

    /// Reads again by `at` at the latest.
    fn read_again_by(&mut self, at: Instant) {
        self.read_again_at = Some(self.read_again_at.map_or(at, |t| t.min(at)));
    }

    /// Looks for the superseded operations of the retried rows that waited for the Writes in
    /// flight on their tuples (see `Core::unchecked`), once none is: the rows those Writes
    /// delivered are marked by then, and found.
    pub(super) async fn check_retried(&mut self) -> Result<(), StoreError> {
        if self.core.unchecked.is_empty() {
            return Ok(());
        }
        let core = &self.core;
        let now = Instant::now();
        let ready: Vec<(i64, std::time::SystemTime)> = core
            .unchecked
            .iter()
            .filter(|(id, _)| {
                core.queue
                    .get(id)
                    .is_none_or(|c| !c.hashes.iter().any(|h| core.in_flight.contains_key(h)))
            })
            .filter(|(id, _)| {
                let memo = core.memo.get(id);
                memo.and_then(|m| m.retry_at).is_none_or(|at| at <= now)
            })
            .map(|(id, at)| (*id, *at))
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let Ok(configured) = self.client.store_id().await.map(str::to_owned) else {
            // Which later rows are of its store cannot be told yet: they wait, and the stream
            // looks again with its next read.
            self.read_again_by(Instant::now() + UNRESOLVED_STORE_WAIT);
            return Ok(());
        };
        let conn = self.store.pool().get().await?;
        for (id, at) in ready {
            let Some(c) = self.core.queue.get(&id) else {
                self.core.unchecked.remove(&id);
                continue;
            };
            let (ops, target) = (c.ops.clone(), c.target.clone());
            let noted = self
                .skip_superseded(&conn, id, &ops, &target, Some(&configured))
                .await?;
            self.core.superseded_checked(id, at, noted, Instant::now());
        }
        Ok(())
    }

    /// Queues a row that cannot be decoded and could not be dead-lettered, as a bar to the later
    /// rows of the store its payload names (as far as that can be read), held back briefly.
    /// Not while the store it names cannot be told from the configured one.
    async fn bar(
        &mut self,
        id: i64,
        created_at: std::time::SystemTime,
        text: &str,
    ) -> Result<(), Unqueued> {
        let target = match lane_named(text) {
            None => Target::default(),
            // Not a string: no store id, the configured one's least of all.
            Some(Lane::Other(store)) => Target::of(Some(&store), None, ""),
            Some(Lane::Id(store)) => {
                // Naming the configured store's id, it bars the rows naming none: that id is
                // resolved, not taken as unknown, or those rows would overtake it.
                let Ok(configured) = self.client.store_id().await else {
                    let what =
                        "a row that cannot be decoded, held by another session, names a store";
                    return Err(unresolved(&self.said, id, &store, what));
                };
                Target::of(Some(&store), None, configured)
            }
        };
        self.core.bar(
            Candidate {
                id,
                created_at,
                ops: Arc::from(Vec::new()),
                target,
                hashes: Vec::new(),
                text: text.into(),
                malformed: true,
                anywhere: false,
            },
            Instant::now(),
        );
        Ok(())
    }

    /// Looks again at the rows that bar their store (undecodable, held by another session, or
    /// changed since they were read) whose wait is over: gone (dead-lettered or delivered by
    /// that session) they leave the queue; decodable, they are queued as they are now, in their
    /// place, as a read would queue them (a retried row's superseded operations looked for
    /// again); still undecodable, they are dead-lettered, or wait again.
    pub(super) async fn recheck_bars(&mut self) -> Result<(), StoreError> {
        if self.core.bars == 0 {
            return Ok(());
        }
        let now = Instant::now();
        let due = self.core.bars_due(now);
        if due.is_empty() {
            return Ok(());
        }
        let conn = self.store.pool().get().await?;
        let mut rows: HashMap<i64, ClaimedRow> = self
            .store
            .refresh(&conn, &due)
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        for id in due {
            let Some(old) = self.core.queue.remove(&id) else {
                continue;
            };
            self.core.bars = self.core.bars.saturating_sub(1);
            self.core.memo.remove(&id);
            let Some(row) = rows.remove(&id) else {
                continue;
            };
            match self.lane_below_in_hand(&conn, &row).await {
                Ok(None) => {}
                Ok(Some(bar)) => {
                    // Rows of its lane below it are still to be read: it waits behind them.
                    self.core.bar(bar, now);
                    continue;
                }
                Err(e) => {
                    self.core.bar(old, now);
                    return Err(e);
                }
            }
            match self.queue_row(&conn, row, &mut false).await {
                Ok(Ok(_)) => {}
                Ok(Err(Unqueued::Unresolved)) => {
                    // Which store it is of now cannot be told (the configured one, by its id,
                    // or another): it bars every store's later rows until it can.
                    let bar = Candidate {
                        anywhere: true,
                        ..old
                    };
                    self.core.bar(bar, now);
                }
                Err(e) => {
                    // Still in hand, in its place, barring what it barred.
                    self.core.bar(old, now);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// For a row looked at again by id, as it is now: reads into the queue the pending rows of
    /// the lane it is in now with lower ids that the relay does not hold (its lane may have
    /// been left out of reads, held or with enough rows queued; it may have been read ahead of
    /// them for another store; it may name another store now), as a read would have before it.
    /// Returns the row as a bar of its lane, to wait and be looked at again, while more of them
    /// may be left to read. `None` when none is left, or when its lane cannot be told (it is
    /// then queued, or not, as [`Deliverer::queue_row`] says).
    async fn lane_below_in_hand(
        &mut self,
        conn: &deadpool_postgres::Client,
        row: &ClaimedRow,
    ) -> Result<Option<Candidate>, StoreError> {
        let Ok(text) = &row.payload else {
            return Ok(None);
        };
        let Ok(payload) = Payload::parse_text(text) else {
            return Ok(None);
        };
        let Some(target) = self.target_of(&payload).await else {
            return Ok(None);
        };
        let bar = Candidate {
            id: row.id,
            created_at: row.created_at,
            ops: Arc::from(Vec::new()),
            target,
            hashes: Vec::new(),
            text: text.as_str().into(),
            malformed: true,
            anywhere: false,
        };
        // Rows naming none: until the configured store's id is known, those naming it cannot
        // be told apart (and nothing is delivered meanwhile).
        let Ok(configured) = self.client.store_id().await.map(str::to_owned) else {
            return Ok(Some(bar));
        };
        let keys: Vec<&str> = match bar.target.store.as_deref() {
            Some(store) => vec![store],
            None => vec!["", &configured],
        };
        // A read's worth below it in hand at most: those go first, then more are read (a held
        // lane's backlog is not pulled into memory at each look).
        let batch = self.core.settings.batch_size.max(1);
        let below = self.core.queued_of(&bar.target.store, Some(row.id));
        let limit = batch.saturating_sub(below);
        if limit == 0 {
            return Ok(Some(bar));
        }
        let hand = self.core.hand();
        let lower = self
            .store
            .claim_below(conn, row.id, &keys, &hand, limit as i64)
            .await?;
        let n = lower.len();
        let (_, stopped) = self.queue_rows(conn, lower, &mut false).await?;
        Ok((n >= limit || stopped).then_some(bar))
    }

    /// The target of a row: a row naming a store is keyed by it, unless it names the
    /// configured one, which must be known for that. `None` while it cannot be.
    async fn target_of(&self, payload: &Payload) -> Option<Target> {
        if payload.store.is_none() {
            return Some(Target::of(None, payload.model.as_ref(), ""));
        }
        let configured = match self.client.configured_store_id() {
            Some(id) => id,
            None => self.client.store_id().await.ok()?,
        };
        Some(Target::of(
            payload.store.as_ref(),
            payload.model.as_ref(),
            configured,
        ))
    }

    /// Whether a planned Write to a store rows name is worth filling with that store's next
    /// rows first: its rows in the queue fill less than half of it (rows spread over many
    /// stores), more may be pending, and the queue has room.
    pub(super) fn wants_more_of(&self, plan: &Plan) -> bool {
        let batch = self.core.settings.batch_size.max(1);
        plan.target
            .store
            .as_ref()
            .is_some_and(|s| !self.ahead.done(s))
            && plan.room
            && plan.n_ops() * 2 < self.core.max_tuples
            && self.core.queue.len() < AHEAD_PAGES * batch
    }

    /// How many rows to read ahead for `plan`'s store: as many as fill its Write at the plan's
    /// operations per row (more would stay in the queue, and a queue full of such leftovers
    /// reads ahead for no other store).
    pub(super) fn ahead_for(&self, plan: &Plan) -> usize {
        let per_row = plan.n_ops().div_ceil(plan.rows.len().max(1)).max(1);
        (self.core.max_tuples - plan.n_ops())
            .div_ceil(per_row)
            .max(1)
    }

    /// Reads ahead the lowest pending rows of `store` (a store rows name) not in hand, into
    /// the queue: at most `limit`.
    pub(super) async fn read_ahead(
        &mut self,
        store: &Arc<str>,
        limit: usize,
    ) -> Result<(), StoreError> {
        let hand = self.core.hand();
        let conn = self.store.pool().get().await?;
        let rows = self
            .store
            .claim_store(&conn, store, &hand, limit as i64)
            .await?;
        let n = rows.len();
        let (_, stopped) = self.queue_rows(&conn, rows, &mut false).await?;
        self.ahead.0.insert(store.clone(), stopped || n < limit);
        Ok(())
    }
}

/// The lane a row's payload puts it in, as the reads count it (`payload->>'store_id'`, `''`
/// for none): `None` for the rows naming none (no `store_id`, null, `""`, or a payload that is
/// not JSON).
enum Lane {
    /// A string: maybe the configured store's id.
    Id(Arc<str>),
    /// Any other value (a number, an object...), by its JSON text: no store's id, so no row
    /// that can be delivered is in its lane (where PostgreSQL spells the value otherwise, the
    /// bar is in a lane of its own and holds up nothing).
    Other(Arc<str>),
}

fn lane_named(text: &str) -> Option<Lane> {
    let value = serde_json::from_str::<serde_json::Value>(text).ok()?;
    match value.get("store_id")? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) if s.is_empty() => None,
        serde_json::Value::String(s) => Some(Lane::Id(Arc::from(s.as_str()))),
        other => Some(Lane::Other(Arc::from(other.to_string()))),
    }
}
