//! One Write in flight: its lock, its send, and the mark of the rows it finishes.
//!
//! Up to a window of Writes are in flight at once, and no two of them touch the same tuple: a
//! row on a tuple of a Write in flight waits for that Write's answer, and so does every later
//! row on its tuples (the order rule with the Write still undecided). Rows are read without
//! locks; each Write runs in a transaction of its own that locks its rows (`FOR UPDATE SKIP
//! LOCKED`: a row another session holds is not sent, and keeps its tuples; so does a row whose
//! payload the lock finds changed since it was read), sends the Write, and marks the rows
//! delivered when OpenFGA accepts it. A Write that completes rows the relay knows nothing of yet
//! locks them by marking them delivered before it leaves (see [`Flight::lock`]): one change to
//! each row instead of a lock and then a mark, committed only once OpenFGA accepts the Write and
//! rolled back otherwise. Rows read with nothing in hand are read already locked: when they are
//! exactly the next Write, that Write goes in the transaction that read them (see [`Spare`]). So
//! rows are marked delivered, for every other session, as their Writes are answered, no
//! transaction spans more than one Write, and a crash sends again at most what was in flight.
//! The window adapts as TCP's does: halved by a 429, a 5xx or a timeout, grown by one Write per
//! window of successes, up to `--max-in-flight`. A `Retry-After` closes its store's gate, which
//! every Write of that store about to leave looks at, so that none goes out before the wait is
//! over; and every Write about to leave asks the stream's `keep_going` (shutdown, the leader's
//! lease) once more, so that a relay stopped while its rows were being locked sends nothing once
//! continued.

use super::core::Flight;
use super::order::Plan;
use crate::liveness::Stamp;
use crate::metrics::Metrics;
use crate::openfga::{FgaClient, Prepared, Target, WriteError};
use crate::payload::{Condition, Op, same_condition};
use crate::send_window::SendWindow;
use crate::store::{Store, StoreError};
use deadpool_postgres::GenericClient;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// When OpenFGA asked (`Retry-After`) that no Write to a store be sent before: set by the Write
/// that got the answer, read by every Write of that store about to leave, so that none already
/// planned goes out meanwhile.
#[derive(Clone, Default)]
pub(super) struct Gate(Arc<std::sync::Mutex<Option<Instant>>>);

impl Gate {
    pub(super) fn close_until(&self, at: Instant) {
        if let Ok(mut g) = self.0.lock() {
            *g = Some(g.map_or(at, |t| t.max(at)));
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.until(Instant::now()).is_some()
    }

    /// Until when it is closed, if it is at `now` (the stream's clock: the model test's is
    /// simulated, and a gate read against the real one made its runs differ from one to the
    /// next).
    pub(super) fn until(&self, now: Instant) -> Option<Instant> {
        self.0.lock().ok().and_then(|g| g.filter(|t| *t > now))
    }
}

/// How a Write ended.
pub(super) enum Answer {
    /// Not sent: OpenFGA asked for a pause meanwhile, the stream was told to stop (shutdown,
    /// leadership lost) while the rows were being locked, or the lease ran out while a question
    /// before the Write failed. The rows go back to the queue.
    Deferred,
    /// These rows are held by another session, or changed since they were read: nothing was
    /// sent.
    Held(Vec<i64>),
    /// OpenFGA's answer; on success the rows are marked delivered already. Also what OpenFGA
    /// answered a question asked before the Write (its store missing), when nothing was sent.
    Sent(Result<(), WriteError>),
}

impl Flight {
    /// Sends the Write in a transaction of its own that holds its rows' locks while it is in
    /// flight and, when OpenFGA accepts it, marks the rows it completes delivered. So rows are
    /// marked as their Writes are answered, and a crash leaves at most the Writes in flight to
    /// send again. `locked`: that transaction, already open with exactly these rows locked (the
    /// rows read locked with nothing in hand, see [`Spare`]).
    pub(super) async fn fly(
        self,
        crew: Crew,
        locked: Option<WriteTx>,
    ) -> (Flight, Result<Answer, StoreError>) {
        let answer = self.send(&crew, locked).await;
        (self, answer)
    }

    /// Opens the Write's transaction and locks its rows, or says why the Write does not go. A
    /// Write of rows it all completes, none of them with a history in the relay, locks them by
    /// marking them delivered (see [`Flight::by_marking`]): one change to each row instead of
    /// two.
    pub(super) async fn lock(&self, crew: &Crew) -> Result<Result<WriteTx, Answer>, StoreError> {
        let mut tx = WriteTx::new(crew.store.pool().get().await?);
        let ids = self.plan.ids();
        // BEGIN and the lock in one round trip, as are the mark and COMMIT in `send`: one Write
        // at a time then costs no more round trips than a page claimed at once did.
        let tried = self.by_marking && !crew.no_marking.is_closed();
        let marked = match tried {
            true => crew.store.begin_and_mark(tx.conn(), &ids).await?,
            false => None,
        };
        if tried && marked.is_none() {
            // A row held, or a table lock queued (a repair, an index build): the next Writes
            // lock the skipping way for a while rather than each waiting in turn.
            crew.no_marking
                .close_until(Instant::now() + NO_MARKING_AFTER_A_WAIT);
        }
        tx.marked = marked.is_some();
        let rows = match marked {
            Some(rows) => rows,
            // A row another session holds: skipped, as for any Write.
            None => crew.store.begin_and_lock(tx.conn(), &ids).await?,
        };
        // A payload that is no longer text (bytes that are not UTF-8, in a database whose
        // encoding allows them) changed too: looked at again, it is dead-lettered as a read would.
        let got: HashMap<i64, Option<String>> = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1).ok())))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        // The Write sends what its lock sees: a row whose payload changed since its page was
        // read (reads are without locks, but for the first with nothing in hand) is passed over as
        // a row another session holds, and looked at again by id, as it is then.
        let missing: Vec<i64> = self
            .plan
            .rows
            .iter()
            .filter(|(c, _)| {
                got.get(&c.id)
                    .and_then(Option::as_deref)
                    .is_none_or(|t| *t != *c.text)
            })
            .map(|(c, _)| c.id)
            .collect();
        if !missing.is_empty() {
            tx.rollback().await?;
            return Ok(Err(Answer::Held(missing)));
        }
        Ok(Ok(tx))
    }

    pub(super) async fn send(
        &self,
        crew: &Crew,
        locked: Option<WriteTx>,
    ) -> Result<Answer, StoreError> {
        // Each request's answer (or its timeout) is a step of the stream's: a Write waiting on a
        // slow OpenFGA is not a stuck stream, and no step takes longer than a request timeout.
        let step = || crew.progress.mark();
        let (to, tx) = match self.prepare_and_lock(crew, locked, &step).await? {
            Ok(ready) => ready,
            Err(answer) => return Ok(answer),
        };
        if self.gate.is_closed() {
            tx.rollback().await?;
            return Ok(Answer::Deferred);
        }
        // The stream's `keep_going` (shutdown, the lease) is asked again before the Write goes:
        // the lock took a round trip since the Write was planned. The lease is asked once more
        // by the Write's body, as the connection writes it (see `send_window`).
        let (reply, answer) = oneshot::channel();
        if crew.ask.send(reply).is_err() || !answer.await.unwrap_or(false) {
            tx.rollback().await?;
            return Ok(Answer::Deferred);
        }
        let result = self.exchange(crew, &to, &step).await;
        if matches!(result, Err(WriteError::NotSent)) || (result.is_err() && !crew.window.is_open())
        {
            // Not sent, or the lease ran out meanwhile: whatever became of the Write, the next
            // leader sends its rows again after the fence. Nothing to hold against them.
            tx.rollback().await?;
            return Ok(Answer::Deferred);
        }
        if let Err(e) = &result
            && let Some(wait) = e.retry_after()
        {
            self.gate.close_until(Instant::now() + wait);
        }
        self.mark_answered(&crew.store, tx, &result).await?;
        Ok(Answer::Sent(result))
    }

    /// Asks OpenFGA what the Write needs first (see [`FgaClient::prepare`]), then locks its
    /// rows: before the lock, so that a Write that passes the last look at `keep_going` then
    /// leaves at once (see `Relay::guarded_stream`), and no transaction stays open across those
    /// questions. Rows read locked wait for no question: their transaction is let go if there
    /// are some. Says why the Write does not go otherwise.
    async fn prepare_and_lock<'a>(
        &'a self,
        crew: &'a Crew,
        locked: Option<WriteTx>,
        step: &(dyn Fn() + Sync),
    ) -> Result<Result<(Prepared<'a>, WriteTx), Answer>, StoreError> {
        let target = &self.plan.target;
        let locked = match locked {
            Some(tx) if !crew.client.ready(target) => {
                tx.rollback().await?;
                None
            }
            locked => locked,
        };
        if locked.is_none() && self.gate.is_closed() {
            return Ok(Err(Answer::Deferred));
        }
        let prepared = crew.client.prepare(target, step).await;
        // Locked even when a question failed: the Write is then judged on the rows as they
        // are, and the lock finds those gone, changed or held by another session since they
        // were read (looked at again, as for a Write), so that an operator's fix (a row
        // corrected or dead-lettered by hand while its store is missing) is seen.
        let tx = match locked {
            Some(tx) => tx,
            None => match self.lock(crew).await? {
                Ok(tx) => tx,
                Err(answer) => return Ok(Err(answer)),
            },
        };
        match prepared {
            Ok(to) => Ok(Ok((to, tx))),
            Err(e) => {
                tx.rollback().await?;
                // Nothing was sent: with the lease run out meanwhile, nothing to hold against
                // the rows either.
                Ok(Err(if crew.window.is_open() {
                    Answer::Sent(Err(e))
                } else {
                    Answer::Deferred
                }))
            }
        }
    }

    /// Sends the Write (and reads the tuple back after an older OpenFGA's "already exists"),
    /// counting what was sent.
    async fn exchange(
        &self,
        crew: &Crew,
        to: &Prepared<'_>,
        step: &(dyn Fn() + Sync),
    ) -> Result<(), WriteError> {
        let client = &crew.client;
        let ops = self.plan.ops();
        let started = Instant::now();
        let result = match client.write(to, &ops, &crew.window, step).await {
            Err(WriteError::AlreadyApplied { op, message }) => client
                .within_deadline(
                    "reading the tuple back after \"already exists\"",
                    confirm_applied(client, &self.plan.target, &ops, op, message),
                )
                .await
                .and_then(|r| r),
            r => r,
        };
        if !matches!(result, Err(WriteError::NotSent)) {
            let outcome = match &result {
                Ok(()) => "ok",
                Err(e) => e.class().as_str(),
            };
            crew.metrics
                .request(outcome, started.elapsed().as_secs_f64());
            crew.metrics.writes_sent.inc();
        }
        result
    }

    /// Marks the rows `result` finishes and commits, or rolls back when it finishes none: on
    /// success, the rows whose every operation it applied; on an older OpenFGA's "already
    /// exists"/"does not exist", the row whose last operation it was. Marked here, under the
    /// Write's lock and before anything releases their tuples: a row finished without a mark of
    /// its own would be sent again, after later rows on them. Rows locked by marking them are
    /// marked already: the mark of those `result` does not finish is taken back instead.
    async fn mark_answered(
        &self,
        store: &Store,
        tx: WriteTx,
        result: &Result<(), WriteError>,
    ) -> Result<(), StoreError> {
        let finished: Vec<i64> = match result {
            Ok(()) => self.complete.clone(),
            Err(e) => self.finished_by(e).into_iter().collect(),
        };
        if finished.is_empty() {
            tx.rollback().await?;
            return Ok(());
        }
        // A failed UPDATE turns the COMMIT into a rollback; the rows are sent again.
        let conn = tx.conn();
        let (stmt, ids) = if tx.marked {
            // Every row was marked as the Write left: the mark of those it did not finish is
            // taken back (an older OpenFGA's "already exists" finishes one row of a Write).
            let unfinished: Vec<i64> = self
                .plan
                .ids()
                .into_iter()
                .filter(|id| !finished.contains(id))
                .collect();
            if unfinished.is_empty() {
                conn.batch_execute("COMMIT").await?;
                tx.finish();
                return Ok(());
            }
            (store.unmark_statement(conn).await?, unfinished)
        } else {
            (store.mark_statement(conn).await?, finished)
        };
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (updated, committed) =
            tokio::join!(conn.execute(&stmt, &params), conn.batch_execute("COMMIT"));
        updated?;
        committed?;
        tx.finish();
        Ok(())
    }
}

/// An older OpenFGA's "already exists" for a write says only that the tuple exists, not that it
/// holds the row's condition: such a server answers so whatever condition it holds, and the
/// row's would never land. So the tuple is read back: held as written, the write counts as
/// applied; held with another condition (or none where the row has one), the operation is
/// rejected, and its row dead-lettered with the reason, never marked delivered. A delete's "does
/// not exist" needs no look.
pub(super) async fn confirm_applied(
    client: &FgaClient,
    target: &Target,
    ops: &[&Op],
    op: Option<usize>,
    message: String,
) -> Result<(), WriteError> {
    let applied = WriteError::AlreadyApplied { op, message };
    let Some(i) = op.or((ops.len() == 1).then_some(0)) else {
        return Err(applied);
    };
    let Some(Op::Write { key, condition }) = ops.get(i).copied() else {
        return Err(applied);
    };
    let page = match client.read(target.store.as_deref(), Some(key), 1, "").await {
        Ok(page) => page,
        // Whether it holds the row's condition is not known: sent again later, not counted.
        Err(e @ (WriteError::Transient { .. } | WriteError::Throttled { .. })) => return Err(e),
        Err(e) => {
            return Err(WriteError::Transient {
                reason: format!("reading back {key} after \"already exists\" failed: {e}"),
                retry_after: e.retry_after(),
            });
        }
    };
    let Some(held) = page.tuples.iter().find(|t| t.key == *key) else {
        // Gone since (another writer): the write is sent again.
        return Err(WriteError::Transient {
            reason: format!("OpenFGA answered that {key} exists, and then did not hold it"),
            retry_after: None,
        });
    };
    let wanted = condition.as_ref().map(Condition::to_value);
    let holds = held.condition.as_ref().map(Condition::to_value);
    if same_condition(wanted.as_ref(), holds.as_ref()) {
        return Err(applied);
    }
    let describe =
        |c: &Option<serde_json::Value>| c.as_ref().map_or("none".to_owned(), |v| v.to_string());
    Err(WriteError::Rejected {
        op: Some(i),
        code: "condition_differs".to_owned(),
        message: format!(
            "OpenFGA already holds {key} with condition {}, not the row's {}; an OpenFGA older \
             than 1.10 answers \"already exists\" and keeps the condition it holds (delete the \
             tuple first, or upgrade OpenFGA)",
            describe(&holds),
            describe(&wanted)
        ),
    })
}

/// What every Write of a stream goes with: the database, OpenFGA, the metrics, the stream's
/// progress, the way back to the stream's `keep_going`, and the lease's send window.
#[derive(Clone)]
pub(super) struct Crew {
    pub(super) store: Store,
    pub(super) client: Arc<FgaClient>,
    pub(super) metrics: Metrics,
    /// Marked as each of a Write's requests to OpenFGA ends (see `Deliverer::progress`).
    pub(super) progress: Arc<Stamp>,
    pub(super) ask: mpsc::UnboundedSender<oneshot::Sender<bool>>,
    pub(super) window: SendWindow,
    /// Closed for a while after a Write's mark waited in vain (see [`Flight::lock`]): no Write
    /// of this stream locks its rows by marking them meanwhile.
    pub(super) no_marking: Gate,
}

/// How long no Write locks its rows by marking them after one's mark waited in vain: a table
/// lock queued (a repair, an index build) is usually granted and done well within it.
const NO_MARKING_AFTER_A_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A pooled connection with a Write's transaction open on it. Unless [`WriteTx::finish`]ed
/// (committed or rolled back), it is closed rather than given back to the pool, so that no
/// connection ever goes back to the pool inside a transaction (a Write cut short by an error or
/// a cancelled task).
pub(super) struct WriteTx {
    conn: Option<deadpool_postgres::Client>,
    /// Its rows locked by marking them delivered (lock_by_marking.sql): committed, they are.
    marked: bool,
}

impl WriteTx {
    pub(super) fn new(conn: deadpool_postgres::Client) -> WriteTx {
        WriteTx {
            conn: Some(conn),
            marked: false,
        }
    }

    pub(super) fn conn(&self) -> &deadpool_postgres::Client {
        self.conn.as_ref().expect("taken only by finish and drop")
    }

    pub(super) fn finish(mut self) {
        // Back to the pool, the transaction over.
        drop(self.conn.take());
    }

    /// Rolls the transaction back and gives the connection back to the pool.
    pub(super) async fn rollback(self) -> Result<(), tokio_postgres::Error> {
        self.conn().batch_execute("ROLLBACK").await?;
        self.finish();
        Ok(())
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(deadpool_postgres::Client::take(conn));
        }
    }
}

/// Rows read with nothing in hand, read and locked in a transaction of their own
/// (claim_locked.sql). When the next Write is exactly those rows (the few rows a wake-up finds),
/// it goes in that transaction and needs no lock statement: a round trip less between a commit
/// and OpenFGA. Otherwise it is rolled back before any Write locks rows.
pub(super) struct Spare {
    pub(super) tx: WriteTx,
    /// The rows it locked, in id order.
    pub(super) ids: Vec<i64>,
}

impl Spare {
    /// The transaction, if it locked exactly `plan`'s rows.
    pub(super) fn fits(&self, plan: &Plan) -> bool {
        let mut ids = plan.ids();
        ids.sort_unstable();
        ids == self.ids
    }
}
