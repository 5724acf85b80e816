//! The database side of `reconcile`: one dedicated session whose temporary tables hold what is
//! compared, the SQL of `sql/queries/reconcile_*.sql`, and the repair's inserts.

use super::compare::{Candidate, Finding, Kind, Repair, Summary, condition_value};
use super::progress::{Meter, Progress};
use super::report::Report;
use crate::config::DbSettings;
use crate::payload::TupleKey;
use crate::schema::render;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tracing::info;

/// Rows fetched from the comparison's cursor at a time.
pub(super) const CURSOR_PAGE: usize = 1000;
/// Drifted tuples gathered before they are recorded for `--repair` at once.
pub(super) const DRIFT_BATCH: usize = 1000;
/// How long to wait for transactions that were inserting rows when the check started.
pub(super) const WRITERS_WAIT: Duration = Duration::from_secs(60);

/// The SQL of `sql/queries/reconcile_*.sql`, with the table name substituted.
pub(super) struct Queries {
    pub(super) setup: String,
    pub(super) scope: String,
    pub(super) newest: String,
    pub(super) writers: String,
    pub(super) writers_left: String,
    pub(super) expected: String,
    pub(super) index: String,
    pub(super) delivered: String,
    pub(super) keys: String,
    pub(super) stores: String,
    pub(super) actual: String,
    pub(super) moved: String,
    pub(super) compare: String,
    pub(super) unknown: String,
    pub(super) drift: String,
    pub(super) lock: String,
    pub(super) recheck: String,
    pub(super) repair: String,
}

/// The session `reconcile` works in: one dedicated connection, whose temporary tables hold what
/// is compared.
pub(super) struct Db {
    pub(super) client: tokio_postgres::Client,
    pub(super) table: String,
    pub(super) q: Queries,
}

/// How long `--repair` waits for its lock on the table (`reconcile_lock.sql` sets it): new
/// writers queue behind the waiting lock, so the wait is kept shorter than other commands'.
const REPAIR_LOCK_WAIT: Duration = Duration::from_secs(5);

pub(super) fn db_error(what: &str, e: tokio_postgres::Error) -> anyhow::Error {
    let said = format!("{what}: {}", crate::db::describe(&e));
    if crate::db::is_lock_wait(&e) {
        return crate::db::LockWaited {
            said,
            waited: crate::db::COMMAND_LOCK_TIMEOUT,
        }
        .into();
    }
    anyhow::anyhow!(said)
}

impl Db {
    pub(super) async fn connect(db: &DbSettings) -> anyhow::Result<Db> {
        let cfg = crate::db::pg_config(db, "fga-relay reconcile")?;
        let (client, conn) = crate::db::connect_dedicated(&cfg)
            .await
            .map_err(|e| db_error("cannot connect to PostgreSQL", e))?;
        tokio::spawn(conn);
        // A lock another session holds (a table under LOCK, a long ALTER TABLE) fails a
        // statement after COMMAND_LOCK_TIMEOUT, instead of holding the check for as long as that
        // session keeps it; the command names the session.
        crate::db::bound_lock_waits(&client)
            .await
            .map_err(|e| db_error("cannot set up the session", e))?;
        crate::schema::check(&client, &db.table)
            .await
            .map_err(|e| match e {
                crate::schema::SchemaProblem::Db(e) => db_error("cannot check the schema", e),
                other => anyhow::anyhow!(other),
            })?;
        let r = |sql: &str| render(sql, &db.table);
        let q = Queries {
            setup: r(include_str!("../../sql/queries/reconcile_setup.sql")),
            scope: r(include_str!("../../sql/queries/reconcile_scope.sql")),
            newest: r(include_str!("../../sql/queries/reconcile_newest.sql")),
            writers: r(include_str!("../../sql/queries/reconcile_writers.sql")),
            writers_left: r(include_str!("../../sql/queries/reconcile_writers_left.sql")),
            expected: r(include_str!("../../sql/queries/reconcile_expected.sql")),
            index: r(include_str!("../../sql/queries/reconcile_index.sql")),
            delivered: r(include_str!("../../sql/queries/reconcile_delivered.sql")),
            keys: r(include_str!("../../sql/queries/reconcile_keys.sql")),
            stores: r(include_str!("../../sql/queries/reconcile_stores.sql")),
            actual: r(include_str!("../../sql/queries/reconcile_actual.sql")),
            moved: r(include_str!("../../sql/queries/reconcile_moved.sql")),
            compare: r(include_str!("../../sql/queries/reconcile_compare.sql")),
            unknown: r(include_str!("../../sql/queries/reconcile_unknown.sql")),
            drift: r(include_str!("../../sql/queries/reconcile_drift.sql")),
            lock: r(include_str!("../../sql/queries/reconcile_lock.sql")),
            recheck: r(include_str!("../../sql/queries/reconcile_recheck.sql")),
            repair: r(include_str!("../../sql/queries/reconcile_repair.sql")),
        };
        Ok(Db {
            client,
            table: db.table.to_string(),
            q,
        })
    }

    /// Creates the working tables; rows naming `configured` (the configured store's id) are
    /// that store's, as rows naming none.
    pub(super) async fn setup(&self, configured: &str) -> anyhow::Result<()> {
        self.client
            .execute(
                "SELECT set_config('fga_relay.configured_store', $1, false)",
                &[&configured],
            )
            .await
            .map_err(|e| db_error("cannot set the configured store", e))?;
        self.client
            .batch_execute(&self.q.setup)
            .await
            .map_err(|e| db_error("cannot create the working tables (TEMPORARY privilege?)", e))
    }

    /// The stores to read whole (reconcile_stores.sql), `""` the configured one.
    pub(super) async fn stores(&self, all: bool) -> anyhow::Result<Vec<String>> {
        let rows = self
            .client
            .query(&self.q.stores, &[&all])
            .await
            .map_err(|e| db_error("cannot list the stores to read", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The first id of the rows created within `d`: the rows after the last one older.
    pub(super) async fn first_row_since(&self, d: Duration) -> anyhow::Result<i64> {
        let row = self
            .client
            .query_opt(&self.q.scope, &[&d.as_secs_f64()])
            .await
            .map_err(|e| db_error("cannot find the rows of --since", e))?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0) + 1))
    }

    pub(super) async fn newest_row(&self) -> anyhow::Result<i64> {
        match self.client.query_one(&self.q.newest, &[]).await {
            Ok(row) => Ok(row.get(0)),
            Err(e) => Err(self.read_failure(e).await),
        }
    }

    /// The outbox's first read failed: with the grant it needs when the role may not read it.
    async fn read_failure(&self, e: tokio_postgres::Error) -> anyhow::Error {
        let denied = e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE);
        let role = match denied {
            true => {
                self.client
                    .query_one("SELECT current_user::text", &[])
                    .await
            }
            false => return db_error("cannot read the outbox", e),
        };
        let who = role
            .ok()
            .and_then(|r| r.try_get::<_, String>(0).ok())
            .unwrap_or_else(|| "its role".to_owned());
        anyhow::anyhow!(
            "cannot read the outbox: {}; reconcile reads {table}: GRANT SELECT ON {table} TO \
             {who}, or run it as the relay's role or the table's owner (--repair also inserts \
             and locks the table: as the owner)",
            crate::db::describe(&e),
            table = self.table,
        )
    }

    /// Waits until every transaction that may be inserting rows into the outbox now has ended,
    /// so that no row at or below the newest id seen before can still appear. Never blocks
    /// anyone: it only looks at `pg_locks`.
    pub(super) async fn wait_for_writers(&self) -> anyhow::Result<()> {
        let rows = self
            .client
            .query(&self.q.writers, &[])
            .await
            .map_err(|e| db_error("cannot list the outbox's writers", e))?;
        if rows.is_empty() {
            return Ok(());
        }
        let vxids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let deadline = Instant::now() + WRITERS_WAIT;
        loop {
            let left: i64 = self
                .client
                .query_one(&self.q.writers_left, &[&vxids])
                .await
                .map_err(|e| db_error("cannot watch the outbox's writers", e))?
                .get(0);
            if left == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let pids: Vec<String> = rows
                    .iter()
                    .map(|r| r.get::<_, Option<i32>>(1).unwrap_or(0).to_string())
                    .collect();
                anyhow::bail!(
                    "transactions writing to {} have stayed open for over {WRITERS_WAIT:?} \
                     (pid {}); reconcile needs them committed to know what the outbox says",
                    self.table,
                    pids.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Fills `reconcile_expected` from rows `from..=through` (of store `only` alone, if given);
    /// returns how many tuples.
    pub(super) async fn expected(
        &self,
        from: i64,
        through: i64,
        only: Option<&str>,
    ) -> anyhow::Result<u64> {
        let n = self
            .client
            .execute(&self.q.expected, &[&from, &through, &only])
            .await
            .map_err(|e| db_error("cannot compute the expected state", e))?;
        self.client
            .batch_execute(&self.q.index)
            .await
            .map_err(|e| db_error("cannot index the expected state", e))?;
        Ok(n)
    }

    pub(super) async fn delivered_tuples(&self) -> anyhow::Result<u64> {
        let n: i64 = self
            .client
            .query_one(&self.q.delivered, &[])
            .await
            .map_err(|e| db_error("cannot count the compared tuples", e))?
            .get(0);
        Ok(n as u64)
    }

    /// The next `limit` compared tuples after `after`, in (store, key) order, with their
    /// store.
    pub(super) async fn keys_after(
        &self,
        after: &(String, TupleKey),
        limit: i64,
    ) -> anyhow::Result<Vec<(String, TupleKey)>> {
        let (store, k) = after;
        let rows = self
            .client
            .query(
                &self.q.keys,
                &[store, &k.object, &k.relation, &k.user, &limit],
            )
            .await
            .map_err(|e| db_error("cannot read the compared tuples", e))?;
        Ok(rows
            .iter()
            .map(|r| {
                let key = TupleKey {
                    object: r.get(1),
                    relation: r.get(2),
                    user: r.get(3),
                };
                (r.get(0), key)
            })
            .collect())
    }

    /// Records tuples read from OpenFGA's `store`; returns how many the outbox does not speak
    /// of.
    pub(super) async fn record_actual(
        &self,
        store: &str,
        tuples: &[crate::openfga::ReadTuple],
        keep_unknown: bool,
    ) -> anyhow::Result<u64> {
        if tuples.is_empty() {
            return Ok(0);
        }
        let (objects, relations, users) = key_columns(tuples.iter().map(|t| &t.key));
        let conditions: Vec<Option<Value>> = tuples
            .iter()
            .map(|t| t.condition.as_ref().map(condition_value))
            .collect();
        let unknown: i64 = self
            .client
            .query_one(
                &self.q.actual,
                &[
                    &store,
                    &objects,
                    &relations,
                    &users,
                    &conditions,
                    &keep_unknown,
                ],
            )
            .await
            .map_err(|e| db_error("cannot record what OpenFGA holds", e))?
            .get(0);
        Ok(unknown as u64)
    }

    /// Records the tuples that rows after `through` touch.
    pub(super) async fn moved_since(&self, through: i64) -> anyhow::Result<()> {
        self.client
            .execute(&self.q.moved, &[&through])
            .await
            .map_err(|e| db_error("cannot read the rows that arrived while checking", e))?;
        Ok(())
    }

    /// Streams the tuples not plainly in step through a cursor, reports each, counts them, and
    /// records the drift for `--repair`.
    pub(super) async fn compare(
        &mut self,
        out: &mut Report,
        summary: &mut Summary,
        record_drift: bool,
    ) -> anyhow::Result<()> {
        let mut progress = Progress::start("comparing", Meter::Time);
        let what = "cannot compare";
        let mut cursor = Cursor::open(&mut self.client, &self.q.compare, what).await?;
        let mut drift: Vec<Finding> = Vec::new();
        let mut not_plain = 0u64;
        loop {
            let rows = cursor.next().await?;
            if rows.is_empty() {
                break;
            }
            progress.add(rows.len() as u64);
            not_plain += rows.len() as u64;
            for r in rows {
                // The conditions come from outbox payloads: a context jsonb holds but JSON
                // cannot (a number beyond a double) ends the check with an error, not a panic.
                let c = (|| {
                    Ok::<_, tokio_postgres::Error>(Candidate {
                        key: TupleKey {
                            object: r.try_get(0)?,
                            relation: r.try_get(1)?,
                            user: r.try_get(2)?,
                        },
                        present: r.try_get(3)?,
                        condition: r.try_get(4)?,
                        row: r.try_get(5)?,
                        state: r.try_get(6)?,
                        held: r.try_get(7)?,
                        held_condition: r.try_get(8)?,
                        moved: r.try_get(9)?,
                        store: r.try_get(10)?,
                    })
                })()
                .map_err(|e| db_error(what, e))?;
                let Some(finding) = summary.classify(c) else {
                    continue;
                };
                progress.suspend(|| out.finding(&finding))?;
                if record_drift && finding.kind.is_drift() {
                    drift.push(finding);
                }
            }
            if drift.len() >= DRIFT_BATCH {
                record_drift_batch(&cursor.tx, &self.q.drift, &drift).await?;
                drift.clear();
            }
        }
        record_drift_batch(&cursor.tx, &self.q.drift, &drift).await?;
        cursor.close().await?;
        // The tuples the query did not return are in step; classify counted the others.
        summary.in_step += summary.tuples.saturating_sub(not_plain);
        progress.finish();
        Ok(())
    }

    /// Reports the tuples OpenFGA holds that the outbox does not speak of (`--all`).
    pub(super) async fn list_unknown(&mut self, out: &mut Report) -> anyhow::Result<()> {
        let what = "cannot list the other tuples";
        let mut cursor = Cursor::open(&mut self.client, &self.q.unknown, what).await?;
        loop {
            let rows = cursor.next().await?;
            if rows.is_empty() {
                break;
            }
            for r in rows {
                out.finding(&Finding {
                    store: r.get(4),
                    kind: Kind::Unknown,
                    key: TupleKey {
                        object: r.get(0),
                        relation: r.get(1),
                        user: r.get(2),
                    },
                    row: None,
                    condition: None,
                    held_condition: r.get(3),
                })?;
            }
        }
        cursor.close().await
    }

    /// Enqueues the corrections of the recorded drift, in one transaction: under a SHARE ROW
    /// EXCLUSIVE lock (no writer halfway through an insert, the relay's claims unhindered), it
    /// drops the tuples that rows after `through` touch (the application changed them while we
    /// checked: correcting them now would override it), then inserts the delete rows, then the
    /// write rows, so that a tuple whose condition differs is deleted before it is written.
    pub(super) async fn repair(
        &mut self,
        through: i64,
        max_tuples: usize,
    ) -> anyhow::Result<Repair> {
        // Writers in flight hold the lock up; waiting for them first keeps the lock short.
        self.wait_for_writers().await?;
        let q = &self.q;
        let tx = self
            .client
            .transaction()
            .await
            .map_err(|e| db_error("cannot repair", e))?;
        if let Err(e) = tx.batch_execute(&q.lock).await {
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
                // Writers in flight were waited for above: a session holding the table (an
                // operator's LOCK, a long transaction's) or a stream of new writers. Said with
                // the sessions that held it, as every command's lock wait is.
                return Err(crate::db::LockWaited {
                    said: format!("cannot lock {} for the repair", self.table),
                    waited: REPAIR_LOCK_WAIT,
                }
                .into());
            }
            if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
                let denied = crate::db::describe(&e);
                // Rolled back as it drops, before the owner is looked up on its session.
                drop(tx);
                let owner = match crate::db::probe::table_owner(&self.client, &self.table).await {
                    Ok(Some(owner)) => format!(", role {owner}"),
                    _ => String::new(),
                };
                anyhow::bail!(
                    "cannot lock {table} for the repair: {denied}: --repair locks the table and \
                     inserts its corrections, which the relay's role may not (by design): run \
                     reconcile --repair as the owner of {table}{owner}; nothing was enqueued",
                    table = self.table
                );
            }
            return Err(db_error("cannot lock the outbox for the repair", e));
        }
        let left_alone = tx
            .execute(&q.recheck, &[&through])
            .await
            .map_err(|e| db_error("cannot check the rows that arrived while checking", e))?;
        let mut repair = Repair {
            left_alone,
            ..Repair::default()
        };
        for kind in ["deletes", "writes"] {
            let r = tx
                .query_one(&q.repair, &[&kind, &(max_tuples as i64)])
                .await
                .map_err(|e| db_error("cannot enqueue the corrections", e))?;
            let rows: i64 = r.get(0);
            if rows == 0 {
                continue;
            }
            repair.rows += rows as u64;
            repair.operations += r.get::<_, i64>(1) as u64;
            let (first, last): (i64, i64) = (r.get(2), r.get(3));
            repair.first_id.get_or_insert(first);
            repair.last_id = Some(last);
        }
        tx.commit()
            .await
            .map_err(|e| db_error("cannot enqueue the corrections", e))?;
        info!(
            rows = repair.rows,
            operations = repair.operations,
            left_alone = repair.left_alone,
            "corrective rows enqueued"
        );
        Ok(repair)
    }
}

/// A query read [`CURSOR_PAGE`] rows at a time, in a transaction of its own.
pub(super) struct Cursor<'a> {
    pub(super) tx: tokio_postgres::Transaction<'a>,
    /// What failed, for the error message.
    pub(super) what: &'static str,
}

impl<'a> Cursor<'a> {
    pub(super) async fn open(
        client: &'a mut tokio_postgres::Client,
        sql: &str,
        what: &'static str,
    ) -> anyhow::Result<Cursor<'a>> {
        let tx = client.transaction().await.map_err(|e| db_error(what, e))?;
        tx.batch_execute(&format!(
            "DECLARE reconcile_cursor NO SCROLL CURSOR FOR\n{sql}"
        ))
        .await
        .map_err(|e| db_error(what, e))?;
        Ok(Cursor { tx, what })
    }

    /// The next rows; none at the end.
    pub(super) async fn next(&mut self) -> anyhow::Result<Vec<tokio_postgres::Row>> {
        self.tx
            .query(&format!("FETCH {CURSOR_PAGE} FROM reconcile_cursor"), &[])
            .await
            .map_err(|e| db_error(self.what, e))
    }

    pub(super) async fn close(self) -> anyhow::Result<()> {
        let what = self.what;
        self.tx.commit().await.map_err(|e| db_error(what, e))
    }
}

/// The object, relation and user columns of keys, for `unnest`.
pub(super) fn key_columns<'a>(
    keys: impl Iterator<Item = &'a TupleKey>,
) -> (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for k in keys {
        columns.0.push(k.object.as_str());
        columns.1.push(k.relation.as_str());
        columns.2.push(k.user.as_str());
    }
    columns
}

pub(super) async fn record_drift_batch(
    tx: &tokio_postgres::Transaction<'_>,
    sql: &str,
    drift: &[Finding],
) -> anyhow::Result<()> {
    if drift.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = drift.iter().map(|f| f.kind.as_str()).collect();
    let (objects, relations, users) = key_columns(drift.iter().map(|f| &f.key));
    let conditions: Vec<&Option<Value>> = drift.iter().map(|f| &f.condition).collect();
    let stores: Vec<&str> = drift.iter().map(|f| f.store.as_str()).collect();
    let params: [&(dyn ToSql + Sync); 6] =
        [&kinds, &objects, &relations, &users, &conditions, &stores];
    tx.execute(sql, &params)
        .await
        .map_err(|e| db_error("cannot record the drift", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait the repair's message names is the one its lock statement sets.
    #[test]
    fn the_repair_lock_wait_is_the_one_its_statement_sets() {
        let sql = include_str!("../../sql/queries/reconcile_lock.sql");
        let set = format!("lock_timeout = '{}s'", REPAIR_LOCK_WAIT.as_secs());
        assert!(sql.contains(&set), "{sql}");
    }
}
