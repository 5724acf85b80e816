//! Delivery: one pass over the pending rows, in id order, into as few Writes as OpenFGA allows,
//! several in flight at once, without ever reordering two operations on the same tuple.
//!
//! This file runs the pass: it reads pages of pending rows, keeps the Writes in flight, and
//! remembers what it learnt about rows across passes. The rest, a concept a file:
//!
//! - [`order`]: the order rule, which rows a Write may carry;
//! - [`read`]: reading rows into the pass, a page at a time, and a store's rows ahead;
//! - [`write`]: one Write, its lock, send and mark;
//! - [`judge`]: the judgement of an answer (strikes, halving, dead letters);
//! - [`stores`]: the judgement per store (a row's failure, its store's, or the relay's).

use crate::config::DeliverySettings;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::openfga::FgaClient;
use crate::send_window::SendWindow;
use crate::store::{Store, StoreError};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

mod judge;
mod order;
mod read;
mod stores;
mod write;

use order::Candidate;
use read::Ahead;
use stores::{Outcome, StoreHold};
use write::{Answer, Crew, Flight, Gate, Spare};

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
    /// "already exists"/"does not exist"), or that it must not apply (a retried row's
    /// operations superseded by later rows), by index.
    done: HashSet<usize>,
    /// For a row that came back from dead: its superseded operations were looked for.
    checked: bool,
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
    /// The stores whose Writes fail while other stores' succeed (`None`: the configured one).
    holds: HashMap<Option<Arc<str>>, StoreHold>,
    /// The Writes allowed in flight at once, as TCP's congestion window: halved on 429, 5xx
    /// and timeouts, grown by one per window of successes, up to `max_in_flight`.
    window: f64,
    /// Told at each step of a pass (a page read, a Write answered): a long pass that moves is
    /// alive, one stuck on a connection that never answers is not.
    liveness: Arc<Liveness>,
}

impl Deliverer {
    pub fn new(
        store: Store,
        client: Arc<FgaClient>,
        metrics: Metrics,
        settings: DeliverySettings,
        max_tuples: usize,
        liveness: Arc<Liveness>,
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
            holds: HashMap::new(),
            liveness,
        }
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
        let mut ahead = Ahead::default();
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
            // Each turn follows a step done: a page read, a Write answered, a Write let leave.
            self.liveness.beat();
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
                    .read_page(
                        from,
                        limit,
                        first,
                        &ahead,
                        &mut queue,
                        &mut blocked,
                        &mut report,
                    )
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
                // A Write to a store rows name that its rows in the queue fill less than half
                // (rows spread over many stores): that store's next rows are read ahead, as many
                // as fill the Write at the plan's operations per row (more would stay in the
                // queue, and a queue full of such leftovers reads ahead for no other store), and
                // it is planned again with them. With the queue full, the Write goes as it is.
                if let Some(store) = plan.target.store.clone()
                    && plan.room
                    && !exhausted
                    && plan.n_ops() * 2 < self.max_tuples
                    && !ahead.done(&store)
                    && queue.len() < read::AHEAD_PAGES * batch
                {
                    let per_row = plan.n_ops().div_ceil(plan.rows.len().max(1)).max(1);
                    let want = (self.max_tuples - plan.n_ops()).div_ceil(per_row).max(1);
                    Self::requeue(&mut queue, plan.into_rows());
                    let read = self
                        .read_ahead(
                            &store,
                            from,
                            want,
                            &mut ahead,
                            &mut queue,
                            &mut blocked,
                            &mut report,
                        )
                        .await;
                    if let Err(e) = read {
                        failed.get_or_insert(e);
                        launching = false;
                        break;
                    }
                    continue;
                }
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
}
