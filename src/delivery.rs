//! Delivery: one pass over the pending rows, in id order, into as few Writes as OpenFGA allows,
//! several in flight at once, without ever reordering two operations on the same tuple.
//!
//! # The order rule
//! A row is sent only if no earlier row that touches one of its tuples is still undelivered in
//! this pass: every row that fails, is held back or is held by another session adds its tuples
//! to the pass's *blocked* set, and every later row touching a blocked tuple is passed over (and
//! blocks its own tuples in turn). Rows on other tuples go on. A pass always starts again from
//! the lowest pending id, so a row passed over is looked at again, in order, by the next pass.
//!
//! # Writes in flight
//! Up to a window of Writes are in flight at once, and no two of them touch the same tuple: a
//! row on a tuple of a Write in flight waits for that Write's answer, and so does every later
//! row on its tuples (the order rule with the Write still undecided). Rows are read a page at a
//! time without locks; each Write runs in a transaction of its own that locks its rows
//! (`FOR UPDATE SKIP LOCKED`: a row another session holds is not sent, and blocks its tuples),
//! sends the Write, and marks the rows delivered when OpenFGA accepts it. The exception is a
//! pass's first page, read already locked: when it is exactly the first Write, that Write goes
//! in the transaction that read it (see [`Spare`]). So rows are marked as
//! their Writes are answered, no transaction spans more than one Write, and a crash sends again
//! at most what was in flight. The window adapts as TCP's does: halved by a 429, a 5xx or a
//! timeout, grown by one Write per window of successes, up to `--max-in-flight`. A
//! `Retry-After` closes a gate every Write about to leave looks at, so that none goes out before
//! the wait is over; and every Write about to leave asks the pass's `keep_going` (shutdown, the
//! leader's lease) once more, so that a relay stopped while its rows were being locked sends
//! nothing once continued.
//!
//! # Failures
//! - Transient, for a Write of several rows: the relay cannot tell an outage from one bad row,
//!   so it backs off as a whole and the rows of that Write are next sent in Writes half as large.
//!   When a smaller Write succeeds it was not an outage, and the halving finds the culprit.
//! - Transient, for a row alone: its failure is compared with everyone's. If other Writes
//!   succeeded since its previous failure and nearly all the other Writes of the last minute
//!   succeeded (at least four, at most a quarter failed), the failure is the row's own, a
//!   *strike*: the row is held with its own backoff while the others flow, and after
//!   `max_attempts` strikes it is dead-lettered. Otherwise the failure hits other rows too (an
//!   outage, a flaky or overloaded server): the whole relay backs off, the row is held just past
//!   that wait so that the others are tried first, and nothing counts toward dead-lettering.
//! - Throttled (429): never the rows' fault. Nothing is halved and nothing is a strike; the
//!   whole relay waits for `Retry-After` (or its own backoff) and sends the same rows again.
//!   A `Retry-After` sent with any other failure is waited for too, on every path.
//! - Permanent for one operation (`Invalid tuple …`, a condition conflict): that row is
//!   dead-lettered with OpenFGA's message; the rest of the Write is sent again without it.
//! - Already applied (an older OpenFGA's answer to a duplicate write or missing delete): that
//!   operation counts as done.
//! - Configuration (auth, store, model, garbage answers, a proxy's refusal): loud error, and the
//!   whole relay backs off slowly. A proxy may refuse only the Writes carrying one row's content
//!   (a web application firewall), so these are halved and judged alone as transient failures
//!   are: a row refused alone while nearly all other Writes succeed is struck, held and in the
//!   end dead-lettered; when every Write is refused (wrong settings), nothing is.
//!
//! Every failed attempt updates `attempts` and `last_error` of the rows concerned.

use crate::backoff::Backoff;
use crate::config::DeliverySettings;
use crate::metrics::Metrics;
use crate::openfga::{FailureClass, FgaClient, WriteError};
use crate::payload::{Op, Payload, TupleKey};
use crate::send_window::SendWindow;
use crate::store::{Store, StoreError};
use deadpool_postgres::GenericClient;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{debug, error, warn};

/// Backoff of the whole relay after a failure that looks like an outage. Capped low so that
/// delivery resumes within a couple of seconds of OpenFGA coming back.
pub const OUTAGE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// Backoff of the whole relay after a configuration error: only the operator can fix it, so
/// retry slowly and keep the logs readable.
pub const CONFIG_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// Backoff of one row that keeps failing while others are delivered.
pub const ROW_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// How far back the outcomes of other Writes are looked at to judge whether a row's failure is
/// its own: long enough to hold many Writes of a busy relay, short enough to forget an outage
/// that is over.
const COMPARE_WINDOW: Duration = Duration::from_secs(60);
/// At most this many outcomes are kept (a relay delivering thousands of Writes a minute needs
/// no more to see whether most succeed).
const COMPARE_MAX: usize = 1024;
/// A row's failure is its own only if at least this many other Writes succeeded in the window,
/// and at most one in [`COMPARE_SHARE`] of the others failed. Under a flaky server failing
/// half the Writes or more, the odds that a window of other Writes looks that clean by chance
/// are below one in a hundred for a handful of Writes and vanish for a busy relay; a row that
/// alone keeps failing while the traffic beside it flows meets both at once.
const COMPARE_MIN_OK: usize = 4;
const COMPARE_SHARE: usize = 4;

/// The outcome of one Write, kept for [`COMPARE_WINDOW`].
struct Outcome {
    at: Instant,
    failed: bool,
    /// The row, for a Write that carried one row alone: its own failures are not "others'".
    alone: Option<i64>,
}

/// What the relay remembers about a row across passes, while the row is pending.
#[derive(Debug, Default)]
struct Memo {
    /// The most rows a Write holding this row may carry (halved by transient failures).
    max_rows: Option<usize>,
    /// For a row sent in parts: the most operations a part may carry (halved while OpenFGA
    /// finds a part too large).
    max_part: Option<usize>,
    /// The success counter when this row last failed transiently.
    failed_epoch: Option<u64>,
    /// Transient failures alone while other rows were delivered.
    strikes: u32,
    /// Held back until then.
    retry_at: Option<Instant>,
    /// Operations OpenFGA already applied (a split row's finished parts, or an older server's
    /// "already exists"/"does not exist"), by index.
    done: HashSet<usize>,
}

/// A row in a pass.
struct Candidate {
    id: i64,
    created_at: SystemTime,
    ops: Arc<[Op]>,
    /// The hash of each operation's tuple key, parallel to `ops`.
    hashes: Vec<u64>,
}

/// The rows of one Write and which of their operations it carries.
struct Plan {
    rows: Vec<(Candidate, Vec<usize>)>,
}

impl Plan {
    fn ids(&self) -> Vec<i64> {
        self.rows.iter().map(|(c, _)| c.id).collect()
    }

    fn into_rows(self) -> Vec<Candidate> {
        self.rows.into_iter().map(|(c, _)| c).collect()
    }

    /// The operations this Write carries, in order: borrowed from the rows, not copied.
    fn ops(&self) -> Vec<&Op> {
        self.rows
            .iter()
            .flat_map(|(c, idx)| idx.iter().map(|&i| &c.ops[i]))
            .collect()
    }

    fn n_ops(&self) -> usize {
        self.rows.iter().map(|(_, idx)| idx.len()).sum()
    }
}

/// One Write on its way: its rows, every tuple they touch (no other Write in flight may touch
/// them), and the rows it completes.
struct Flight {
    plan: Plan,
    keys: Vec<u64>,
    /// Rows all of whose operations this Write applies: marked delivered in its transaction.
    complete: Vec<i64>,
}

/// When OpenFGA asked (`Retry-After`) that no Write be sent before: set by the Write that got
/// the answer, read by every Write about to leave, so that none already planned goes out
/// meanwhile.
#[derive(Clone, Default)]
struct Gate(Arc<std::sync::Mutex<Option<Instant>>>);

impl Gate {
    fn close_until(&self, at: Instant) {
        if let Ok(mut g) = self.0.lock() {
            *g = Some(g.map_or(at, |t| t.max(at)));
        }
    }

    fn is_closed(&self) -> bool {
        self.0
            .lock()
            .map(|g| g.is_some_and(|t| t > Instant::now()))
            .unwrap_or(false)
    }
}

/// How a Write ended.
enum Answer {
    /// Not sent: OpenFGA asked for a pause meanwhile, or the pass was told to stop (shutdown,
    /// leadership lost) while the rows were being locked. The rows go back to the queue.
    Deferred,
    /// These rows are held by another session: nothing was sent.
    Held(Vec<i64>),
    /// OpenFGA's answer; on success the rows are marked delivered already.
    Sent(Result<(), WriteError>),
}

impl Flight {
    fn new(plan: Plan, memo: &HashMap<i64, Memo>) -> Flight {
        let keys = plan
            .rows
            .iter()
            .flat_map(|(c, _)| c.hashes.iter().copied())
            .collect();
        let complete = plan
            .rows
            .iter()
            .filter(|(c, idx)| {
                memo.get(&c.id).map_or(0, |m| m.done.len()) + idx.len() >= c.ops.len()
            })
            .map(|(c, _)| c.id)
            .collect();
        Flight {
            plan,
            keys,
            complete,
        }
    }

    /// Sends the Write in a transaction of its own that holds its rows' locks while it is in
    /// flight and, when OpenFGA accepts it, marks the rows it completes delivered. So rows are
    /// marked as their Writes are answered, and a crash leaves at most the Writes in flight to
    /// send again. `locked`: that transaction, already open with exactly these rows locked (the
    /// pass's first page, see [`Spare`]).
    async fn fly(
        self,
        crew: Crew,
        locked: Option<WriteTx>,
    ) -> (Flight, Result<Answer, StoreError>) {
        let answer = self.send(&crew, locked).await;
        (self, answer)
    }

    /// Opens the Write's transaction and locks its rows, or says why the Write does not go.
    async fn lock(&self, crew: &Crew) -> Result<Result<WriteTx, Answer>, StoreError> {
        let tx = WriteTx(Some(crew.store.pool().get().await?));
        let conn = tx.conn();
        let lock = crew.store.lock_statement(conn).await?;
        let ids = self.plan.ids();
        // BEGIN and the lock in one round trip, as are the mark and COMMIT in `send`: one Write
        // at a time then costs no more round trips than a page claimed at once did.
        let got: Vec<i64> = Store::begin_and_query(conn, &lock, &[&ids])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        if got.len() < ids.len() {
            tx.rollback().await?;
            let missing = ids.into_iter().filter(|id| !got.contains(id)).collect();
            return Ok(Err(Answer::Held(missing)));
        }
        Ok(Ok(tx))
    }

    async fn send(&self, crew: &Crew, locked: Option<WriteTx>) -> Result<Answer, StoreError> {
        let Crew {
            store,
            client,
            metrics,
            gate,
            ask,
            window,
        } = crew;
        let tx = match locked {
            Some(tx) => tx,
            None if gate.is_closed() => return Ok(Answer::Deferred),
            None => match self.lock(crew).await? {
                Ok(tx) => tx,
                Err(answer) => return Ok(answer),
            },
        };
        if gate.is_closed() {
            tx.rollback().await?;
            return Ok(Answer::Deferred);
        }
        // The pass's `keep_going` (shutdown, the lease) is asked again before the Write goes:
        // the lock took a round trip since the Write was planned. The lease is asked once more
        // by the Write's body, as the connection writes it (see `send_window`).
        let (reply, answer) = oneshot::channel();
        if ask.send(reply).is_err() || !answer.await.unwrap_or(false) {
            tx.rollback().await?;
            return Ok(Answer::Deferred);
        }
        let ops = self.plan.ops();
        let started = Instant::now();
        let result = client.write(&ops, window).await;
        let sent = !matches!(result, Err(WriteError::NotSent));
        if sent {
            let outcome = match &result {
                Ok(()) => "ok",
                Err(e) => e.class().as_str(),
            };
            metrics.request(outcome, started.elapsed().as_secs_f64());
            metrics.writes_sent.inc();
        }
        if !sent || (result.is_err() && !window.is_open()) {
            // Not sent, or the lease ran out meanwhile: whatever became of the Write, the next
            // leader sends its rows again after the fence. Nothing to hold against them.
            tx.rollback().await?;
            return Ok(Answer::Deferred);
        }
        if let Err(e) = &result
            && let Some(wait) = e.retry_after()
        {
            gate.close_until(Instant::now() + wait);
        }
        if result.is_ok() && !self.complete.is_empty() {
            // A failed UPDATE turns the COMMIT into a rollback; the rows are sent again.
            let conn = tx.conn();
            let mark = store.mark_statement(conn).await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.complete];
            let (marked, committed) =
                tokio::join!(conn.execute(&mark, &params), conn.batch_execute("COMMIT"));
            marked?;
            committed?;
            tx.finish();
        } else {
            tx.rollback().await?;
        }
        Ok(Answer::Sent(result))
    }
}

/// What every Write of a pass goes with: the database, OpenFGA, the metrics, the `Retry-After`
/// gate, the way back to the pass's `keep_going`, and the lease's send window.
#[derive(Clone)]
struct Crew {
    store: Store,
    client: Arc<FgaClient>,
    metrics: Metrics,
    gate: Gate,
    ask: mpsc::UnboundedSender<oneshot::Sender<bool>>,
    window: SendWindow,
}

/// A pooled connection with a Write's transaction open on it. Unless [`WriteTx::finish`]ed
/// (committed or rolled back), it is closed rather than given back to the pool, so that no
/// connection ever goes back to the pool inside a transaction (a Write cut short by an error or
/// a cancelled task).
struct WriteTx(Option<deadpool_postgres::Client>);

impl WriteTx {
    fn conn(&self) -> &deadpool_postgres::Client {
        self.0.as_ref().expect("taken only by finish and drop")
    }

    fn finish(mut self) {
        // Back to the pool, the transaction over.
        drop(self.0.take());
    }

    /// Rolls the transaction back and gives the connection back to the pool.
    async fn rollback(self) -> Result<(), tokio_postgres::Error> {
        self.conn().batch_execute("ROLLBACK").await?;
        self.finish();
        Ok(())
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(deadpool_postgres::Client::take(conn));
        }
    }
}

/// The pass's first page, read and locked in a transaction of its own (claim_locked.sql). When
/// the pass's first Write is that whole page (the few rows a wake-up finds), the Write goes in
/// that transaction and needs no lock statement: a round trip less between a commit and OpenFGA.
/// Otherwise it is rolled back before any Write locks rows.
struct Spare {
    tx: WriteTx,
    /// The rows it locked, in id order.
    ids: Vec<i64>,
}

impl Spare {
    /// The transaction, if it locked exactly `plan`'s rows.
    fn fits(&self, plan: &Plan) -> bool {
        let mut ids = plan.ids();
        ids.sort_unstable();
        ids == self.ids
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone)]
pub struct PassReport {
    pub delivered: u64,
    pub dead: u64,
    pub failed_writes: u64,
    pub writes: u64,
    /// Rows passed over: held back, behind a held row, or held by another session.
    pub held: u64,
    /// Of those, rows held by another session: worth looking at again soon, as no notification
    /// will announce that the session let them go.
    pub locked: u64,
    /// Back off this long before the next pass (an outage or a configuration error).
    pub wait: Option<Duration>,
    /// When the earliest held row may be retried.
    pub next_due: Option<Instant>,
    /// The pass stopped early because it was asked to (shutdown, leadership lost).
    pub interrupted: bool,
}

impl PassReport {
    /// Whether the pass changed anything: if not, the relay may sleep.
    pub fn did_work(&self) -> bool {
        self.delivered + self.dead + self.failed_writes > 0
    }

    fn due(&mut self, at: Instant) {
        self.next_due = Some(self.next_due.map_or(at, |d| d.min(at)));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// The delivery engine. One per relay; only the relay holding leadership runs passes.
pub struct Deliverer {
    store: Store,
    client: Arc<FgaClient>,
    metrics: Metrics,
    settings: DeliverySettings,
    /// Tuples per Write: `--max-tuples-per-write`, lowered if OpenFGA says it allows fewer.
    max_tuples: usize,
    memo: HashMap<i64, Memo>,
    /// Counts successful Writes: a row's failure counts as a strike only if this moved since
    /// its previous failure.
    epoch: u64,
    /// Consecutive failed Writes with no success in between.
    streak: u32,
    /// The outcomes of recent Writes (429s left out: they say nothing about rows).
    recent: VecDeque<Outcome>,
    /// The Writes allowed in flight at once, as TCP's congestion window: halved on 429, 5xx
    /// and timeouts, grown by one per window of successes, up to `max_in_flight`.
    window: f64,
}

fn key_hash(k: &TupleKey) -> u64 {
    let mut h = DefaultHasher::new();
    k.hash(&mut h);
    h.finish()
}

impl Deliverer {
    pub fn new(
        store: Store,
        client: Arc<FgaClient>,
        metrics: Metrics,
        settings: DeliverySettings,
        max_tuples: usize,
    ) -> Deliverer {
        let window = settings.max_in_flight.max(1) as f64;
        metrics.write_window.set(window as i64);
        Deliverer {
            window,
            store,
            client,
            metrics,
            settings,
            max_tuples: max_tuples.max(1),
            memo: HashMap::new(),
            epoch: 0,
            streak: 0,
            recent: VecDeque::new(),
        }
    }

    /// Records a Write's outcome for [`Deliverer::others_nearly_all_succeed`].
    fn note(&mut self, failed: bool, alone: Option<i64>) {
        let now = Instant::now();
        while self.recent.len() >= COMPARE_MAX
            || self
                .recent
                .front()
                .is_some_and(|o| now.duration_since(o.at) > COMPARE_WINDOW)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(Outcome {
            at: now,
            failed,
            alone,
        });
    }

    /// Whether the recent Writes that did not carry row `id` alone nearly all succeeded: then a
    /// failure of that row is its own, not one that hits everyone.
    fn others_nearly_all_succeed(&self, id: i64) -> bool {
        let now = Instant::now();
        let (mut ok, mut failed) = (0usize, 0usize);
        for o in &self.recent {
            if o.alone == Some(id) || now.duration_since(o.at) > COMPARE_WINDOW {
                continue;
            }
            if o.failed {
                failed += 1;
            } else {
                ok += 1;
            }
        }
        ok >= COMPARE_MIN_OK && failed * COMPARE_SHARE <= ok + failed
    }

    /// Forgets what was learnt about rows, e.g. when another relay may have delivered them.
    pub fn forget(&mut self) {
        self.memo.clear();
        self.streak = 0;
    }

    /// The Writes that may be in flight now.
    fn window(&self) -> usize {
        (self.window as usize).clamp(1, self.settings.max_in_flight.max(1))
    }

    /// A Write succeeded: grow the window by one Write per window's worth of successes.
    fn widen(&mut self) {
        let max = self.settings.max_in_flight.max(1) as f64;
        self.window = (self.window + 1.0 / self.window).min(max);
        self.metrics.write_window.set(self.window() as i64);
    }

    /// OpenFGA struggles (429, 5xx, timeout): halve the window.
    fn narrow(&mut self) {
        self.window = (self.window / 2.0).max(1.0);
        self.metrics.write_window.set(self.window() as i64);
    }

    /// One pass over every pending row, in id order, read a page at a time, with up to
    /// [`Deliverer::window`] Writes in flight. `keep_going` is asked when a Write is planned and
    /// again right before it leaves (its rows locked); when it says no, the pass sends nothing
    /// more, waits for the Writes in flight, and stops.
    /// Writes leave only while `window` is open (the leader's lease).
    pub async fn pass(
        &mut self,
        keep_going: &dyn Fn() -> bool,
        window: &SendWindow,
    ) -> Result<PassReport, StoreError> {
        let mut report = PassReport::default();
        let mut blocked: HashSet<u64> = HashSet::new();
        let mut queue: BTreeMap<i64, Candidate> = BTreeMap::new();
        // Tuples of the Writes in flight (every tuple of their rows), with how many hold each.
        let mut in_flight: HashMap<u64, usize> = HashMap::new();
        let mut flights: JoinSet<(Flight, Result<Answer, StoreError>)> = JoinSet::new();
        // Rows whose every operation was applied already: marked at the end, with no Write.
        let mut delivered = Vec::new();
        let batch = self.settings.batch_size.max(1);
        // The smallest id not read yet: ids are the table's to give, and may be 0 or below.
        let mut from = i64::MIN;
        let mut exhausted = false;
        let mut launching = true;
        let mut failed: Option<StoreError> = None;
        let mut spare: Option<Spare> = None;
        let gate = Gate::default();
        // Writes about to leave ask here whether they still may (see `Flight::send`).
        let (ask, mut asked) = mpsc::unbounded_channel::<oneshot::Sender<bool>>();
        let crew = Crew {
            store: self.store.clone(),
            client: self.client.clone(),
            metrics: self.metrics.clone(),
            gate: gate.clone(),
            ask,
            window: window.clone(),
        };
        loop {
            if gate.is_closed() {
                launching = false;
            }
            if launching && !exhausted && queue.len() < batch {
                // The first page is read locked, for the first Write (see `Spare`), and no
                // larger than a Write can be, so that a page it is not costs few locks.
                let first = from == i64::MIN;
                let limit = if first {
                    batch.min(self.max_tuples.max(1))
                } else {
                    batch
                };
                match self
                    .read_page(from, limit, first, &mut queue, &mut blocked, &mut report)
                    .await
                {
                    Ok((None, _)) => exhausted = true,
                    Ok((Some((last, n)), locked)) => {
                        // No id above i64::MAX: that page was the last.
                        exhausted = n < limit || last == i64::MAX;
                        from = last.saturating_add(1);
                        spare = locked;
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                        launching = false;
                    }
                }
            }
            while launching && flights.len() < self.window() {
                let Some(plan) = self.plan_write(
                    &mut queue,
                    &mut blocked,
                    &in_flight,
                    &mut report,
                    &mut delivered,
                ) else {
                    break;
                };
                if !keep_going() {
                    report.interrupted = true;
                    launching = false;
                    Self::requeue(&mut queue, plan.into_rows());
                    break;
                }
                let locked = match spare.take() {
                    Some(s) if s.fits(&plan) => Some(s.tx),
                    Some(s) => {
                        if let Err(e) = s.tx.rollback().await {
                            failed.get_or_insert(e.into());
                            launching = false;
                            Self::requeue(&mut queue, plan.into_rows());
                            break;
                        }
                        None
                    }
                    None => None,
                };
                let flight = Flight::new(plan, &self.memo);
                for h in &flight.keys {
                    *in_flight.entry(*h).or_default() += 1;
                }
                report.writes += 1;
                flights.spawn(flight.fly(crew.clone(), locked));
                self.metrics.writes_in_flight.set(flights.len() as i64);
            }
            // Not the first Write's: let go of its rows before anything else locks them (the
            // rows delivered without a Write are marked on another connection).
            if let Some(s) = spare.take()
                && let Err(e) = s.tx.rollback().await
            {
                failed.get_or_insert(e.into());
                launching = false;
            }
            let joined = tokio::select! {
                Some(reply) = asked.recv() => {
                    let go = keep_going();
                    if !go {
                        report.interrupted = true;
                        launching = false;
                    }
                    let _ = reply.send(go);
                    continue;
                }
                joined = flights.join_next() => joined,
            };
            let Some(joined) = joined else {
                if launching && !exhausted {
                    continue;
                }
                break;
            };
            self.metrics.writes_in_flight.set(flights.len() as i64);
            let (flight, answer) = match joined {
                Ok(landed) => landed,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Only aborted tasks end otherwise, and none is aborted while the pass runs.
                Err(_) => continue,
            };
            for h in &flight.keys {
                if let Some(n) = in_flight.get_mut(h) {
                    *n -= 1;
                    if *n == 0 {
                        in_flight.remove(h);
                    }
                }
            }
            match self
                .landed(flight, answer, &mut queue, &mut blocked, &mut report)
                .await
            {
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => launching = false,
                Err(e) => {
                    failed.get_or_insert(e);
                    launching = false;
                }
            }
        }
        if !delivered.is_empty() {
            let conn = self.store.pool().get().await?;
            self.store.mark_delivered(&conn, &delivered).await?;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Reads the next page of pending rows into the queue. Returns the last id read and how
    /// many rows, or `None` when there are no more. With `lock` (the first page of a pass), it
    /// reads them locked, and returns the transaction that holds them if every row read went
    /// into the queue.
    async fn read_page(
        &mut self,
        from: i64,
        batch: usize,
        lock: bool,
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
        let now = Instant::now();
        let mut ids = Vec::with_capacity(n);
        for row in rows {
            let parsed = match &row.payload {
                Ok(text) => Payload::parse_text(text).map_err(|e| e.to_string()),
                Err(e) => Err(format!("malformed payload: {e}")),
            };
            let payload = match parsed {
                Ok(p) => p,
                Err(e) => {
                    // Not in that transaction: the rows it holds may yet be let go.
                    if std::mem::take(&mut open) {
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
            let hashes: Vec<u64> = payload.ops.iter().map(|op| key_hash(op.key())).collect();
            if let Some(at) = self.memo.get(&row.id).and_then(|m| m.retry_at)
                && at > now
            {
                blocked.extend(hashes.iter().copied());
                report.held += 1;
                report.due(at);
                continue;
            }
            ids.push(row.id);
            queue.insert(
                row.id,
                Candidate {
                    id: row.id,
                    created_at: row.created_at,
                    ops: payload.ops,
                    hashes,
                },
            );
        }
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

    /// A Write answered (or not sent, its rows held elsewhere): account for it.
    async fn landed(
        &mut self,
        flight: Flight,
        answer: Result<Answer, StoreError>,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<Flow, StoreError> {
        let Flight { plan, .. } = flight;
        let n_ops = plan.n_ops();
        match answer? {
            Answer::Deferred => {
                Self::requeue(queue, plan.into_rows());
                Ok(Flow::Stop)
            }
            Answer::Held(missing) => {
                // Another session holds some of these rows (a relay that lost leadership but
                // has not stopped yet): they may be on their way to OpenFGA. Nothing after them
                // on their tuples may go; the others are planned again.
                let mut rest = Vec::new();
                for c in plan.into_rows() {
                    if missing.contains(&c.id) {
                        blocked.extend(c.hashes.iter().copied());
                        report.held += 1;
                        report.locked += 1;
                    } else {
                        rest.push(c);
                    }
                }
                Self::requeue(queue, rest);
                Ok(Flow::Continue)
            }
            Answer::Sent(Ok(())) => {
                self.widen();
                self.on_success(plan, n_ops, queue, report);
                Ok(Flow::Continue)
            }
            Answer::Sent(Err(e)) => {
                if matches!(
                    e,
                    WriteError::Transient { .. } | WriteError::Throttled { .. }
                ) {
                    self.narrow();
                }
                let conn = self.store.pool().get().await?;
                self.on_failure(&conn, plan, e, queue, blocked, report)
                    .await
            }
        }
    }

    /// Takes the rows of the next Write from the queue: in id order, as many as the tuple limit
    /// and the rows' halving allow, never the same tuple twice, and none on a tuple of a Write
    /// in flight or of an earlier row left waiting; a row larger than the limit goes alone, in
    /// parts (smaller once a part was too large). Rows touching a blocked tuple are passed over
    /// for the pass. Rows with nothing left to send are delivered without a Write.
    fn plan_write(
        &mut self,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        in_flight: &HashMap<u64, usize>,
        report: &mut PassReport,
        delivered: &mut Vec<i64>,
    ) -> Option<Plan> {
        let limit = self.max_tuples;
        let mut rows: Vec<(Candidate, Vec<usize>)> = Vec::new();
        let mut keys: HashSet<u64> = HashSet::new();
        // Tuples of rows left in the queue by this scan: every later row on them waits too.
        let mut waiting: HashSet<u64> = HashSet::new();
        let mut n_ops = 0usize;
        let mut cap = usize::MAX;
        let ids: Vec<i64> = queue.keys().copied().collect();
        for id in ids {
            let Some(c) = queue.get(&id) else { continue };
            if c.hashes.iter().any(|h| blocked.contains(h)) {
                if let Some(c) = queue.remove(&id) {
                    blocked.extend(c.hashes.iter().copied());
                }
                report.held += 1;
                continue;
            }
            if c.hashes
                .iter()
                .any(|h| in_flight.contains_key(h) || waiting.contains(h))
            {
                waiting.extend(c.hashes.iter().copied());
                continue;
            }
            let memo = self.memo.get(&id);
            let remaining: Vec<usize> = (0..c.ops.len())
                .filter(|i| memo.is_none_or(|m| !m.done.contains(i)))
                .collect();
            if remaining.is_empty() {
                if let Some(c) = queue.remove(&id) {
                    self.row_delivered(&c, report);
                    delivered.push(c.id);
                }
                continue;
            }
            let row_cap = memo.and_then(|m| m.max_rows).unwrap_or(usize::MAX);
            let part_cap = memo.and_then(|m| m.max_part).unwrap_or(limit).min(limit);
            if rows.is_empty() {
                let Some(c) = queue.remove(&id) else { continue };
                if remaining.len() > part_cap {
                    // Too large for one Write: send it in parts, alone, in order.
                    let part: Vec<usize> = remaining.into_iter().take(part_cap).collect();
                    rows.push((c, part));
                    break;
                }
                keys.extend(remaining.iter().map(|&i| c.hashes[i]));
                n_ops = remaining.len();
                cap = row_cap;
                rows.push((c, remaining));
                continue;
            }
            if rows.len() >= cap.min(row_cap) || n_ops + remaining.len() > limit {
                break;
            }
            if remaining.iter().any(|&i| keys.contains(&c.hashes[i])) {
                // Its tuple is in this Write: it goes after it, as does every later row on it.
                waiting.extend(c.hashes.iter().copied());
                continue;
            }
            let Some(c) = queue.remove(&id) else { continue };
            keys.extend(remaining.iter().map(|&i| c.hashes[i]));
            n_ops += remaining.len();
            cap = cap.min(row_cap);
            rows.push((c, remaining));
        }
        (!rows.is_empty()).then_some(Plan { rows })
    }

    fn row_delivered(&mut self, c: &Candidate, report: &mut PassReport) {
        self.memo.remove(&c.id);
        report.delivered += 1;
        self.metrics.rows_delivered.inc();
        if let Ok(age) = SystemTime::now().duration_since(c.created_at) {
            self.metrics
                .delivery_latency_seconds
                .observe(age.as_secs_f64());
        }
    }

    fn on_success(
        &mut self,
        plan: Plan,
        n_ops: usize,
        queue: &mut BTreeMap<i64, Candidate>,
        report: &mut PassReport,
    ) {
        self.epoch += 1;
        self.streak = 0;
        let alone = (plan.rows.len() == 1).then(|| plan.rows[0].0.id);
        self.note(false, alone);
        self.metrics.tuples_delivered.inc_by(n_ops as u64);
        let mut unfinished = Vec::new();
        for (c, idx) in plan.rows {
            let all = c.ops.len();
            let memo_done = self.memo.get(&c.id).map_or(0, |m| m.done.len());
            if memo_done + idx.len() >= all {
                // Marked delivered in the Write's own transaction already.
                self.row_delivered(&c, report);
            } else {
                // A part of a large row: remember it, send the rest next.
                self.memo.entry(c.id).or_default().done.extend(idx);
                unfinished.push(c);
            }
        }
        Self::requeue(queue, unfinished);
    }

    /// Puts rows back into the queue, in their place.
    fn requeue(queue: &mut BTreeMap<i64, Candidate>, rows: Vec<Candidate>) {
        for c in rows {
            queue.insert(c.id, c);
        }
    }

    /// The row and operation index of the `flat`-th operation of a plan.
    fn locate(plan: &Plan, flat: usize) -> Option<(usize, usize)> {
        let mut n = flat;
        for (r, (_, idx)) in plan.rows.iter().enumerate() {
            if n < idx.len() {
                return Some((r, idx[n]));
            }
            n -= idx.len();
        }
        None
    }

    async fn on_failure(
        &mut self,
        tx: &impl GenericClient,
        plan: Plan,
        e: WriteError,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<Flow, StoreError> {
        match e {
            WriteError::AlreadyApplied {
                op: Some(i),
                ref message,
            } => {
                // Success for that operation; send the rest again.
                debug!(ids = ?plan.ids(), %message, "OpenFGA already had this operation applied");
                if let Some((r, op)) = Self::locate(&plan, i) {
                    self.memo
                        .entry(plan.rows[r].0.id)
                        .or_default()
                        .done
                        .insert(op);
                    Self::requeue(queue, plan.into_rows());
                    return Ok(Flow::Continue);
                }
                self.split_or_dead_letter(tx, plan, &e, queue, report).await
            }
            WriteError::AlreadyApplied { op: None, .. } | WriteError::Rejected { op: None, .. } => {
                self.split_or_dead_letter(tx, plan, &e, queue, report).await
            }
            WriteError::Rejected { op: Some(i), .. } => {
                self.metrics.failed("permanent");
                report.failed_writes += 1;
                let Some((r, _)) = Self::locate(&plan, i) else {
                    return self.split_or_dead_letter(tx, plan, &e, queue, report).await;
                };
                let mut rows: Vec<Candidate> = plan.into_rows();
                let bad = rows.remove(r);
                self.dead_letter(tx, bad.id, &e.to_string(), None, report)
                    .await?;
                Self::requeue(queue, rows);
                Ok(Flow::Continue)
            }
            WriteError::TooManyTuples { limit, ref message } => {
                let lower = limit.unwrap_or(self.max_tuples / 2).max(1);
                if lower < self.max_tuples && self.max_tuples > 1 {
                    error!(
                        configured = self.max_tuples,
                        server_limit = lower,
                        %message,
                        "OpenFGA allows fewer tuples per write than --max-tuples-per-write; \
                         using its limit (set FGA_RELAY_MAX_TUPLES_PER_WRITE={lower})"
                    );
                    self.max_tuples = lower;
                    Self::requeue(queue, plan.into_rows());
                    return Ok(Flow::Continue);
                }
                self.outage(tx, &plan, &e, blocked, report, CONFIG_BACKOFF)
                    .await?;
                Ok(Flow::Stop)
            }
            WriteError::TooLarge { .. } => {
                // A proxy's body limit or gRPC's: a smaller Write may pass; a row alone cannot
                // shrink, unless it is sent in parts already.
                self.split_or_dead_letter(tx, plan, &e, queue, report).await
            }
            WriteError::NotSent => {
                // `Flight::send` defers these before they get here; should one come, it was
                // never sent and is nothing against its rows.
                Self::requeue(queue, plan.into_rows());
                Ok(Flow::Stop)
            }
            WriteError::Configuration { .. } | WriteError::Unexpected { .. } => {
                // Wrong settings fail every Write; a proxy refusing one row's content (a web
                // application firewall) fails only the Writes carrying that row. Halving tells
                // them apart, as for transient failures, with the slow backoff of the former.
                self.halve_or_hold(tx, plan, &e, blocked, report, CONFIG_BACKOFF)
                    .await
            }
            WriteError::Throttled { .. } => {
                // Not the rows' fault: the same Write, after the wait. Rows held back by the
                // outage path are due again once the wait is over.
                self.outage(tx, &plan, &e, blocked, report, OUTAGE_BACKOFF)
                    .await?;
                Ok(Flow::Stop)
            }
            WriteError::Transient { .. } => {
                self.halve_or_hold(tx, plan, &e, blocked, report, OUTAGE_BACKOFF)
                    .await
            }
        }
    }

    /// A permanent answer that does not say which row: split the Write to find out, or, for a
    /// row alone, dead-letter it (a part of a row sent in parts found too large is halved).
    async fn split_or_dead_letter(
        &mut self,
        tx: &impl GenericClient,
        plan: Plan,
        e: &WriteError,
        queue: &mut BTreeMap<i64, Candidate>,
        report: &mut PassReport,
    ) -> Result<Flow, StoreError> {
        self.metrics.failed("permanent");
        report.failed_writes += 1;
        if plan.rows.len() > 1 {
            let half = plan.rows.len() / 2;
            for (c, _) in &plan.rows {
                self.memo.entry(c.id).or_default().max_rows = Some(half);
            }
            let ids = plan.ids();
            debug!(?ids, error = %e, "OpenFGA rejected a write without naming the tuple; splitting it");
            Self::requeue(queue, plan.into_rows());
            return Ok(Flow::Continue);
        }
        let (c, idx) = plan.rows.into_iter().next().expect("a plan has rows");
        if matches!(e, WriteError::AlreadyApplied { .. }) && idx.len() == 1 {
            self.memo.entry(c.id).or_default().done.insert(idx[0]);
            queue.insert(c.id, c);
            return Ok(Flow::Continue);
        }
        if matches!(e, WriteError::TooLarge { .. }) && idx.len() > 1 && idx.len() < c.ops.len() {
            // A part of a row already sent in parts, not in one transaction: a part of the
            // relay's choosing is no reason to give the row up. Only a tuple too large alone is.
            let half = idx.len() / 2;
            debug!(id = c.id, part = idx.len(), half, error = %e,
                "a part of a row is too large; halving its parts");
            self.memo.entry(c.id).or_default().max_part = Some(half);
            queue.insert(c.id, c);
            return Ok(Flow::Continue);
        }
        self.dead_letter(tx, c.id, &e.to_string(), None, report)
            .await?;
        Ok(Flow::Continue)
    }

    /// A failure that may be an outage (or wrong settings) or one row's own. A Write of several
    /// rows backs the whole relay off on `schedule` and its rows are next sent in Writes half as
    /// large. A row alone is struck if the failure is its own (see the module's "Failures"),
    /// else held just past the relay's wait.
    async fn halve_or_hold(
        &mut self,
        tx: &impl GenericClient,
        plan: Plan,
        e: &WriteError,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
        schedule: Backoff,
    ) -> Result<Flow, StoreError> {
        let alone = (plan.rows.len() == 1).then(|| plan.rows[0].0.id);
        self.note(true, alone);
        if plan.rows.len() > 1 {
            let half = (plan.rows.len() / 2).max(1);
            for (c, _) in &plan.rows {
                let m = self.memo.entry(c.id).or_default();
                m.max_rows = Some(half);
                m.failed_epoch = Some(self.epoch);
            }
            self.outage(tx, &plan, e, blocked, report, schedule).await?;
            return Ok(Flow::Stop);
        }
        let id = plan.rows[0].0.id;
        let epoch = self.epoch;
        let others_succeed = self.others_nearly_all_succeed(id);
        let m = self.memo.entry(id).or_default();
        // Other Writes succeeded since this row last failed, and nearly all Writes but this
        // row's do: the row, not OpenFGA, is the problem. A failure others share is no strike.
        let strike = m.failed_epoch.is_some_and(|e| e != epoch) && others_succeed;
        m.failed_epoch = Some(epoch);
        m.max_rows = Some(1);
        if !strike {
            // Held just past the relay's own wait, so that the next pass sends the other rows
            // first: how they fare tells an outage from this row's own failure.
            let wait = e
                .retry_after()
                .unwrap_or_else(|| schedule.ceiling(self.streak + 1));
            let at = Instant::now() + wait + schedule.base;
            m.retry_at = Some(at);
            report.due(at);
            self.outage(tx, &plan, e, blocked, report, schedule).await?;
            return Ok(Flow::Stop);
        }
        m.strikes += 1;
        let strikes = m.strikes;
        let class = e.class();
        self.metrics.failed(class.as_str());
        report.failed_writes += 1;
        blocked.extend(plan.rows[0].0.hashes.iter().copied());
        if strikes >= self.settings.max_attempts {
            let reason = format!(
                "gave up after {strikes} failed attempts while other rows were delivered: {e}"
            );
            self.dead_letter(tx, id, &reason, None, report).await?;
            return Ok(Self::after_retry_after(e, report));
        }
        let at = Instant::now() + ROW_BACKOFF.delay(strikes);
        if let Some(m) = self.memo.get_mut(&id) {
            m.retry_at = Some(at);
        }
        report.due(at);
        if class == FailureClass::Configuration {
            // Loud still: a refusal of one row's content may be a proxy's rule to look at.
            error!(class = class.as_str(), rows = 1, id, strikes, error = %e,
                "row keeps failing while others are delivered; holding it back");
        } else {
            warn!(class = class.as_str(), rows = 1, id, strikes, error = %e,
                "row keeps failing while others are delivered; holding it back");
        }
        self.store.record_failure(tx, &[id], &e.to_string()).await?;
        Ok(Self::after_retry_after(e, report))
    }

    /// After a failure that is one row's own: the server may still have asked everyone to wait
    /// (`Retry-After`), whoever is at fault; then no more Writes this pass.
    fn after_retry_after(e: &WriteError, report: &mut PassReport) -> Flow {
        match e.retry_after() {
            Some(d) => {
                report.wait = Some(report.wait.map_or(d, |w| w.max(d)));
                Flow::Stop
            }
            None => Flow::Continue,
        }
    }

    /// A failure of the whole relay (outage or configuration): record it on the rows, block
    /// their tuples for this pass, and back off.
    async fn outage(
        &mut self,
        tx: &impl GenericClient,
        plan: &Plan,
        e: &WriteError,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
        schedule: Backoff,
    ) -> Result<(), StoreError> {
        let ids = plan.ids();
        for (c, _) in &plan.rows {
            blocked.extend(c.hashes.iter().copied());
        }
        self.streak += 1;
        let class = e.class();
        self.metrics.failed(class.as_str());
        report.failed_writes += 1;
        let wait = e
            .retry_after()
            .unwrap_or_else(|| schedule.delay(self.streak));
        report.wait = Some(report.wait.map_or(wait, |w| w.max(wait)));
        if class == FailureClass::Configuration {
            error!(class = class.as_str(), rows = ids.len(), error = %e, retry_in = ?wait,
                "OpenFGA refused the relay's writes: check its settings");
        } else {
            warn!(class = class.as_str(), rows = ids.len(), error = %e, retry_in = ?wait,
                "write failed");
        }
        self.store.record_failure(tx, &ids, &e.to_string()).await?;
        Ok(())
    }

    /// Gives up on row `id` (see [`Store::dead_letter`]); returns whether it did.
    async fn dead_letter(
        &mut self,
        tx: &impl GenericClient,
        id: i64,
        reason: &str,
        read: Option<&str>,
        report: &mut PassReport,
    ) -> Result<bool, StoreError> {
        if !self.store.dead_letter(tx, id, reason, read).await? {
            debug!(
                id,
                "not dead-lettered: another session holds the row, or changed it"
            );
            return Ok(false);
        }
        warn!(id, reason, "row dead-lettered");
        self.memo.remove(&id);
        self.metrics.rows_dead_lettered.inc();
        report.dead += 1;
        Ok(true)
    }
}
