//! The stream's turns: what one call of [`Deliverer::stream`] keeps (the Writes in flight, the
//! wake lock, why it read), and the steps of a turn: read if rows are wanted, launch what may
//! go, settle what is left over, wait for the next thing to happen.

use super::read_gate::ReadAsk;
use super::write::Crew;
use super::{Asks, Controls, Deliverer, Flights, Mode, PassReport, read};
use crate::backoff::Backoff;
use crate::store::StoreError;
use crate::wake::Trigger;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Taking the wake lock again after writers held it through a whole wait for it (a writer's
/// transaction that stays open, having inserted while the relay was busy: it skipped NOTIFY):
/// quick at first, capped at 2 s, because such a transaction may stay open for minutes and the
/// relay must not read every few milliseconds all that time. Rows committed meanwhile wait up
/// to 2 s (each try queues for the lock, and writers notify while it does).
const WAKE_LOCK_POLL: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_secs(2));

/// How soon the stream reads again while rows come faster than one a poll (see
/// `Deliverer::rapid`): `--linger`, at least a millisecond. A row committed then waits at most
/// that for its read, as it would for a notification's read put off by `--linger`.
fn poll(linger: Duration) -> Duration {
    linger.max(Duration::from_millis(1))
}

/// A full window none of whose Writes landed for this long is held by slow Writes (a store
/// whose Writes are slow, or hang): the stream then waits as with room, holding the wake lock,
/// so that a row of another store committed meanwhile is read at once and goes in the Write a
/// full window holds for a store with none in flight (`Core::plan_spare`). A window full of
/// Writes that land every few milliseconds reads as they land, and writers need not notify.
pub(super) const STALLED: Duration = Duration::from_millis(250);

/// How often, while rows are in hand, the stream reads the rows of the stores with none in
/// hand, each lane from its own index: reads take the lowest pending ids, and behind a backlog
/// of one store another store's row committed since would otherwise wait for that whole backlog
/// to be read (23 s behind 5,000 rows in a test). Its row then goes in the next Write planned,
/// or in the one Write more a full window holds for a store with none in flight. One index
/// descent a store with rows pending, and a read of the lanes found: a fraction of a millisecond
/// twice a second with a single store's backlog, and only while the stream is busy.
pub(super) const FAIR_READ: Duration = Duration::from_millis(500);

/// What one call of the stream keeps.
pub(super) struct Turn<'a> {
    pub(super) crew: Crew,
    keep_going: &'a (dyn Fn() -> bool + Sync),
    asked: Asks,
    pub(super) flights: Flights,
    /// Writes may still be planned and sent.
    pub(super) launching: bool,
    failed: Option<StoreError>,
    /// What made the stream read since it last said what it did.
    pub(super) trigger: Trigger,
    /// The wake lock is held: writers notify.
    listening: bool,
    /// Tries of the wake lock that writers' locks refused in a row.
    spins: u32,
    /// When to try the wake lock again after a refusal.
    listen_at: Option<Instant>,
    /// A read put off by `--linger` is due then.
    pub(super) linger_until: Option<Instant>,
    /// Rows come fast, the wake lock let go: the next read is due then.
    poll_at: Option<Instant>,
    /// The sweep woke the stream: what the next read finds, no notification announced.
    swept: bool,
    /// When a Write last landed or left (see [`STALLED`]).
    moved_at: Instant,
    /// While rows are in hand: when the rows of the stores with none in hand are read (see
    /// [`FAIR_READ`]).
    fair_at: Option<Instant>,
    /// That read is due.
    fair: bool,
}

impl<'a> Turn<'a> {
    pub(super) fn new(d: &Deliverer, controls: &Controls<'a>) -> Turn<'a> {
        let (ask, asked) = mpsc::unbounded_channel();
        Turn {
            keep_going: controls.keep_going,
            crew: Crew {
                store: d.store.clone(),
                client: d.client.clone(),
                metrics: d.core.metrics.clone(),
                progress: d.progress.clone(),
                ask,
                window: controls.window.clone(),
                no_marking: Default::default(),
            },
            asked,
            flights: Flights::new(),
            launching: true,
            failed: None,
            trigger: match controls.mode {
                Mode::Forever { .. } => Trigger::Connect,
                Mode::UntilIdle => Trigger::Again,
            },
            listening: false,
            spins: 0,
            listen_at: None,
            linger_until: None,
            poll_at: None,
            swept: false,
            moved_at: Instant::now(),
            fair_at: None,
            fair: false,
        }
    }

    /// Stops on an error: nothing more is sent; the Writes in flight land.
    pub(super) fn fail(&mut self, e: StoreError) {
        self.failed.get_or_insert(e);
        self.launching = false;
    }

    /// Stops as asked (shutdown, leadership lost).
    pub(super) fn stop(&mut self, report: &mut PassReport) {
        report.interrupted = true;
        self.launching = false;
    }

    /// Ends the call: lets the wake lock go, and says how it ended.
    pub(super) async fn end(mut self, d: &mut Deliverer) -> Result<(), StoreError> {
        d.release_spare(&mut self).await;
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        Ok(())
    }

    /// Lets the wake lock go (writers stop notifying), if held.
    pub(super) async fn mute(&mut self, controls: &Controls<'_>) {
        if !std::mem::take(&mut self.listening) {
            return;
        }
        if let Mode::Forever { bell, .. } = &controls.mode
            && let Err(e) = bell.mute().await
        {
            self.fail(e.into());
        }
    }
}

impl Deliverer {
    /// Reads the lowest pending rows not in hand, if rows are wanted and the queue has room
    /// for them.
    pub(super) async fn read_if_wanted(&mut self, turn: &mut Turn<'_>) {
        turn.linger_until = None;
        let ask = ReadAsk {
            wanted: self.want_read,
            fair: std::mem::take(&mut turn.fair),
            spare_only: self.spare_only(turn),
            store_known: self.client.configured_store_id().is_some(),
        };
        let Some(scope) = self.core.read_due(ask, Instant::now()) else {
            return;
        };
        let fair = scope != read::Scope::Lowest;
        let batch = self.core.settings.batch_size.max(1);
        // Rows keep coming while Writes fly: let `--linger` worth of them gather rather than
        // reading a row or two at a time (less CPU per row for the relay and its sessions).
        if !fair
            && !turn.flights.is_empty()
            && !self.core.settings.linger.is_zero()
            && let Some(last) = self.last_read
            && last.elapsed() < self.core.settings.linger
        {
            turn.linger_until = Some(last + self.core.settings.linger);
            return;
        }
        // With nothing in hand, the rows read are likely the next Write: read them locked, and
        // no larger than a Write can be, so that a read that is not one costs few locks.
        let lock = self.core.queue.is_empty() && self.spare.is_none() && !fair;
        let limit = if lock {
            batch.min(self.core.max_tuples)
        } else {
            batch
        };
        // This read is the poll's too, if one was due.
        turn.poll_at = None;
        match self.read_page(limit, lock, scope).await {
            Ok(read::Read { rows: n, more }) => {
                if std::mem::take(&mut turn.swept) {
                    self.core.report.swept += n as u64;
                }
                // A read of the other lanes only says nothing of the store left out; a read of
                // the trusted stores' lanes, nothing of the others either, but it is asked
                // again only while it brings rows (the others' are read once the queue has
                // room).
                self.want_read = match scope {
                    read::Scope::Others => more || self.want_read,
                    read::Scope::Lowest | read::Scope::Trusted => more,
                };
                let now = Instant::now();
                self.count_found(now, n);
                self.last_read = (n > 0).then_some(now);
                self.ahead = read::Ahead::default();
            }
            Err(e) => turn.fail(e),
        }
    }

    /// Arms the read of the stores with no row in hand while rows are in hand, and disarms it
    /// once none is: a stream with nothing in hand reads every store's rows in id order.
    pub(super) fn arm_fair_read(&self, turn: &mut Turn<'_>) {
        match self.core.nothing_in_hand() {
            true => turn.fair_at = None,
            false => {
                turn.fair_at
                    .get_or_insert_with(|| Instant::now() + FAIR_READ);
            }
        }
    }

    /// Whether the window is full and stalled (see [`STALLED`]): its Writes are slow, or hang,
    /// and a row of another store, which would go in the one Write more it holds, is read
    /// however many of the slow stores' rows are in hand (they cannot go in that Write; a store
    /// with a read's worth in hand is left out of reads). A full window that moves reads as
    /// its Writes land, as before: counting rows per store at every landing, and reading for
    /// other stores with a single store's backlog in hand (which walks that backlog), would
    /// cost a burn-down.
    fn spare_only(&self, turn: &Turn<'_>) -> bool {
        turn.flights.len() >= self.core.window() && turn.moved_at.elapsed() >= STALLED
    }

    /// Counts what a read found, and says from it whether rows come faster than one a poll
    /// (see `Deliverer::rapid`).
    fn count_found(&mut self, now: Instant, n: usize) {
        let span = 10 * poll(self.core.settings.linger);
        while self.found.front().is_some_and(|(t, _)| now - *t > span) {
            self.found.pop_front();
        }
        if n > 0 {
            self.found.push_back((now, n));
        }
        let recent: usize = self.found.iter().map(|(_, n)| n).sum();
        self.rapid = if self.rapid { recent > 0 } else { recent >= 10 };
    }

    /// Plans and sends Writes while the window has room.
    pub(super) async fn launch(&mut self, turn: &mut Turn<'_>) {
        self.core.due = None;
        self.core.stuck = 0;
        self.core.untried_waiting = 0;
        self.holds_due(Instant::now());
        while turn.launching && turn.flights.len() <= self.core.window() {
            let plan = match turn.flights.len() < self.core.window() {
                true => self.core.plan(Instant::now()),
                // The window is full: one more Write, of a store with none in flight.
                false => self.core.plan_spare(Instant::now()),
            };
            let Some(plan) = plan else {
                break;
            };
            if self.wants_more_of(&plan) {
                let Some(store) = plan.target.store.clone() else {
                    break;
                };
                let want = self.ahead_for(&plan);
                self.core.requeue(plan.into_rows());
                if let Err(e) = self.read_ahead(&store, want).await {
                    turn.fail(e);
                }
                continue;
            }
            if !(turn.keep_going)() {
                turn.launching = false;
                self.core.report.interrupted = true;
                self.core.requeue(plan.into_rows());
                break;
            }
            let locked = match self.spare.take() {
                Some(s) if s.fits(&plan) => Some(s.tx),
                Some(s) => {
                    if let Err(e) = s.tx.rollback().await {
                        turn.fail(e.into());
                        self.core.requeue(plan.into_rows());
                        break;
                    }
                    None
                }
                None => None,
            };
            let flight = self.core.launch(plan, Instant::now());
            if turn.flights.is_empty() {
                self.progress.mark();
            }
            turn.flights.spawn(flight.fly(turn.crew.clone(), locked));
            turn.moved_at = Instant::now();
            self.core
                .metrics
                .writes_in_flight
                .set(turn.flights.len() as i64);
        }
    }

    /// The rows of held stores are left out of reads (and may have been let go): a store's
    /// hold that ends after the last read left it out comes due, so that its rows are read
    /// then, whether or not any of them is in hand; one that ended since that read (between
    /// the read and now) wants a read at once.
    fn holds_due(&mut self, now: Instant) {
        let since = self.read_at.unwrap_or(now);
        match self.core.lanes.first_hold_end(since) {
            Some(end) if end > now => self.core.due_at(end),
            Some(_) => self.want_read = true,
            None => {}
        }
    }

    /// What is left over after launching: the locked read no Write used is let go (before
    /// anything else locks its rows), and rows with nothing left to send are marked.
    pub(super) async fn settle(&mut self, turn: &mut Turn<'_>) {
        self.release_spare(turn).await;
        if let Err(e) = self.mark_finished().await {
            turn.fail(e);
        }
        // Rows marked here, or found gone or dead-lettered by this turn's looks, left the queue.
        self.reopen();
        self.arm_fair_read(turn);
        debug_assert!(
            !turn.flights.is_empty() || self.core.nothing_flying(),
            "rows or tuples counted in flight with no Write in flight"
        );
    }

    pub(super) async fn release_spare(&mut self, turn: &mut Turn<'_>) {
        if let Some(s) = self.spare.take()
            && let Err(e) = s.tx.rollback().await
        {
            turn.fail(e.into());
        }
    }

    /// Before a wait with nothing to read and room in the window: takes the wake lock, so that
    /// writers notify (or, while rows come fast, arms the next poll instead); lets it go while
    /// busy. Returns false when the stream is not to wait now (it took the lock and reads once
    /// more: a writer that skipped NOTIFY has committed by then; or it failed).
    async fn listen_or_poll(&mut self, turn: &mut Turn<'_>, controls: &Controls<'_>) -> bool {
        let room = self.has_room(turn);
        if let Mode::Forever { bell, .. } = &controls.mode {
            if turn.listening && (self.want_read || !room || self.rapid) {
                // Busy, or rows come fast: it reads anyway, so writers need not notify.
                turn.mute(controls).await;
            }
            let idle = turn.launching && !turn.listening && !self.want_read && room;
            if idle && self.rapid {
                // Rows come faster than one a poll: read again after one, rather than take the
                // wake lock and have every writer notify. Ten polls that find none end this. A
                // poll already due stays due: the turns between (a Write answered, its question)
                // must not put it off, or at a Write a millisecond it would never come.
                turn.poll_at
                    .get_or_insert_with(|| Instant::now() + poll(self.core.settings.linger));
            } else if idle && turn.listen_at.is_none_or(|t| t <= Instant::now()) {
                match bell.listen().await {
                    Ok(true) => {
                        turn.listening = true;
                        turn.spins = 0;
                        turn.listen_at = None;
                        self.want_read = true;
                        return false;
                    }
                    Ok(false) => {
                        turn.spins += 1;
                        turn.listen_at = Some(Instant::now() + WAKE_LOCK_POLL.delay(turn.spins));
                    }
                    Err(e) => {
                        turn.fail(e.into());
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Whether the window has room for a Write: below its size, or full of Writes none of which
    /// moved for [`STALLED`] and without the one more it holds for a store with none in flight.
    fn has_room(&self, turn: &Turn<'_>) -> bool {
        let (n, window) = (turn.flights.len(), self.core.window());
        n < window || (n == window && turn.moved_at.elapsed() >= STALLED)
    }

    /// Waits for the next thing to happen: a Write's answer or its question, a notification
    /// or sweep, a row or store coming due, a put-off read, a stop. Before waiting with nothing
    /// to read and room in the window, the stream takes the wake lock (writers notify from then
    /// on) and reads once more: a writer that skipped NOTIFY has committed by then.
    pub(super) async fn wait(&mut self, turn: &mut Turn<'_>, controls: &Controls<'_>) {
        if !turn.launching && turn.flights.is_empty() {
            return;
        }
        if turn.launching
            && self.want_read
            && turn.flights.is_empty()
            && self.core.queue_has_room(false, Instant::now())
        {
            // Rows are wanted since this turn's read (a store left out for a full queue has
            // room now, its rows marked without a Write), and no Write in flight will wake the
            // stream for them: read now. Each read either fills the queue a step more or
            // leaves rows no longer wanted, so this goes round only a few times.
            return;
        }
        if !self.listen_or_poll(turn, controls).await {
            return;
        }
        let due = self.next_due(turn);
        let timer = async {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let rung = async {
            match &controls.mode {
                Mode::Forever { bell, .. } if turn.listening => bell.rung().await,
                _ => std::future::pending().await,
            }
        };
        let stop = crate::shutdown::any_cancelled(controls.stop);
        let beat = self.liveness.beat_interval();
        tokio::select! {
            biased;
            Some(reply) = turn.asked.recv() => {
                let go = (controls.keep_going)();
                if !go {
                    turn.stop(&mut self.core.report);
                }
                let _ = reply.send(go);
            }
            Some(joined) = turn.flights.join_next(), if !turn.flights.is_empty() => {
                turn.moved_at = Instant::now();
                self.core.metrics.writes_in_flight.set(turn.flights.len() as i64);
                match joined {
                    Ok((flight, answer)) => {
                        if let Err(e) = self.land(flight, answer).await {
                            turn.fail(e);
                        }
                    }
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    // Only aborted tasks end otherwise, and none is aborted while it runs.
                    Err(_) => {}
                }
            }
            trigger = rung => {
                self.want_read = true;
                turn.swept = trigger == Trigger::Sweep;
                if turn.trigger == Trigger::Again || trigger == Trigger::Notification {
                    turn.trigger = trigger;
                }
            }
            _ = timer => self.came_due(turn),
            // Once stopped, only the Writes in flight are waited for.
            _ = stop, if turn.launching => {}
            _ = tokio::time::sleep(beat) => {}
        }
    }

    /// The earliest of what the stream waits for on a clock: a row or store coming due, a read
    /// put off (`--linger`, a read again, the poll), the wake lock's next try.
    fn next_due(&self, turn: &Turn<'_>) -> Option<Instant> {
        [
            self.core.due,
            self.read_again_at,
            turn.linger_until,
            turn.listen_at,
            turn.poll_at,
            turn.fair_at,
            // A full window looked at again once it stalls.
            (turn.flights.len() == self.core.window() && !turn.listening)
                .then(|| turn.moved_at + STALLED)
                .filter(|at| *at > Instant::now()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// [`Deliverer::next_due`] came: a row or store came due (its store's rows are read
    /// again), a put-off read, or the wake lock's next try.
    fn came_due(&mut self, turn: &mut Turn<'_>) {
        self.core.due = None;
        self.read_again_at = None;
        self.want_read = true;
        turn.listen_at = None;
        turn.poll_at = None;
        if turn.fair_at.is_some_and(|at| at <= Instant::now()) {
            turn.fair_at = None;
            turn.fair = true;
        }
    }
}
