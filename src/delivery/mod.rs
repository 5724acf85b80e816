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
use crate::liveness::{Liveness, Stamp};
use crate::metrics::Metrics;
use crate::openfga::FgaClient;
use crate::send_window::SendWindow;
use crate::store::{Store, StoreError};
use crate::wake::{Bell, Trigger};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod core;
mod judge;
mod lanes;
mod mark;
#[cfg(test)]
mod model;
mod order;
mod read;
mod read_gate;
mod turn;
mod write;

use core::{Core, Flight};
use read::Ahead;
use write::{Answer, Spare};

/// What the relay remembers about a row while it is pending.
#[derive(Debug, Default)]
struct Memo {
    /// The most rows a Write holding this row may carry (halved by transient failures).
    max_rows: Option<usize>,
    /// For a row sent in parts: the most operations a part may carry (halved while OpenFGA
    /// finds a part too large).
    max_part: Option<usize>,
    /// When this row last failed transiently (the answer known).
    failed_at: Option<Instant>,
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

impl Memo {
    /// Whether a row is kept in hand for what is remembered of it, when rows of held stores
    /// are let go (`Core::let_go_held`): operations already applied, counted by their index in
    /// the row as it was read (a row let go may be changed before it is read again). The rest
    /// of what is remembered of a row let go stays with its id (its strikes, its own backoff,
    /// the size of the Writes it may go in), so that a row that keeps failing is still found
    /// out and given up on.
    fn kept_in_hand(&self) -> bool {
        !self.done.is_empty()
    }
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
    /// Rows found by reads the sweep woke the stream for, while writers were to notify it:
    /// rows no notification announced.
    pub swept: u64,
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

/// The delivery engine: the stream's I/O around its [`Core`]. One per relay; only the relay
/// holding leadership streams.
pub struct Deliverer {
    store: Store,
    client: Arc<FgaClient>,
    core: Core,
    /// The rows just read, locked, for the next Write (see [`Spare`]).
    spare: Option<Spare>,
    /// What was read ahead for the stores rows name.
    ahead: Ahead,
    /// Whether more pending rows may be there to read (the last read filled its page, or
    /// something may have committed since).
    want_read: bool,
    /// The stores the last read left out for having a read's worth of rows queued: once one
    /// of them has fewer, its rows left unread are read (no notification will say so).
    full: Vec<Option<Arc<str>>>,
    /// The lanes the read under way leaves out (held, or full), as lanes are keyed: a row of
    /// one of them that the read's filter let through (it names the configured store's id,
    /// resolved only since the filter was made) is not queued, as the rows of its lane below
    /// it were left out.
    left_out: Vec<Option<Arc<str>>>,
    /// When the last read left out the stores held then (see `Deliverer::holds_due`).
    read_at: Option<Instant>,
    /// When rows were last read, for `--linger`.
    last_read: Option<Instant>,
    /// The reads of the last ten polls that found rows: when, and how many.
    found: std::collections::VecDeque<(Instant, usize)>,
    /// Rows come faster than notifications are worth: the reads of the last ten polls (see
    /// `turn::poll`) found ten rows or more, and it lasts until they find none. The stream then
    /// lets the wake lock go and reads again after each poll, so that writers skip NOTIFY,
    /// which at such rates costs them much of their throughput; taking the lock back (queued
    /// behind the writers that hold it, who notify meanwhile) for each short gap between rows
    /// would cost them as much.
    rapid: bool,
    /// A read stopped at a row that waits for the configured store's id (`--store-name` not
    /// resolved yet): when to read again. Apart from the core's `due`, which each turn's
    /// planning sets anew from the rows in the queue: no row in the queue says this.
    read_again_at: Option<Instant>,
    /// When lasting conditions the reads meet were last said (once a minute while they last).
    said: crate::recurring::Recurring,
    /// When a Write last landed, left with none in flight, or got an answer to one of its
    /// requests to OpenFGA (each within one request timeout): while Writes are in flight, the
    /// stream is alive only if they move now and then; one stuck on a connection that never
    /// answers stops the beats. Shared with the Writes' tasks.
    progress: Arc<Stamp>,
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
        Deliverer {
            store,
            client,
            core: Core::new(settings, metrics, max_tuples),
            spare: None,
            ahead: Ahead::default(),
            full: Vec::new(),
            left_out: Vec::new(),
            want_read: true,
            read_at: None,
            last_read: None,
            found: std::collections::VecDeque::new(),
            rapid: false,
            read_again_at: None,
            said: crate::recurring::Recurring::default(),
            progress: Arc::default(),
            liveness,
        }
    }

    /// Forgets what was learnt about rows, e.g. when another relay may have delivered them.
    /// Only between streams (nothing in flight).
    pub fn forget(&mut self) {
        self.core.forget();
        self.spare = None;
        self.left_out.clear();
        self.ahead = Ahead::default();
        self.want_read = true;
    }

    /// Says the stream is alive: now while no Write is in flight (it waits, or works), and
    /// while Writes are in flight as of their last step (see `progress`), so that one stuck
    /// on a connection that never answers is found stuck a liveness timeout after that step.
    fn pulse(&self, flying: bool) {
        if flying {
            self.liveness.beat_at(&self.progress);
        } else {
            self.liveness.beat();
        }
    }

    /// Runs the stream (see the module) until `controls.mode` says it ends, or a database error
    /// does (after the Writes in flight have landed). Returns what it did since it last said.
    pub async fn stream(&mut self, controls: Controls<'_>) -> Result<PassReport, StoreError> {
        let mut turn = turn::Turn::new(self, &controls);
        self.want_read = true;
        loop {
            self.pulse(!turn.flights.is_empty());
            if turn.launching && !(controls.keep_going)() {
                turn.stop(&mut self.core.report);
            }
            if !turn.launching && turn.flights.is_empty() {
                break;
            }
            if turn.launching
                && let Err(e) = self.recheck_bars().await
            {
                turn.fail(e);
            }
            if turn.launching
                && let Err(e) = self.check_retried().await
            {
                turn.fail(e);
            }
            if turn.launching {
                self.read_if_wanted(&mut turn).await;
            }
            if turn.launching {
                self.launch(&mut turn).await;
            }
            self.settle(&mut turn).await;
            if turn.launching && turn.flights.is_empty() && !self.want_read && self.core.idle() {
                match &controls.mode {
                    Mode::UntilIdle => break,
                    Mode::Forever { account, .. } => {
                        account(turn.trigger, &std::mem::take(&mut self.core.report));
                        turn.trigger = Trigger::Again;
                    }
                }
            }
            self.wait(&mut turn, &controls).await;
        }
        turn.mute(&controls).await;
        turn.end(self).await?;
        self.core.report.next_due = self.core.due.into_iter().chain(self.read_again_at).min();
        Ok(std::mem::take(&mut self.core.report))
    }
}

/// How long to wait before the stream looks again at rows no notification will announce: held
/// by another session.
const LOCKED_ROWS_POLL: Duration = Duration::from_millis(500);

/// Writes about to leave ask here whether they still may (see `Flight::send`).
type Asks = mpsc::UnboundedReceiver<oneshot::Sender<bool>>;
/// The Writes in flight.
type Flights = JoinSet<(Flight, Result<Answer, StoreError>)>;
