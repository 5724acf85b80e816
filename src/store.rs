//! Every statement the relay runs against the outbox, from the files in `sql/queries/`.

use crate::config::TableName;
use crate::payload::TupleKey;
use crate::schema::render;
use deadpool_postgres::{GenericClient, Pool};
use std::time::SystemTime;
use tokio_postgres::Statement;

/// How long a Write's mark waits for a row another session holds, or for the table behind a lock
/// queued for it (each such wait: PostgreSQL's `lock_timeout` does not add them up), before the
/// Write locks its rows the way that skips a held row (see
/// [`Store::begin_and_mark`]). Rows are held by another session only by an operator's
/// transaction or a relay that lost leadership, and after one such wait the relay marks no
/// Write this way for a while. Brief table locks should come and go within it (autovacuum
/// cutting empty pages off the table's end looks for waiters every 20 ms and then gives way,
/// and a lock `FOR UPDATE` waits for it too; `reconcile --repair` holds its lock for its
/// insert): at 5 ms, some of the benchmark's burn-downs saw 7 to 11 of their 400 Writes give up
/// at once, which looked like such a lock (not confirmed).
pub const MARK_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// What became of a note on a pending row ([`Store::record_skipped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Noted {
    /// Written (or there already).
    Written,
    /// Not written: another session holds the row.
    HeldElsewhere,
    /// Not written: the row is no longer pending (delivered, dead-lettered or deleted).
    Gone,
}

/// A row as claimed for delivery.
#[derive(Debug)]
pub struct ClaimedRow {
    pub id: i64,
    /// The payload's JSON text, or why it could not be read (e.g. not UTF-8 in a database
    /// whose encoding is not).
    pub payload: Result<String, String>,
    pub created_at: SystemTime,
    pub attempts: i32,
    /// When it came back from dead (`retried_at`), if it did: its operations may be superseded.
    pub retried: Option<SystemTime>,
}

/// Counts by state, as `status` prints them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StatusCounts {
    pub pending: i64,
    pub dead: i64,
    pub delivered: i64,
    pub oldest_pending_age_seconds: Option<f64>,
    /// Old row versions not yet vacuumed away, as the statistics have it (each delivered row
    /// leaves one, which every claim walks past until VACUUM removes it); `None`: no statistics
    /// on the table yet.
    pub dead_row_versions: Option<i64>,
    /// Since the table was last vacuumed (by hand or by autovacuum); `None`: never, or no
    /// statistics yet.
    pub last_vacuum_age_seconds: Option<f64>,
}

/// What one batch of `prune` did (prune.sql).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneBatch {
    pub deleted: u64,
    /// The delivered rows old enough that it looked at: fewer than the batch size in the last.
    pub looked_at: u64,
    /// The last of them: where the next batch starts.
    pub last: Option<i64>,
    /// The first row delivered out of id order (it came back from dead) that prune keeps: no
    /// row from it up is deleted. None when there is none.
    pub kept_from: Option<i64>,
    /// The rows it kept on the tuples of dead rows below them, which `retry` needs to skip what
    /// they superseded.
    pub held: u64,
    /// The lowest of those dead rows.
    pub held_by: Option<i64>,
    /// The rows it kept for them (and for the rows kept before, on their tuples): what the next
    /// batch keeps the later rows on their tuples for.
    pub held_ids: Vec<i64>,
}

/// One store's rows not yet delivered, as `status --json` lists them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoreCounts {
    /// The store the rows name; `None`: rows naming none (the relay's configured store).
    pub store_id: Option<String>,
    pub pending: i64,
    pub dead: i64,
}

/// The rows pending when `drain` started: their ids' range (none pending: `None`), when, and the
/// rows of that range already dead then.
#[derive(Debug, Clone)]
pub struct DrainStart {
    pub ids: Option<(i64, i64)>,
    pub at: SystemTime,
    /// Dead at the start: not among the rows the drain counts dead (whatever their `failed_at`
    /// says, since a transaction's clock is when it began, not when it committed).
    pub dead: Vec<i64>,
}

/// What became of the rows pending when `drain` started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainOutcome {
    pub delivered: i64,
    pub dead: i64,
    pub pending: i64,
}

/// A dead row and the error that killed it, as `status` and `drain` show them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadRow {
    pub id: i64,
    pub last_error: Option<String>,
}

/// A dead row as `retry --dry-run` reads it.
#[derive(Debug, Clone)]
pub struct DeadPayload {
    pub id: i64,
    /// The payload's JSON text, or why it could not be read.
    pub payload: Result<String, String>,
    pub last_error: Option<String>,
}

/// Dead rows of one kind of failure, as `status` counts them (`dead_reasons.sql`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadReason {
    /// The error's words before its first colon.
    pub reason: String,
    pub rows: i64,
    pub newest_id: i64,
}

/// Which dead rows [`Store::dead_newest`] lists.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadFilter<'a> {
    /// Of ids in this range.
    pub ids: Option<(i64, i64)>,
    /// But for these.
    pub except: &'a [i64],
}

/// What a row is, for `retry` to say why it left one as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowState {
    Pending,
    Delivered,
    /// Dead, naming this store (`None`: none).
    Dead(Option<String>),
}

/// What the metrics endpoint measures at each scrape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PendingCounts {
    pub pending: i64,
    pub oldest_pending_age_seconds: Option<f64>,
    pub dead: i64,
}

/// The SQL of `sql/queries/`, with the table name substituted once.
#[derive(Debug)]
struct Queries {
    claim: String,
    claim_locked: String,
    claim_lanes: String,
    claim_store: String,
    claim_trusted: String,
    claim_below: String,
    refresh: String,
    lock: String,
    lock_by_marking: String,
    unmark: String,
    mark_delivered: String,
    mark_finished: String,
    record_failure: String,
    dead_letter: String,
    status: String,
    pending: String,
    retry_dead: String,
    retry_ids: String,
    prune: String,
    pending_through: String,
    max_pending: String,
    superseded: String,
    record_skipped: String,
    dead_rows: String,
    status_stores: String,
    drain_start: String,
    drain_outcome: String,
    dead_newest: String,
    dead_reasons: String,
    row_states: String,
}

/// The outbox, through the pool.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    table: TableName,
    q: std::sync::Arc<Queries>,
}

impl Store {
    pub fn new(pool: Pool, table: TableName) -> Store {
        let r = |sql: &str| render(sql, &table);
        let q = Queries {
            claim: r(include_str!("../sql/queries/claim.sql")),
            claim_locked: r(include_str!("../sql/queries/claim_locked.sql")),
            claim_lanes: r(include_str!("../sql/queries/claim_lanes.sql")),
            claim_store: r(include_str!("../sql/queries/claim_store.sql")),
            claim_trusted: r(include_str!("../sql/queries/claim_trusted.sql")),
            claim_below: r(include_str!("../sql/queries/claim_below.sql")),
            refresh: r(include_str!("../sql/queries/refresh.sql")),
            lock: r(include_str!("../sql/queries/lock.sql")),
            lock_by_marking: r(include_str!("../sql/queries/lock_by_marking.sql")),
            unmark: r(include_str!("../sql/queries/unmark.sql")),
            mark_delivered: r(include_str!("../sql/queries/mark_delivered.sql")),
            mark_finished: r(include_str!("../sql/queries/mark_finished.sql")),
            record_failure: r(include_str!("../sql/queries/record_failure.sql")),
            dead_letter: r(include_str!("../sql/queries/dead_letter.sql")),
            status: r(include_str!("../sql/queries/status.sql")),
            pending: r(include_str!("../sql/queries/pending.sql")),
            retry_dead: r(include_str!("../sql/queries/retry_dead.sql")),
            retry_ids: r(include_str!("../sql/queries/retry_ids.sql")),
            prune: r(include_str!("../sql/queries/prune.sql")),
            pending_through: r(include_str!("../sql/queries/pending_through.sql")),
            max_pending: r(include_str!("../sql/queries/max_pending.sql")),
            superseded: r(include_str!("../sql/queries/superseded.sql")),
            record_skipped: r(include_str!("../sql/queries/record_skipped.sql")),
            dead_rows: r(include_str!("../sql/queries/dead_rows.sql")),
            status_stores: r(include_str!("../sql/queries/status_stores.sql")),
            drain_start: r(include_str!("../sql/queries/drain_start.sql")),
            drain_outcome: r(include_str!("../sql/queries/drain_outcome.sql")),
            dead_newest: r(include_str!("../sql/queries/dead_newest.sql")),
            dead_reasons: r(include_str!("../sql/queries/dead_reasons.sql")),
            row_states: r(include_str!("../sql/queries/row_states.sql")),
        };
        Store {
            pool,
            table,
            q: std::sync::Arc::new(q),
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Opens a Write's transaction on `conn` and locks its rows `ids` in it (lock.sql), in one
    /// round trip: a row another session holds is skipped, not waited for. Returns the ids
    /// locked, with their payloads as locked.
    pub async fn begin_and_lock(
        &self,
        conn: &deadpool_postgres::Client,
        ids: &[i64],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let stmt = conn.prepare_cached(&self.q.lock).await?;
        Self::begin_and_query(conn, &stmt, &[&ids]).await
    }

    /// Opens a Write's transaction on `conn` and marks its rows `ids` delivered in it
    /// (lock_by_marking.sql), in one round trip: the mark is the Write's lock, committed only
    /// once OpenFGA accepts the Write. An UPDATE cannot skip a row another session holds, so it
    /// waits for one (or for a table lock queued ahead of it) no longer than [`MARK_LOCK_WAIT`]:
    /// `None` then, the transaction rolled back. Otherwise the ids marked, with their payloads
    /// as marked.
    pub async fn begin_and_mark(
        &self,
        conn: &deadpool_postgres::Client,
        ids: &[i64],
    ) -> Result<Option<Vec<tokio_postgres::Row>>, tokio_postgres::Error> {
        let stmt = conn.prepare_cached(&self.q.lock_by_marking).await?;
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'; SET LOCAL fga_relay.marking = on",
            MARK_LOCK_WAIT.as_millis()
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (begun, rows) = tokio::join!(conn.batch_execute(&begin), conn.query(&stmt, &params));
        begun?;
        match rows {
            Ok(rows) => Ok(Some(rows)),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                conn.batch_execute("ROLLBACK").await?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The statement that takes back the mark of rows marked as their Write left
    /// (unmark.sql), prepared on `client` (once per connection).
    pub async fn unmark_statement(
        &self,
        client: &deadpool_postgres::Client,
    ) -> Result<Statement, tokio_postgres::Error> {
        client.prepare_cached(&self.q.unmark).await
    }

    /// The statement that marks a Write's rows delivered, prepared on `client` (once per
    /// connection).
    pub async fn mark_statement(
        &self,
        client: &deadpool_postgres::Client,
    ) -> Result<Statement, tokio_postgres::Error> {
        client.prepare_cached(&self.q.mark_delivered).await
    }

    /// Reads the lowest pending rows not among `held` (the ids the relay holds), leaving out the
    /// rows of the stores `closed` names (`""`: the rows naming none), nothing locked.
    pub async fn claim(
        &self,
        tx: &impl GenericClient,
        held: &[i64],
        closed: &[&str],
        limit: i64,
    ) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.claim).await?;
        Self::claimed(tx.query(&stmt, &[&held, &closed, &limit]).await?)
    }

    /// Reads the lowest pending rows of the lanes not in `closed` (as [`Store::claim`] matches
    /// them) not among `held`, walking no further than a bound in id order, then each lane
    /// through an index of its own, so that the rows of the lanes left out are not walked past
    /// (claim_lanes.sql; nothing locked): at most `limit`, shared among the lanes with rows
    /// pending. `configured`: the configured store's id, whose rows are in one lane with the
    /// rows naming none.
    pub async fn claim_lanes(
        &self,
        tx: &impl GenericClient,
        held: &[i64],
        closed: &[&str],
        limit: i64,
        configured: &str,
        lanes_only: bool,
    ) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.claim_lanes).await?;
        Self::claimed(
            tx.query(&stmt, &[&held, &closed, &limit, &configured, &lanes_only])
                .await?,
        )
    }

    /// Reads the lowest pending rows not among `held` of the lanes of `stores` (`""`: the
    /// configured store's, whose id is `configured`), each from its own index
    /// (claim_trusted.sql; nothing locked): at most `limit`, shared among them.
    pub async fn claim_trusted(
        &self,
        tx: &impl GenericClient,
        held: &[i64],
        stores: &[&str],
        limit: i64,
        configured: &str,
    ) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.claim_trusted).await?;
        Self::claimed(
            tx.query(&stmt, &[&held, &stores, &limit, &configured])
                .await?,
        )
    }

    /// Reads ahead the lowest pending rows of `store` (a store rows name) not among `held`
    /// (nothing locked).
    pub async fn claim_store(
        &self,
        tx: &impl GenericClient,
        store: &str,
        held: &[i64],
        limit: i64,
    ) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.claim_store).await?;
        Self::claimed(tx.query(&stmt, &[&store, &held, &limit]).await?)
    }

    /// Reads the lowest pending rows of the lane whose store keys are `keys` below row `below`,
    /// not among `held` (claim_below.sql; nothing locked).
    pub async fn claim_below(
        &self,
        tx: &impl GenericClient,
        below: i64,
        keys: &[&str],
        held: &[i64],
        limit: i64,
    ) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.claim_below).await?;
        Self::claimed(tx.query(&stmt, &[&below, &keys, &held, &limit]).await?)
    }

    /// Opens a transaction on `conn` and reads the lowest pending rows in it as [`Store::claim`]
    /// does, locked as a Write's rows are (claim_locked.sql). `None` when another session holds
    /// one of them: the transaction is then rolled back.
    pub async fn claim_locked(
        &self,
        conn: &deadpool_postgres::Client,
        held: &[i64],
        closed: &[&str],
        limit: i64,
    ) -> Result<Option<Vec<ClaimedRow>>, tokio_postgres::Error> {
        let stmt = conn.prepare_cached(&self.q.claim_locked).await?;
        match Self::begin_and_query(conn, &stmt, &[&held, &closed, &limit]).await {
            Ok(rows) => Self::claimed(rows).map(Some),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                conn.batch_execute("ROLLBACK").await?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// What has become of rows a Write could not lock, or that could not be decoded: those
    /// still pending, as they are now (refresh.sql).
    pub async fn refresh(
        &self,
        tx: &impl GenericClient,
        ids: &[i64],
    ) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.refresh).await?;
        Self::claimed(tx.query(&stmt, &[&ids]).await?)
    }

    /// Opens a transaction on `conn` and runs `stmt` in it, in one round trip: tokio-postgres
    /// pipelines requests polled together, in the order they were first polled. A failed
    /// BEGIN is the error; otherwise the statement's result.
    pub async fn begin_and_query(
        conn: &deadpool_postgres::Client,
        stmt: &tokio_postgres::Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let (begun, rows) = tokio::join!(conn.batch_execute("BEGIN"), conn.query(stmt, params));
        begun?;
        rows
    }

    fn claimed(rows: Vec<tokio_postgres::Row>) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
        rows.into_iter()
            .map(|r| {
                Ok(ClaimedRow {
                    id: r.try_get(0)?,
                    payload: payload_text(&r, 1),
                    created_at: r.try_get(2)?,
                    attempts: r.try_get(3)?,
                    retried: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// Marks delivered the rows of `ids` (with `texts`, their payloads as read) that are still
    /// pending, say what was read, and no other session holds; returns the ids marked.
    pub async fn mark_finished(
        &self,
        tx: &impl GenericClient,
        ids: &[i64],
        texts: &[&str],
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let stmt = tx.prepare_cached(&self.q.mark_finished).await?;
        tx.query(&stmt, &[&ids, &texts])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect()
    }

    pub async fn record_failure(
        &self,
        tx: &impl GenericClient,
        ids: &[i64],
        error: &str,
    ) -> Result<u64, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.record_failure).await?;
        tx.execute(&stmt, &[&ids, &error]).await
    }

    /// Gives up on row `id`, if it is still pending, not held by another session, and (when
    /// `read` is given) still has the payload the relay read. Returns whether it did.
    pub async fn dead_letter(
        &self,
        tx: &impl GenericClient,
        id: i64,
        reason: &str,
        read: Option<&str>,
    ) -> Result<bool, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.dead_letter).await?;
        Ok(tx.execute(&stmt, &[&id, &reason, &read]).await? > 0)
    }

    /// The operations of row `id` (given by their tuple keys, in order) that a later delivered
    /// row of the same store supersedes: each one's index and that row's id (superseded.sql).
    /// `store`: the row's store (`""` for the configured one, whose id is `configured` when
    /// known).
    pub async fn superseded(
        &self,
        tx: &impl GenericClient,
        id: i64,
        keys: &[&TupleKey],
        store: &str,
        configured: Option<&str>,
    ) -> Result<Vec<(usize, i64)>, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.superseded).await?;
        let objects: Vec<&str> = keys.iter().map(|k| k.object.as_str()).collect();
        let relations: Vec<&str> = keys.iter().map(|k| k.relation.as_str()).collect();
        let users: Vec<&str> = keys.iter().map(|k| k.user.as_str()).collect();
        tx.query(
            &stmt,
            &[&id, &objects, &relations, &users, &store, &configured],
        )
        .await?
        .iter()
        .map(|r| {
            let n: i32 = r.try_get(0)?;
            Ok((usize::try_from(n - 1).unwrap_or(0), r.try_get(1)?))
        })
        .collect()
    }

    /// Records on a pending row what the relay skips of it, without counting an attempt.
    pub async fn record_skipped(
        &self,
        tx: &impl GenericClient,
        id: i64,
        what: &str,
    ) -> Result<Noted, tokio_postgres::Error> {
        let stmt = tx.prepare_cached(&self.q.record_skipped).await?;
        let row = tx.query_one(&stmt, &[&id, &what]).await?;
        Ok(
            match (row.try_get::<_, bool>("held")?, row.try_get("pending")?) {
                (true, _) => Noted::Written,
                (false, true) => Noted::HeldElsewhere,
                (false, false) => Noted::Gone,
            },
        )
    }

    /// Dead rows (all, or those of `ids`; of every store, or of `store`: see
    /// [`crate::payload::store_filter`]), in id order, with their payloads as text and the
    /// error that killed each.
    pub async fn dead_rows(
        &self,
        ids: Option<&[i64]>,
        store: Option<&str>,
    ) -> Result<Vec<DeadPayload>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client.query(&self.q.dead_rows, &[&ids, &store]).await?;
        Ok(rows
            .iter()
            .map(|r| {
                let payload = payload_text(r, 1);
                Ok(DeadPayload {
                    id: r.try_get(0)?,
                    payload,
                    last_error: r.try_get(2)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()?)
    }

    pub async fn status(&self) -> Result<StatusCounts, StoreError> {
        let now = self.status_pending().await?;
        let client = self.pool.get().await?;
        let row = client.query_one(&self.q.status, &[]).await?;
        Ok(StatusCounts {
            pending: now.pending,
            dead: now.dead,
            delivered: row.try_get(0)?,
            oldest_pending_age_seconds: now.oldest_pending_age_seconds,
            dead_row_versions: row.try_get(1)?,
            last_vacuum_age_seconds: row.try_get(2)?,
        })
    }

    /// Pending rows, the age of the oldest and dead rows: cheap enough for every scrape.
    pub async fn status_pending(&self) -> Result<PendingCounts, StoreError> {
        let client = self.pool.get().await?;
        let row = client.query_one(&self.q.pending, &[]).await?;
        Ok(PendingCounts {
            pending: row.try_get(0)?,
            oldest_pending_age_seconds: row.try_get(1)?,
            dead: row.try_get(2)?,
        })
    }

    /// Sends dead rows back to pending: all of them, or the given ids; of every store, or of
    /// `store`. Returns the ids sent back with the error that had killed each.
    pub async fn retry(
        &self,
        ids: Option<&[i64]>,
        store: Option<&str>,
    ) -> Result<Vec<(i64, Option<String>)>, StoreError> {
        let client = self.pool.get().await?;
        let rows = match ids {
            None => client.query(&self.q.retry_dead, &[&store]).await?,
            Some(ids) => client.query(&self.q.retry_ids, &[&ids, &store]).await?,
        };
        let mut out = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<(i64, Option<String>)>, tokio_postgres::Error>>()?;
        out.sort_by_key(|(id, _)| *id);
        if !out.is_empty() {
            // Wake the relay: rows made pending by an UPDATE fire no insert trigger, and would
            // otherwise wait for the sweep.
            client
                .execute(
                    "SELECT pg_notify($1, to_regclass($1)::oid::text)",
                    &[&self.table.as_str()],
                )
                .await?;
        }
        Ok(out)
    }

    /// Deletes one batch of delivered rows older than `cutoff` (of every store, or of `store`),
    /// of ids above `after`, but for those a retry or `reconcile` needs (prune.sql).
    pub async fn prune_batch(
        &self,
        cutoff: SystemTime,
        batch: i64,
        store: Option<&str>,
        configured: Option<&str>,
        after: i64,
        kept: &[i64],
    ) -> Result<PruneBatch, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                &self.q.prune,
                &[&cutoff, &batch, &store, &configured, &after, &kept],
            )
            .await?;
        let count = |i: usize| -> Result<u64, tokio_postgres::Error> {
            Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
        };
        Ok(PruneBatch {
            deleted: count(0)?,
            looked_at: count(1)?,
            last: row.try_get(2)?,
            kept_from: row.try_get(3)?,
            held: count(4)?,
            held_by: row.try_get(5)?,
            held_ids: row.try_get(6)?,
        })
    }

    /// Pending and dead rows per store (status_stores.sql), the most pending first.
    pub async fn status_stores(&self) -> Result<Vec<StoreCounts>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client.query(&self.q.status_stores, &[]).await?;
        Ok(rows
            .iter()
            .map(|r| {
                Ok(StoreCounts {
                    store_id: r.try_get(0)?,
                    pending: r.try_get(1)?,
                    dead: r.try_get(2)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()?)
    }

    /// The rows pending now, for `drain`'s report (`drain_start.sql`).
    pub async fn drain_start(&self) -> Result<DrainStart, StoreError> {
        let client = self.pool.get().await?;
        let row = client.query_one(&self.q.drain_start, &[]).await?;
        let (lo, hi): (Option<i64>, Option<i64>) = (row.try_get(0)?, row.try_get(1)?);
        Ok(DrainStart {
            ids: lo.zip(hi),
            at: row.try_get(2)?,
            dead: row.try_get(3)?,
        })
    }

    /// What became of the rows pending at `start` (`drain_outcome.sql`).
    pub async fn drain_outcome(&self, start: &DrainStart) -> Result<DrainOutcome, StoreError> {
        let Some((lo, hi)) = start.ids else {
            return Ok(DrainOutcome::default());
        };
        let client = self.pool.get().await?;
        let row = client
            .query_one(&self.q.drain_outcome, &[&lo, &hi, &start.at, &start.dead])
            .await?;
        Ok(DrainOutcome {
            delivered: row.try_get(0)?,
            dead: row.try_get(1)?,
            pending: row.try_get(2)?,
        })
    }

    /// The `limit` most recently dead rows that `filter` takes (`dead_newest.sql`).
    pub async fn dead_newest(
        &self,
        filter: DeadFilter<'_>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        let client = self.pool.get().await?;
        let (lo, hi) = filter.ids.unzip();
        let rows = client
            .query(&self.q.dead_newest, &[&filter.except, &lo, &hi, &limit])
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                Ok(DeadRow {
                    id: r.try_get(0)?,
                    last_error: r.try_get(1)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()?)
    }

    /// Dead rows by kind of failure, the most rows first, at most `limit` kinds
    /// (`dead_reasons.sql`).
    pub async fn dead_reasons(&self, limit: i64) -> Result<Vec<DeadReason>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client.query(&self.q.dead_reasons, &[&limit]).await?;
        Ok(rows
            .iter()
            .map(|r| {
                Ok(DeadReason {
                    reason: r.try_get(0)?,
                    rows: r.try_get(1)?,
                    newest_id: r.try_get(2)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()?)
    }

    /// What each of `ids` is (`row_states.sql`); an id that is no row is not in the answer.
    pub async fn row_states(&self, ids: &[i64]) -> Result<Vec<(i64, RowState)>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client.query(&self.q.row_states, &[&ids]).await?;
        Ok(rows
            .iter()
            .map(|r| {
                let state = if r.try_get::<_, bool>(1)? {
                    RowState::Delivered
                } else if r.try_get::<_, bool>(2)? {
                    RowState::Dead(r.try_get(3)?)
                } else {
                    RowState::Pending
                };
                Ok((r.try_get(0)?, state))
            })
            .collect::<Result<_, tokio_postgres::Error>>()?)
    }

    pub async fn max_pending_id(&self) -> Result<Option<i64>, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .query_one(&self.q.max_pending, &[])
            .await?
            .try_get(0)?)
    }

    pub async fn pending_through(&self, id: i64) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .query_one(&self.q.pending_through, &[&id])
            .await?
            .try_get(0)?)
    }
}

/// A failure to reach or use the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {}", crate::db::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
}

impl StoreError {
    /// Whether the server refused a write because it is read-only (a standby after a failover,
    /// or `default_transaction_read_only`): the connections must be made again, to a writable
    /// server.
    pub fn is_read_only(&self) -> bool {
        matches!(self, StoreError::Db(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION))
    }

    /// Whether waiting can fix it: a lost connection or a server restarting can; a missing
    /// privilege, table or database (SQLSTATE classes 42, 28, 3D) cannot.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Db(e) => e.code().is_none_or(|c| {
                let c = c.code();
                !(c.starts_with("42") || c.starts_with("28") || c.starts_with("3D"))
            }),
            StoreError::Pool(_) => true,
        }
    }
}

/// Column `i` of `r`, a payload as text, or why it is not: a database whose encoding is
/// `SQL_ASCII` stores whatever bytes it is given, and sends them as they are (see
/// `crate::db`), so a payload written in another encoding arrives as bytes that are not UTF-8.
fn payload_text(r: &tokio_postgres::Row, i: usize) -> Result<String, String> {
    r.try_get::<_, String>(i).map_err(|e| {
        match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::str::Utf8Error>()) {
            Some(why) => format!(
                "the payload is not UTF-8 text ({why}): the database stores bytes of any \
                 encoding as given; write the payload as UTF-8, then `fga-relay retry` the row"
            ),
            None => format!("the payload cannot be read: {e}"),
        }
    })
}
