//! Delivery as one continuous stream: rows are read as they are committed, planned into as few
//! Writes as OpenFGA allows, several in flight at once, without ever reordering two operations
//! on the same tuple, and judged as their answers come; with a lane per store, so that one
//! store's trouble holds only its own rows.
//!
//! The stream is a loop over its state (the rows in hand, the Writes in flight, the lanes): each
//! turn reads when it wants rows, launches what may go, and waits for the next thing to happen
//! (an answer, a notification, a row or a lane coming due). Nothing waits for a batch of Writes
//! to end: a row committed while Writes fly is read and sent at once. The stages, a file each:
//!
//! - [`read`]: reading the lowest pending rows not in hand, and a store's rows ahead;
//! - [`order`]: planning, the order rule, which rows a Write may carry;
//! - [`write`]: flying one Write: its lock, send and mark;
//! - [`judge`]: the judgement of an answer (strikes, halving, dead letters);
//! - [`lanes`]: a lane per store: its hold, its `Retry-After`, its clock for judging answers.
//!
//! `run` streams until it stops leading; `drain` streams until nothing is left to do now.

use crate::config::DeliverySettings;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::openfga::FgaClient;
use crate::send_window::SendWindow;
use crate::store::{Store, StoreError};
use crate::wake::{Bell, Trigger};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod judge;
mod lanes;
mod order;
mod read;
mod turn;
mod write;

use lanes::Lanes;
use order::Candidate;
use read::Ahead;
use write::{Answer, Flight, Spare};

/// What the relay remembers about a row while it is pending.
#[derive(Debug, Default)]
struct Memo {
    /// The most rows a Write holding this row may carry (halved by transient failures).
    max_rows: Option<usize>,
    /// For a row sent in parts: the most operations a part may carry (halved while OpenFGA
    /// finds a part too large).
    max_part: Option<usize>,
    /// Its lane's success counter when this row last failed transiently.
    failed_epoch: Option<u64>,
    /// Transient failures alone while other rows of its store were delivered.
    strikes: u32,
    /// Held back until then.
    retry_at: Option<Instant>,
    /// Operations OpenFGA already applied (a split row's finished parts, or an older server's
    /// "already exists"/"does not exist"), or that it must not apply (a retried row's
    /// operations superseded by later rows), by index.
    done: HashSet<usize>,
    /// For a row that came back from dead: the `retried_at` its superseded operations were
    /// looked for at. A later dead letter and `retry` sets another, and they are looked for
    /// again.
    checked: Option<SystemTime>,
}

/// What the stream did since it last said so.
#[derive(Debug, Default, Clone)]
pub struct PassReport {
    pub delivered: u64,
    pub dead: u64,
    pub failed_writes: u64,
    pub writes: u64,
    /// Rows that could not go when planned: held back, behind a held row, in a held store, or
    /// held by another session.
    pub held: u64,
    /// Of those, rows held by another session: looked at again soon, as no notification will
    /// announce that the session let them go.
    pub locked: u64,
    /// When the earliest row held back, or store held, may go again.
    pub next_due: Option<Instant>,
    /// The stream stopped because it was asked to (shutdown, leadership lost).
    pub interrupted: bool,
}

impl PassReport {
    /// Whether anything changed.
    pub fn did_work(&self) -> bool {
        self.delivered + self.dead + self.failed_writes > 0
    }
}

/// How long the stream runs.
pub enum Mode<'a> {
    /// Until nothing is left to do now: every pending row read is delivered, dead, or held
    /// back until later (`next_due`). For `drain`.
    UntilIdle,
    /// Until stopped, waiting on the bell when nothing is left to do. For `run`: `account` is
    /// told what was done each time the stream goes idle.
    Forever {
        bell: &'a dyn Bell,
        account: &'a (dyn Fn(Trigger, &PassReport) + Sync),
    },
}

/// What a stream runs under.
pub struct Controls<'a> {
    /// Asked when a Write is planned and again right before it leaves (its rows locked): when
    /// it says no, the stream sends nothing more, waits for the Writes in flight, and ends.
    pub keep_going: &'a (dyn Fn() -> bool + Sync),
    /// Fired when `keep_going` turns false (shutdown, the session lost): wakes a waiting stream.
    pub stop: &'a [&'a CancellationToken],
    /// Writes leave only while it is open (the leader's lease).
    pub window: &'a SendWindow,
    pub mode: Mode<'a>,
}

/// The delivery engine. One per relay; only the relay holding leadership streams.
pub struct Deliverer {
    store: Store,
    client: Arc<FgaClient>,
    metrics: Metrics,
    settings: DeliverySettings,
    /// Tuples per Write: `--max-tuples-per-write`, lowered if OpenFGA says it allows fewer.
    max_tuples: usize,
    memo: HashMap<i64, Memo>,
    /// The rows in hand not in flight, in id order.
    queue: BTreeMap<i64, Candidate>,
    /// The rows in flight.
    flying: HashSet<i64>,
    /// Tuples of the Writes in flight (every tuple of their rows), with how many hold each.
    in_flight: HashMap<u64, usize>,
    /// The rows just read, locked, for the next Write (see [`Spare`]).
    spare: Option<Spare>,
    /// What was read ahead for the stores rows name.
    ahead: Ahead,
    /// Rows with nothing left to send (a retried row whose every operation is superseded): to
    /// be marked delivered, their tuples blocked until then.
    to_mark: Vec<i64>,
    /// A store each, with its hold and its judgement.
    lanes: Lanes,
    /// The Writes allowed in flight at once, as TCP's congestion window: halved on 429, 5xx
    /// and timeouts, grown by one per window of successes, up to `max_in_flight`.
    window: f64,
    /// Whether more pending rows may be there to read (the last read filled its page, or
    /// something may have committed since).
    want_read: bool,
    /// When rows were last read, for `--linger`.
    last_read: Option<Instant>,
    /// Rows in the queue that could not go at the last planning (held back, or behind such a
    /// row): they do not count as rows ready to send.
    stuck: usize,
    /// When the earliest row held back, or store held, may go again.
    due: Option<Instant>,
    report: PassReport,
    /// Told at each step (a read, a Write answered): a stream that moves is alive, one stuck on
    /// a connection that never answers is not.
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
            queue: BTreeMap::new(),
            flying: HashSet::new(),
            in_flight: HashMap::new(),
            spare: None,
            ahead: Ahead::default(),
            to_mark: Vec::new(),
            lanes: Lanes::default(),
            want_read: true,
            last_read: None,
            stuck: 0,
            due: None,
            report: PassReport::default(),
            liveness,
        }
    }

    /// Forgets what was learnt about rows, e.g. when another relay may have delivered them.
    /// Only between streams (nothing in flight).
    pub fn forget(&mut self) {
        self.memo.clear();
        self.queue.clear();
        self.flying.clear();
        self.in_flight.clear();
        self.spare = None;
        self.ahead = Ahead::default();
        self.to_mark.clear();
        self.want_read = true;
    }

    /// The Writes that may be in flight now.
    fn window(&self) -> usize {
        (self.window as usize).clamp(1, self.settings.max_in_flight.max(1))
    }

    /// Runs the stream (see the module) until `controls.mode` says it ends, or a database error
    /// does (after the Writes in flight have landed). Returns what it did since it last said.
    pub async fn stream(&mut self, controls: Controls<'_>) -> Result<PassReport, StoreError> {
        let mut turn = turn::Turn::new(self, &controls);
        self.want_read = true;
        loop {
            self.liveness.beat();
            if turn.launching && !(controls.keep_going)() {
                turn.stop(&mut self.report);
            }
            if !turn.launching && turn.flights.is_empty() {
                break;
            }
            if turn.launching {
                self.read_if_wanted(&mut turn).await;
            }
            if turn.launching {
                self.launch(&mut turn).await;
            }
            self.settle(&mut turn).await;
            if turn.launching && turn.flights.is_empty() && !self.want_read && self.queue_idle() {
                match &controls.mode {
                    Mode::UntilIdle => break,
                    Mode::Forever { account, .. } => {
                        account(turn.trigger, &std::mem::take(&mut self.report));
                        turn.trigger = Trigger::Again;
                    }
                }
            }
            self.wait(&mut turn, &controls).await;
        }
        turn.mute(&controls).await;
        turn.end(self).await?;
        self.report.next_due = self.due;
        Ok(std::mem::take(&mut self.report))
    }

    /// Whether nothing in the queue can go before something happens.
    fn queue_idle(&self) -> bool {
        self.queue.len() <= self.stuck
    }

    /// Every id in hand: queued or in flight.
    fn hand(&self) -> Vec<i64> {
        self.queue
            .keys()
            .copied()
            .chain(self.flying.iter().copied())
            .collect()
    }

    fn row_delivered(&mut self, c: &Candidate) {
        self.memo.remove(&c.id);
        self.report.delivered += 1;
        self.metrics.rows_delivered.inc();
        if let Ok(age) = SystemTime::now().duration_since(c.created_at) {
            self.metrics
                .delivery_latency_seconds
                .observe(age.as_secs_f64());
        }
    }
}

/// How long to wait before the stream looks again at rows no notification will announce: held
/// by another session.
const LOCKED_ROWS_POLL: Duration = Duration::from_millis(500);

/// Writes about to leave ask here whether they still may (see `Flight::send`).
type Asks = mpsc::UnboundedReceiver<oneshot::Sender<bool>>;
/// The Writes in flight.
type Flights = JoinSet<(Flight, Result<Answer, StoreError>)>;
