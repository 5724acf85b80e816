//! The order rule: which rows a Write may carry.
//!
//! A tuple is a tuple *in a store*: the same tuple in two stores is two tuples, and every key
//! below is (store, tuple), the rows naming no store being in the configured one. A Write goes
//! to one store and model (its [`Target`]), so it carries only rows of that target.
//!
//! A row is sent only if no earlier row that touches one of its tuples is still in the queue or
//! in flight: a row that fails, is held back (its own backoff, its store's hold), or is held by
//! another session stays in the queue, in its place, and every later row touching one of its
//! tuples waits behind it (and makes the rows behind it on its own tuples wait in turn). Rows on
//! other tuples go on. Rows leave the queue only for a Write, or when they are dead-lettered or
//! marked delivered.
//!
//! Everything that keeps two operations on one tuple in id order, and where it lives:
//!
//! - Reading ([`Deliverer::read_page`], `read.rs`): no cursor, the lowest pending ids not in
//!   hand, so that a row committed late is read before any row committed after it.
//! - Planning ([`Core::plan`], here): rows in id order; never one tuple twice in a
//!   Write; no row on a tuple of a Write in flight, nor behind an earlier row left waiting on it.
//! - Rows that stay in the queue and keep their tuples: a failed Write's rows and a row held
//!   back (the judgement, `judge.rs`); a row another session holds (the Write's lock,
//!   `write.rs`, then looked at again by id); a row given up on that could not be
//!   dead-lettered, held by another session or failed by the database (`Deliverer::write_back`,
//!   `mark.rs`); a row with nothing left to send until it is marked (here).
//! - Rows that bar every later row of their store, as which tuples they touch is not known: a
//!   row that cannot be decoded and could not be dead-lettered, and a row whose payload changed
//!   since it was read, until it is read again by id (`Deliverer::recheck_bars`, `read.rs`);
//!   one whose store cannot be told yet bars every store.
//! - Rows finished by a Write are marked delivered in that Write's transaction, before their
//!   tuples are released: on success, and on an older OpenFGA's "already exists" for a row's last
//!   operation (`Flight::finished_by`, `write.rs`).
//! - A row that came back from dead never applies an operation over a later delivered row's
//!   operation on its tuple ([`Deliverer::skip_superseded`], here), looked for once no Write on
//!   its tuples is in flight (`Core::unchecked`): a later row in flight is marked only when it
//!   lands.
//! - Only the leader sends, and only while its lease holds (`relay/`, `leadership.rs`).

use super::Deliverer;
use super::core::Core;
use super::lanes::Lanes;
use crate::openfga::Target;
use crate::payload::{Op, TupleKey};
use crate::store::{Noted, StoreError};
use deadpool_postgres::GenericClient;
use std::collections::HashSet;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tracing::warn;

/// A row in a pass.
pub(super) struct Candidate {
    pub(super) id: i64,
    pub(super) created_at: SystemTime,
    pub(super) ops: Arc<[Op]>,
    /// Where its Write goes.
    pub(super) target: Target,
    /// The hash of each operation's (store, tuple) key, parallel to `ops`.
    pub(super) hashes: Vec<u64>,
    /// The payload's text as read: the Write goes only if its lock finds the same (a page is
    /// read without locks), and a row is dead-lettered only for what it still says.
    pub(super) text: Arc<str>,
    /// Which tuples it touches is not known yet, so every later row of its store waits behind
    /// it until it is looked at again: it cannot be decoded, and could not be dead-lettered
    /// (another session holds it, maybe to correct it); or it changed between its read and its
    /// Write's lock, and is read again as it is now. Its store is the one its payload names, as
    /// far as that can be read.
    pub(super) malformed: bool,
    /// A row as `malformed` whose store cannot be told (it names a store while the configured
    /// store's id is not known: it may be that one): every later row of every store waits.
    pub(super) anywhere: bool,
}

/// The rows of one Write and which of their operations it carries, all for one target.
pub(super) struct Plan {
    pub(super) target: Target,
    pub(super) rows: Vec<(Candidate, Vec<usize>)>,
    /// The queue ran out of rows of its target before the Write was full: more would have
    /// fitted.
    pub(super) room: bool,
}

impl Plan {
    pub(super) fn ids(&self) -> Vec<i64> {
        self.rows.iter().map(|(c, _)| c.id).collect()
    }

    pub(super) fn into_rows(self) -> Vec<Candidate> {
        self.rows.into_iter().map(|(c, _)| c).collect()
    }

    /// The operations this Write carries, in order: borrowed from the rows, not copied.
    pub(super) fn ops(&self) -> Vec<&Op> {
        self.rows
            .iter()
            .flat_map(|(c, idx)| idx.iter().map(|&i| &c.ops[i]))
            .collect()
    }

    pub(super) fn n_ops(&self) -> usize {
        self.rows.iter().map(|(_, idx)| idx.len()).sum()
    }
}

/// The order key of a tuple in a store (`store` as [`Target::store_key`] gives it).
pub(super) fn key_hash(store: &str, k: &TupleKey) -> u64 {
    let mut h = DefaultHasher::new();
    store.hash(&mut h);
    k.hash(&mut h);
    h.finish()
}

/// What one planning scan of the queue has passed over so far.
#[derive(Default)]
struct Scan {
    /// Tuples of rows left in the queue: every later row on them waits too.
    waiting: HashSet<u64>,
    /// Stores behind a row that cannot be decoded.
    barred: HashSet<Option<Arc<str>>>,
    /// Every store is behind such a row, whose store cannot be told.
    all_barred: bool,
    /// Rows that cannot go now.
    stuck: usize,
    /// Rows of stores not tried yet waiting for their turn (see [`Scan::waits_turn`]).
    untried: usize,
    /// When the first of them may.
    due: Option<Instant>,
    /// Which rows this planning may take.
    pass: Pass,
    /// The stores not trusted with a row that may go, as met (see [`Core::plan`]).
    turns: Vec<Option<Arc<str>>>,
    /// A store not tried yet may send its first Write with the trusted stores' (see
    /// [`Core::plan`]).
    untried_room: bool,
    /// The store of the last row looked at, and what is known of it: rows come in runs of one
    /// store.
    last_store: Option<(Option<Arc<str>>, Seen)>,
}

/// What planning looks at of a store (see `Lanes`).
#[derive(Clone, Copy)]
struct Seen {
    /// It has Writes in flight.
    busy: bool,
    /// Its rows may go with the trusted stores' (see `Lanes::trusted`).
    trusted: bool,
    /// It was not tried yet.
    untried: bool,
}

/// Which rows a planning may take (see [`Core::plan`]).
#[derive(Default)]
enum Pass {
    /// Rows of trusted stores: the stores not trusted with a row that may go are noted.
    #[default]
    Trusted,
    /// The Write the window holds beyond its size: only a trusted store with no Write in
    /// flight may have it, one not tried yet only with `Scan::untried_room` (see
    /// [`Core::plan_spare`]).
    Spare,
    /// Rows of this store, not trusted, whose turn it is.
    Turn(Option<Arc<str>>),
}

impl Scan {
    /// Row `c` cannot go now: it, and every later row on its tuples, waits.
    fn wait(&mut self, c: &Candidate) -> bool {
        self.waiting.extend(c.hashes.iter().copied());
        self.stuck += 1;
        true
    }

    fn due_at(&mut self, at: Instant) {
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }

    /// What is known of the store of row `c`.
    fn look(&mut self, lanes: &Lanes, c: &Candidate) -> Seen {
        let store = &c.target.store;
        if let Some((last, seen)) = &self.last_store
            && last == store
        {
            return *seen;
        }
        let seen = Seen {
            busy: lanes.flying_of(store) > 0,
            trusted: lanes.trusted(store),
            untried: lanes.untried(store),
        };
        self.last_store = Some((store.clone(), seen));
        seen
    }

    /// Whether row `c`, which nothing else holds back, waits for its store's turn among the
    /// stores not trusted (see [`Core::plan`]): noted as such.
    fn waits_turn(&mut self, lanes: &Lanes, c: &Candidate) -> bool {
        if !matches!(self.pass, Pass::Trusted) {
            return false;
        }
        let seen = self.look(lanes, c);
        if seen.trusted && (!seen.untried || self.untried_room) {
            return false;
        }
        if self.turns.last() != Some(&c.target.store) {
            self.turns.push(c.target.store.clone());
        }
        if seen.untried {
            // Ready for the reads, as a trusted store's: counted stuck, a burn-down spread over
            // many stores not tried yet read on to the queue's bound, and the Writes it then
            // planned went without their stores' rows read ahead (10 tuples each, not 97).
            self.untried += 1;
            return true;
        }
        // Not ready either, for the reads: a queue full of such rows must not keep a read from
        // finding a trusted store's.
        self.wait(c)
    }

    /// Whether row `c` is not for this planning at all: of another store than the one whose
    /// turn it is, or, for the Write beyond the window, of a store with Writes in flight or not
    /// trusted. Such rows are passed over at the cost of a comparison, and not counted stuck
    /// (their tuples hold back no other store's: a tuple's key is its store's).
    fn not_for_this_pass(&mut self, lanes: &Lanes, c: &Candidate) -> bool {
        match &self.pass {
            Pass::Trusted => false,
            // A row whose store cannot be told (`Candidate::anywhere`) may be of this one: it bars
            // every later row, as in the other passes.
            Pass::Turn(store) => *store != c.target.store && !c.anywhere,
            Pass::Spare if c.malformed || self.all_barred => false,
            Pass::Spare => {
                let seen = self.look(lanes, c);
                seen.busy || !seen.trusted || (seen.untried && !self.untried_room)
            }
        }
    }
}

/// The Write being planned: its rows so far, the tuples they carry, and what limits it.
struct Draft {
    target: Option<Target>,
    rows: Vec<(Candidate, Vec<usize>)>,
    keys: HashSet<u64>,
    n_ops: usize,
    /// The fewest rows any of its rows' halving allows in one Write.
    cap: usize,
    /// No row was left out for want of room.
    room: bool,
}

impl Default for Draft {
    fn default() -> Self {
        Draft {
            target: None,
            rows: Vec::new(),
            keys: HashSet::new(),
            n_ops: 0,
            cap: usize::MAX,
            room: true,
        }
    }
}

impl Draft {
    fn add(&mut self, c: Candidate, ops: Vec<usize>, row_cap: usize) {
        self.keys.extend(ops.iter().map(|&i| c.hashes[i]));
        self.n_ops += ops.len();
        self.cap = self.cap.min(row_cap);
        self.rows.push((c, ops));
    }

    fn into_plan(self) -> Option<Plan> {
        let target = self.target?;
        (!self.rows.is_empty()).then_some(Plan {
            target,
            rows: self.rows,
            room: self.room,
        })
    }
}

/// Whether planning looks at the next row.
enum Step {
    Next,
    /// The Write is full.
    Full,
}

impl Core {
    /// Whether row `c` cannot go now, noted in `scan`: behind an undecodable row of its store,
    /// waiting to be marked or looked at (a retried row), held back (its own backoff or its
    /// store's hold), its store failing with its share of the window in flight, or on a tuple
    /// of a Write in flight or of an earlier row left waiting.
    fn passed_over(&self, c: &Candidate, now: Instant, scan: &mut Scan) -> bool {
        if scan.not_for_this_pass(&self.lanes, c) {
            return true;
        }
        let retry_at = self.memo.get(&c.id).and_then(|m| m.retry_at);
        if c.malformed || scan.all_barred || scan.barred.contains(&c.target.store) {
            scan.barred.insert(c.target.store.clone());
            scan.all_barred |= c.anywhere;
            // A backoff already over is no due: the stream would wake at once, again and again.
            if let Some(at) = retry_at.filter(|at| *at > now) {
                scan.due_at(at);
            }
            scan.stuck += 1;
            return true;
        }
        if self.to_mark.contains(&c.id) || self.unchecked.contains_key(&c.id) {
            // A retried row whose note another session's lock held off is looked at then.
            if let Some(at) = retry_at.filter(|at| *at > now) {
                scan.due_at(at);
            }
            return scan.wait(c);
        }
        let held = self
            .lanes
            .held(&c.target, now)
            .or(retry_at.filter(|at| *at > now));
        if let Some(until) = held {
            // Until then.
            scan.due_at(until);
            return scan.wait(c);
        }
        if self.lanes.probing(&c.target, self.window() / 2)
            || c.hashes
                .iter()
                .any(|h| self.in_flight.contains_key(h) || scan.waiting.contains(h))
        {
            return scan.wait(c);
        }
        scan.waits_turn(&self.lanes, c)
    }

    /// Takes the rows of the next Write from the queue: in id order, all for the target of the
    /// first row that may go, as many as the tuple limit and the rows' halving allow, never the
    /// same tuple twice, and none on a tuple of a Write in flight or of an earlier row left
    /// waiting (rows of other targets stay, for their own Writes); a row larger than the limit
    /// goes alone, in parts (smaller once a part was too large). Rows held back (their own
    /// backoff, or their store's hold) stay in the queue, and so every later row on their
    /// tuples waits behind them. Rows with nothing left to send are set aside to be marked.
    /// Counts the rows that cannot go now in `stuck`, and notes when the first may.
    ///
    /// The trusted stores' rows are planned first (a store is trusted unless its last Write
    /// failed, or it has Writes in flight and never answered: see `Lanes::trusted`). Only when
    /// none of theirs may go does a store not trusted have its turn, the one whose last Write
    /// left longest ago first (a store not tried yet before any), and only while those stores
    /// together have fewer than half the window in flight; a failing store waits for its turn
    /// of the pace too, while nothing succeeds (`Lanes::paced`). A store not tried yet sends
    /// its first Write with the trusted stores' while those not trusted have at most half the
    /// window in flight (one Write beyond it, then: a store that works, tried while others
    /// hang, is not kept waiting for their timeouts), and takes its turn otherwise. So dozens
    /// of stores that fail, or never answer, cannot fill the window, nor take every slot as it
    /// frees, while a trusted store's rows wait; and none of them starves the others.
    pub(super) fn plan(&mut self, now: Instant) -> Option<Plan> {
        let mut scan = Scan {
            untried_room: self.untrusted_flying() <= self.untrusted_cap(),
            ..Scan::default()
        };
        if let Some(plan) = self.plan_with(now, &mut scan) {
            return Some(plan);
        }
        self.plan_turn(now, scan.turns)
    }

    /// The Write of the store not trusted whose turn it is, among `turns` (see
    /// [`Core::plan`]). What cannot go was counted by the trusted stores' planning: their rows
    /// were counted stuck there.
    fn plan_turn(&mut self, now: Instant, mut turns: Vec<Option<Arc<str>>>) -> Option<Plan> {
        if turns.is_empty() || self.untrusted_flying() >= self.untrusted_cap() {
            return None;
        }
        // Longest waiting first (never sent first of all); in id order among equals.
        turns.sort_by_key(|store| self.lanes.left_at(store));
        let paced = self.lanes.paced(now);
        let stuck = self.stuck;
        let mut seen: HashSet<Option<Arc<str>>> = HashSet::new();
        for store in turns {
            if !seen.insert(store.clone()) {
                continue;
            }
            if let Some(until) = paced.filter(|_| self.lanes.failing(&store)) {
                self.due_at(until);
                continue;
            }
            let untried = self.lanes.untried(&store);
            let mut scan = Scan {
                pass: Pass::Turn(store),
                ..Scan::default()
            };
            if let Some(plan) = self.plan_with(now, &mut scan) {
                // Its rows were counted stuck by the trusted stores' planning, unless its store
                // was not tried yet (see `Scan::waits_turn`).
                let counted = if untried { 0 } else { plan.rows.len() };
                self.stuck = stuck.saturating_sub(counted);
                return Some(plan);
            }
        }
        self.stuck = stuck;
        None
    }

    /// The Write that may go while the window is full: one of a store with no Write in flight.
    /// A store whose Writes are slow (or hang until they time out) fills the window as long as
    /// it is the only one with rows; a row of another store, committed meanwhile, then goes at
    /// once in this one more Write rather than wait for a slot, so that one store's slow Writes
    /// never hold up another's rows. One at a time: the window holds at most one Write more
    /// than its size, whatever the number of stores. A store that answered before has it
    /// first; a store not tried yet only after them, and only while the stores not trusted
    /// have at most half the window in flight (dozens of stores not tried yet, which may all
    /// hang, would otherwise take it in turn, in id order, ahead of a store that works).
    pub(super) fn plan_spare(&mut self, now: Instant) -> Option<Plan> {
        // Planned at every landing while the window is full: the rows of stores with Writes
        // in flight, nearly all of the queue then, cost a comparison each (see `Scan::look`).
        let stuck = self.stuck;
        let mut scan = Scan {
            pass: Pass::Spare,
            ..Scan::default()
        };
        let mut plan = self.plan_with(now, &mut scan);
        if plan.is_none() && self.untrusted_flying() <= self.untrusted_cap() {
            let mut scan = Scan {
                pass: Pass::Spare,
                untried_room: true,
                ..Scan::default()
            };
            plan = self.plan_with(now, &mut scan);
        }
        // What cannot go in the window proper was counted by its own planning.
        self.stuck = stuck;
        plan
    }

    fn plan_with(&mut self, now: Instant, scan: &mut Scan) -> Option<Plan> {
        let mut draft = Draft::default();
        let ids: Vec<i64> = self.queue.keys().copied().collect();
        for id in ids {
            let Some(c) = self.queue.get(&id) else {
                continue;
            };
            if self.passed_over(c, now, scan) {
                continue;
            }
            if let Step::Full = self.consider(id, &mut draft, scan) {
                break;
            }
        }
        self.stuck = scan.stuck;
        if matches!(scan.pass, Pass::Trusted) {
            self.untried_waiting = scan.untried;
        }
        if let Some(at) = scan.due {
            self.due_at(at);
        }
        draft.into_plan()
    }

    /// Row `id`, which nothing holds back, joins the Write if it is of its target, fits, and
    /// touches none of its tuples; otherwise it stays in the queue for a later Write.
    fn consider(&mut self, id: i64, draft: &mut Draft, scan: &mut Scan) -> Step {
        let Some(c) = self.queue.get(&id) else {
            return Step::Next;
        };
        let waiting = &mut scan.waiting;
        if let Some(t) = draft.target.as_ref().filter(|t| **t != c.target) {
            // Another target's row, left for its own Write. Its tuples are of its store, so
            // they meet this Write's only in its store under another model: a later row of
            // this target on them must not overtake it.
            if t.store == c.target.store {
                waiting.extend(c.hashes.iter().copied());
            }
            return Step::Next;
        }
        let memo = self.memo.get(&id);
        let remaining: Vec<usize> = (0..c.ops.len())
            .filter(|i| memo.is_none_or(|m| !m.done.contains(i)))
            .collect();
        if remaining.is_empty() {
            // A retried row whose every operation is superseded (a Write's answer that
            // finishes a row marks it in its own transaction). Marked before the next
            // turn's Writes, and until then its tuples stay blocked: if the mark is lost,
            // it is looked at again before any later row on them, never after.
            waiting.extend(c.hashes.iter().copied());
            self.to_mark.push(id);
            scan.stuck += 1;
            return Step::Next;
        }
        let row_cap = memo.and_then(|m| m.max_rows).unwrap_or(usize::MAX);
        let part_cap = memo
            .and_then(|m| m.max_part)
            .unwrap_or(self.max_tuples)
            .min(self.max_tuples);
        if draft.rows.is_empty() {
            let Some(c) = self.queue.remove(&id) else {
                return Step::Next;
            };
            draft.target = Some(c.target.clone());
            if remaining.len() > part_cap {
                // Too large for one Write: send it in parts, alone, in order.
                let part: Vec<usize> = remaining.into_iter().take(part_cap).collect();
                draft.rows.push((c, part));
                draft.room = false;
                return Step::Full;
            }
            draft.add(c, remaining, row_cap);
            return Step::Next;
        }
        if draft.rows.len() >= draft.cap.min(row_cap)
            || draft.n_ops + remaining.len() > self.max_tuples
        {
            draft.room = false;
            return Step::Full;
        }
        if remaining.iter().any(|&i| draft.keys.contains(&c.hashes[i])) {
            // Its tuple is in this Write: it goes after it, as does every later row on it.
            waiting.extend(c.hashes.iter().copied());
            return Step::Next;
        }
        let Some(c) = self.queue.remove(&id) else {
            return Step::Next;
        };
        draft.add(c, remaining, row_cap);
        Step::Next
    }

    /// The row and operation index of the `flat`-th operation of a plan.
    pub(super) fn locate(plan: &Plan, flat: usize) -> Option<(usize, usize)> {
        let mut n = flat;
        for (r, (_, idx)) in plan.rows.iter().enumerate() {
            if n < idx.len() {
                return Some((r, idx[n]));
            }
            n -= idx.len();
        }
        None
    }
}

impl Deliverer {
    /// For a row that came back from dead (`fga-relay retry`): its operations on tuples that a
    /// later delivered row touches are never sent, as they would land over that row's operation.
    /// They count as done (a row left with nothing to send is marked delivered without a Write),
    /// and are logged and recorded in the row's `last_error`. Looked for once, when the row is
    /// first read: while it is pending, no later row on its tuples is delivered before it.
    /// When the note could not be written (another session holds the row, or it is gone),
    /// nothing is taken as done, and the caller is told which.
    pub(super) async fn skip_superseded(
        &mut self,
        conn: &impl GenericClient,
        id: i64,
        ops: &[Op],
        target: &Target,
        configured: Option<&str>,
    ) -> Result<Noted, StoreError> {
        let keys: Vec<&TupleKey> = ops.iter().map(Op::key).collect();
        let skipped = self
            .store
            .superseded(conn, id, &keys, target.store_key(), configured)
            .await?;
        if !skipped.is_empty() {
            let found: Vec<(&Op, i64)> = skipped
                .iter()
                .filter_map(|&(i, by)| ops.get(i).map(|op| (op, by)))
                .collect();
            let kind = |op: &Op| if op.is_write() { "write" } else { "delete" };
            let list: Vec<String> = found
                .iter()
                .map(|(op, by)| format!("{} {} (row {by})", kind(op), op.key()))
                .collect();
            let note = format!(
                "retried: skipped {} of {} operations, superseded by later delivered rows: {}",
                list.len(),
                ops.len(),
                list.join(", ")
            );
            let noted = self.store.record_skipped(conn, id, &note).await?;
            if noted != Noted::Written {
                return Ok(noted);
            }
            for (op, by) in found {
                warn!(id, operation = %format!("{} {}", kind(op), op.key()), superseded_by = by,
                    "retried row: operation superseded by a later delivered row; skipped");
            }
        }
        let m = self.core.memo.entry(id).or_default();
        m.done.extend(skipped.iter().map(|&(i, _)| i));
        Ok(Noted::Written)
    }
}
