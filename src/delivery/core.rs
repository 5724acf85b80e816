//! The stream's decisions, without I/O: what is in hand, what to read (which ids to leave out,
//! which stores), what to send next (`order.rs`), and what an answer means (`judge.rs`), over a
//! clock the caller gives. The stream (`mod.rs`, `turn.rs`, `read.rs`, `write.rs`) does the
//! reading, locking, sending and marking around it; a model test (`model.rs`) drives it through
//! random interleavings of commits, answers, crashes and stores failing, against a reference of
//! the guarantees.

use super::lanes::Lanes;
use super::order::{Candidate, Plan};
use super::write::Gate;
use super::{Memo, PassReport};
use crate::config::DeliverySettings;
use crate::metrics::Metrics;
use crate::store::Noted;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// The stream's state.
pub(super) struct Core {
    pub(super) settings: DeliverySettings,
    pub(super) metrics: Metrics,
    /// Tuples per Write: `--max-tuples-per-write`, lowered if OpenFGA says it allows fewer.
    pub(super) max_tuples: usize,
    pub(super) memo: HashMap<i64, Memo>,
    /// The rows in hand not in flight, in id order.
    pub(super) queue: BTreeMap<i64, Candidate>,
    /// The rows in flight.
    pub(super) flying: HashSet<i64>,
    /// Tuples of the Writes in flight (every tuple of their rows), with how many hold each.
    pub(super) in_flight: HashMap<u64, usize>,
    /// Rows in flight per store (`None`: the configured store).
    flying_rows: HashMap<Option<Arc<str>>, usize>,
    /// Rows with nothing left to send (a retried row whose every operation is superseded): to
    /// be marked delivered, their tuples blocked until then.
    pub(super) to_mark: Vec<i64>,
    /// A store each, with its hold and its judgement.
    pub(super) lanes: Lanes,
    /// The Writes allowed in flight at once, as TCP's congestion window: halved on 429, 5xx
    /// and timeouts, grown by one per window of successes, up to `max_in_flight`.
    pub(super) window: f64,
    /// Rows in the queue that could not go at the last planning (held back, or behind such a
    /// row): they do not count as rows ready to send.
    pub(super) stuck: usize,
    /// Rows in the queue, of stores not tried yet, that wait at the last planning for a turn
    /// the stores not trusted cannot have while theirs fill half the window (see
    /// `Scan::waits_turn`): ready for the reads, not for the trusted stores' read beside a
    /// queue at its bound (see `Core::trusted_read_due`).
    pub(super) untried_waiting: usize,
    /// When the earliest row held back, or store held, may go again.
    pub(super) due: Option<Instant>,
    /// Rows in the queue that cannot be decoded (`Candidate::malformed`): looked for only
    /// while there are some.
    pub(super) bars: usize,
    /// Rows that came back from dead (with their `retried_at`) read while a Write touching
    /// their tuples was in flight: whether a later row superseded them is known only once that
    /// Write has landed and its rows are marked. They wait in their place, keeping their
    /// tuples, until then, and are looked at (`Deliverer::check_retried`) before they may go.
    pub(super) unchecked: HashMap<i64, SystemTime>,
    pub(super) report: PassReport,
}

/// What the stream must do for a judgement: record failures on rows, and try to dead-letter
/// rows (each either dead-lettered, then [`Core::dead`], or not, then [`Core::refused`]).
#[derive(Default)]
pub(super) struct Effects {
    pub(super) record: Vec<(Vec<i64>, String)>,
    pub(super) give_up: Vec<(Candidate, String)>,
}

/// A Write in flight, as the core knows it.
pub(super) struct Flight {
    pub(super) plan: Plan,
    /// Every tuple its rows touch: no other Write in flight may touch them.
    pub(super) keys: Vec<u64>,
    /// Rows all of whose operations it applies: marked delivered in its transaction.
    pub(super) complete: Vec<i64>,
    /// Whether its transaction locks its rows by marking them delivered, one change to each row
    /// instead of a lock and then a mark: when it completes every row, none of which the relay
    /// remembers anything of (found held by another session, failed, sent in parts), and its
    /// store's last Write did not fail. So a row another session holds (which the mark waits
    /// for a moment, then gives up on) is met this way once, an answer that finishes only some
    /// rows is rare, and a failing store's tries leave no dead row versions behind (a mark
    /// rolled back does, a lock does not).
    pub(super) by_marking: bool,
    /// Its store's `Retry-After` gate.
    pub(super) gate: Gate,
    /// When it was launched: its success shows that its store worked after a failure only if
    /// it left after that failure was known.
    pub(super) left: Instant,
}

impl Core {
    pub(super) fn new(settings: DeliverySettings, metrics: Metrics, max_tuples: usize) -> Core {
        let window = settings.max_in_flight.max(1) as f64;
        metrics.write_window.set(window as i64);
        Core {
            settings,
            metrics,
            max_tuples: max_tuples.max(1),
            memo: HashMap::new(),
            queue: BTreeMap::new(),
            flying: HashSet::new(),
            in_flight: HashMap::new(),
            flying_rows: HashMap::new(),
            to_mark: Vec::new(),
            lanes: Lanes::default(),
            window,
            stuck: 0,
            untried_waiting: 0,
            due: None,
            bars: 0,
            unchecked: HashMap::new(),
            report: PassReport::default(),
        }
    }

    /// Forgets what was learnt about rows, e.g. when another relay may have delivered them.
    /// Only with nothing in flight. The stores' holds stay: a store failing still fails.
    pub(super) fn forget(&mut self) {
        self.memo.clear();
        self.queue.clear();
        self.flying.clear();
        self.in_flight.clear();
        self.flying_rows.clear();
        self.to_mark.clear();
        self.bars = 0;
        self.unchecked.clear();
    }

    /// The Writes that may be in flight now.
    pub(super) fn window(&self) -> usize {
        (self.window as usize).clamp(1, self.settings.max_in_flight.max(1))
    }

    /// A Write succeeded: grow the window by one Write per window's worth of successes.
    pub(super) fn widen(&mut self) {
        let max = self.settings.max_in_flight.max(1) as f64;
        self.window = (self.window + 1.0 / self.window).min(max);
        self.metrics.write_window.set(self.window() as i64);
    }

    /// OpenFGA struggles (429, 5xx, timeout): halve the window.
    pub(super) fn narrow(&mut self) {
        self.window = (self.window / 2.0).max(1.0);
        self.metrics.write_window.set(self.window() as i64);
    }

    /// Whether nothing in the queue can go before something happens.
    pub(super) fn idle(&self) -> bool {
        self.queue.len() <= self.stuck
    }

    /// Every id in hand: queued or in flight. A read leaves them out.
    pub(super) fn hand(&self) -> Vec<i64> {
        self.queue
            .keys()
            .copied()
            .chain(self.flying.iter().copied())
            .collect()
    }

    /// The stores whose rows a read leaves out (as their rows' `store_id` is matched: `""` for
    /// the rows naming none, and `configured`, the configured store's id, for those naming it):
    /// those held, and those with a read's worth of rows queued already, so that one store's
    /// backlog at the head of the table (a store that keeps failing, or a large one) never
    /// fills the queue before the other stores' rows are read.
    /// `full` is [`Core::full`].
    pub(super) fn closed(
        &self,
        configured: Option<&str>,
        full: &[Option<Arc<str>>],
        now: Instant,
    ) -> Vec<String> {
        let mut closed = self.lanes.closed(configured, now);
        for store in full {
            match store.as_deref() {
                Some(s) => closed.push(s.to_owned()),
                None => {
                    closed.push(String::new());
                    closed.extend(configured.map(str::to_owned));
                }
            }
        }
        closed.sort_unstable();
        closed.dedup();
        closed
    }

    /// The trusted stores' lanes (see `Lanes::trusted`) that OpenFGA answered, as a read
    /// matches them (`""`: the configured store's lane), but those in `closed` (held, or with a
    /// read's worth queued): the most recently proven first, a read's worth of them at most.
    pub(super) fn trusted_lanes(&self, closed: &[&str], now: Instant) -> Vec<String> {
        let batch = self.settings.batch_size.max(1);
        self.lanes
            .answered_trusted(now)
            .into_iter()
            .map(|store| store.as_deref().unwrap_or("").to_owned())
            .filter(|key| !closed.contains(&key.as_str()))
            .take(batch)
            .collect()
    }

    /// The stores with rows in hand: queued, or in a Write in flight.
    pub(super) fn served(&self) -> Vec<Option<Arc<str>>> {
        let mut stores: Vec<Option<Arc<str>>> = self.lanes.flying_stores().cloned().collect();
        let mut last: Option<&Option<Arc<str>>> = None;
        // Rows come in runs of one store.
        for c in self.queue.values() {
            if last != Some(&c.target.store) {
                last = Some(&c.target.store);
                stores.push(c.target.store.clone());
            }
        }
        stores.sort_unstable();
        stores.dedup();
        stores
    }

    /// How many rows in hand could go in the one Write more a full window holds: those of
    /// trusted stores with no Write in flight, of a store not tried yet only while the stores
    /// not trusted have at most half the window in flight (see `Core::plan_spare`).
    pub(super) fn ready_for_spare(&self, now: Instant) -> usize {
        let mut last: Option<(&Option<Arc<str>>, bool)> = None;
        let mut ready = 0;
        let untried_room = self.untrusted_flying() <= self.untrusted_cap();
        // Rows come in runs of one store: one look a run. A held store's rows cannot go in it
        // either, nor those of a store not trusted.
        for c in self.queue.values() {
            let idle = match last {
                Some((store, idle)) if *store == c.target.store => idle,
                _ => {
                    self.lanes.flying_of(&c.target.store) == 0
                        && self.lanes.held(&c.target, now).is_none()
                        && self.lanes.trusted(&c.target.store)
                        && (untried_room || !self.lanes.untried(&c.target.store))
                }
            };
            last = Some((&c.target.store, idle));
            ready += usize::from(idle);
        }
        ready
    }

    /// How many Writes of stores not trusted (see `Lanes::trusted`) are in flight: together
    /// they have half the window at most (see `Core::plan`).
    pub(super) fn untrusted_flying(&self) -> usize {
        self.flying_rows
            .keys()
            .filter(|store| !self.lanes.trusted(store))
            .map(|store| self.lanes.flying_of(store))
            .sum()
    }

    /// The most Writes the stores not trusted may have in flight together: half the window.
    pub(super) fn untrusted_cap(&self) -> usize {
        (self.window() / 2).max(1)
    }

    /// How many rows of `store` (`None`: the configured store) are queued, with ids below
    /// `below` if given.
    pub(super) fn queued_of(&self, store: &Option<Arc<str>>, below: Option<i64>) -> usize {
        let rows = match below {
            Some(id) => self.queue.range(..id),
            None => self.queue.range(..),
        };
        rows.filter(|(_, c)| c.target.store == *store).count()
    }

    /// Whether the core counts nothing in flight: true whenever no Write is (checked in debug
    /// builds, so that counts that drift from the Writes show in tests).
    /// No row in hand: none queued, none in flight.
    pub(super) fn nothing_in_hand(&self) -> bool {
        self.queue.is_empty() && self.nothing_flying()
    }

    pub(super) fn nothing_flying(&self) -> bool {
        self.flying.is_empty() && self.in_flight.is_empty() && self.flying_rows.is_empty()
    }

    /// How many rows of `store` (`None`: the configured store) are in hand: queued or in
    /// flight.
    pub(super) fn in_hand_of(&self, store: &Option<Arc<str>>) -> usize {
        self.queued_of(store, None) + self.flying_rows.get(store).copied().unwrap_or(0)
    }

    /// The stores with a read's worth of rows queued (`None`: the configured store).
    pub(super) fn full(&self) -> Vec<Option<Arc<str>>> {
        let batch = self.settings.batch_size.max(1);
        let mut queued: HashMap<&Option<Arc<str>>, usize> = HashMap::new();
        for c in self.queue.values() {
            *queued.entry(&c.target.store).or_default() += 1;
        }
        queued
            .into_iter()
            .filter(|(_, n)| *n >= batch)
            .map(|(store, _)| store.clone())
            .collect()
    }

    /// Lets go of the queued rows of stores held now: they leave the hand, and are read again,
    /// in id order, once their store's hold is over (a held store's rows are not read
    /// meanwhile; its hold's end comes due, see `Deliverer::holds_due`). For a queue at its bound
    /// with them, so that rows of held stores never take the room other stores' rows are read
    /// into. Only the rows of a store above every row of it that stays: one whose state would
    /// be lost with it (see [`Memo::kept_in_hand`]; or it bars its store, or waits to be marked
    /// or looked at) stays, and a row let go below it would be read again after it, and could
    /// be overtaken by it. What is remembered of the rows let go stays with their ids.
    /// Returns whether any row was let go.
    pub(super) fn let_go_held(&mut self, now: Instant) -> bool {
        let mut kept: HashSet<&Option<Arc<str>>> = HashSet::new();
        let mut held: Vec<i64> = Vec::new();
        for c in self.queue.values().rev() {
            if kept.contains(&c.target.store) || self.lanes.held(&c.target, now).is_none() {
                continue;
            }
            if self.flying_rows.contains_key(&c.target.store) {
                // A Write of its store in flight comes back into the queue if it fails: a row
                // let go below its rows would be read again after them, and one of them, sent
                // again first, could overtake it (a row an operator moved onto their tuple
                // meanwhile). Let go once they land.
                kept.insert(&c.target.store);
                continue;
            }
            if c.malformed
                || self.to_mark.contains(&c.id)
                || self.unchecked.contains_key(&c.id)
                || self.memo.get(&c.id).is_some_and(Memo::kept_in_hand)
            {
                kept.insert(&c.target.store);
                continue;
            }
            held.push(c.id);
        }
        for id in &held {
            self.queue.remove(id);
            // Looked at again for superseding rows when read again: it may have changed.
            if let Some(m) = self.memo.get_mut(id) {
                m.checked = None;
            }
        }
        // They could not go: they were counted stuck.
        self.stuck = self.stuck.saturating_sub(held.len());
        !held.is_empty()
    }

    /// The rows in the queue that bar their store (`Candidate::malformed`) whose wait is over:
    /// to be looked at again by id.
    pub(super) fn bars_due(&self, now: Instant) -> Vec<i64> {
        self.queue
            .values()
            .filter(|c| c.malformed)
            .filter(|c| {
                let memo = self.memo.get(&c.id);
                memo.and_then(|m| m.retry_at).is_none_or(|at| at <= now)
            })
            .map(|c| c.id)
            .collect()
    }

    /// Takes a row read into the queue.
    pub(super) fn admit(&mut self, c: Candidate) {
        self.queue.insert(c.id, c);
    }

    /// Puts rows back into the queue, in their place.
    pub(super) fn requeue(&mut self, rows: Vec<Candidate>) {
        for c in rows {
            self.queue.insert(c.id, c);
        }
    }

    /// Something comes due at `at`: the stream looks again then.
    pub(super) fn due_at(&mut self, at: Instant) {
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }

    /// A planned Write leaves: its rows and tuples are in flight until it lands.
    pub(super) fn launch(&mut self, plan: Plan, now: Instant) -> Flight {
        let keys: Vec<u64> = plan
            .rows
            .iter()
            .flat_map(|(c, _)| c.hashes.iter().copied())
            .collect();
        let complete = plan
            .rows
            .iter()
            .filter(|(c, idx)| {
                self.memo.get(&c.id).map_or(0, |m| m.done.len()) + idx.len() >= c.ops.len()
            })
            .map(|(c, _)| c.id)
            .collect::<Vec<i64>>();
        let by_marking = complete.len() == plan.rows.len()
            && plan
                .rows
                .iter()
                .all(|(c, _)| !self.memo.contains_key(&c.id))
            && self.lanes.working(&plan.target);
        for h in &keys {
            *self.in_flight.entry(*h).or_default() += 1;
        }
        self.flying.extend(plan.ids());
        *self
            .flying_rows
            .entry(plan.target.store.clone())
            .or_default() += plan.rows.len();
        self.lanes.left(&plan.target, now);
        self.lanes.flying(&plan.target, true);
        self.report.writes += 1;
        let gate = self.lanes.gate(&plan.target);
        Flight {
            plan,
            keys,
            complete,
            by_marking,
            gate,
            left: now,
        }
    }

    /// A Write landed: its rows and tuples are no longer in flight.
    pub(super) fn landed(&mut self, keys: &[u64], plan: &Plan) {
        for h in keys {
            if let Some(n) = self.in_flight.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(h);
                }
            }
        }
        for (c, _) in &plan.rows {
            self.flying.remove(&c.id);
        }
        if let Some(n) = self.flying_rows.get_mut(&plan.target.store) {
            *n = n.saturating_sub(plan.rows.len());
            if *n == 0 {
                self.flying_rows.remove(&plan.target.store);
            }
        }
        self.lanes.flying(&plan.target, false);
    }

    pub(super) fn row_delivered(&mut self, c: &Candidate) {
        self.memo.remove(&c.id);
        self.report.delivered += 1;
        self.metrics.rows_delivered.inc();
        if let Ok(age) = SystemTime::now().duration_since(c.created_at) {
            self.metrics
                .delivery_latency_seconds
                .observe(age.as_secs_f64());
        }
    }

    /// A row given up on was dead-lettered.
    pub(super) fn dead(&mut self, id: i64) {
        self.memo.remove(&id);
        self.metrics.rows_dead_lettered.inc();
        self.report.dead += 1;
    }

    /// A row in the queue was delivered or dead-lettered by another session (or deleted): it
    /// leaves the hand, and its tuples with it.
    pub(super) fn gone(&mut self, id: i64) {
        if let Some(c) = self.queue.remove(&id)
            && c.malformed
        {
            self.bars = self.bars.saturating_sub(1);
        }
        self.unchecked.remove(&id);
        self.memo.remove(&id);
    }

    /// A row could not be dead-lettered (another session holds it, or changed it): it stays
    /// pending, in the queue, held back briefly, and keeps its tuples, so that no later row on
    /// them overtakes it; its Write is tried again.
    pub(super) fn refused(&mut self, c: Candidate, now: Instant) {
        self.report.locked += 1;
        self.hold_back(c.id, now);
        self.requeue(vec![c]);
    }

    /// Holds a row back briefly: another session holds it, and no notification will say when
    /// it is let go.
    pub(super) fn hold_back(&mut self, id: i64, now: Instant) {
        let at = now + super::LOCKED_ROWS_POLL;
        self.memo.entry(id).or_default().retry_at = Some(at);
        self.report.held += 1;
        self.due_at(at);
    }

    /// Queues `bar` (a `Candidate::malformed` row: its operations unknown for now, another
    /// session holds it or it cannot be decoded), held back briefly, to be looked at again by
    /// id.
    pub(super) fn bar(&mut self, bar: Candidate, now: Instant) {
        let id = bar.id;
        self.admit(bar);
        self.bars += 1;
        self.hold_back(id, now);
    }

    /// What a look at retried row `id` for later rows that superseded it (`retried_at`: when it
    /// came back) found of its note: written, it is checked; held off by another session's lock,
    /// it waits to be looked at again; gone (delivered or dead-lettered by another session), it
    /// leaves the hand. Returns whether it is still in hand.
    pub(super) fn superseded_checked(
        &mut self,
        id: i64,
        retried_at: SystemTime,
        noted: Noted,
        now: Instant,
    ) -> bool {
        match noted {
            Noted::Written => {
                self.memo.entry(id).or_default().checked = Some(retried_at);
                self.unchecked.remove(&id);
                true
            }
            Noted::HeldElsewhere => {
                self.note_held_off(id, retried_at, now);
                true
            }
            Noted::Gone => {
                self.gone(id);
                false
            }
        }
    }

    /// A retried row whose note of superseded operations could not be written (another session
    /// holds it): it waits in its place, keeping its tuples, and is looked at again after a
    /// while (`Deliverer::check_retried`), its note written then, before it may go.
    pub(super) fn note_held_off(&mut self, id: i64, retried_at: SystemTime, now: Instant) {
        tracing::debug!(
            id,
            "a retried row another session holds: it waits for its note of superseded operations"
        );
        self.unchecked.insert(id, retried_at);
        self.report.locked += 1;
        self.hold_back(id, now);
    }

    /// Rows with nothing left to send, marked delivered: their tuples go.
    pub(super) fn marked(&mut self, ids: &[i64]) {
        for id in ids {
            if let Some(c) = self.queue.remove(id) {
                self.row_delivered(&c);
            }
        }
    }
}
