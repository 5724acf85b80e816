//! A lane per store: each store the rows name (the rows naming none, and those naming the
//! configured store, are one) has its own hold, its own `Retry-After`, and its own clock for
//! judging answers. One store's trouble touches only its own rows:
//!
//! - A failure of a Write to a store (transient, throttled, configuration, an answer not
//!   OpenFGA's) holds that store, with a backoff of its own: its rows are not planned, and its
//!   backlog is not read, until the hold ends. The other stores' rows flow meanwhile. When
//!   OpenFGA fails for every store, every lane is held on its own backoff: the relay backs off
//!   as a whole because every lane it tried failed, never because one store's rows came first.
//! - A `Retry-After` (a 429's, or a 503's) pauses its own store.
//! - A row's transient failure is its own (a *strike*) only when a Write to its store that
//!   left after its previous failure succeeded, and nearly all of the store's Writes succeed:
//!   the traffic of other stores says nothing about this one, so an outage of one store is
//!   never a strike against its rows; nor are Writes that were already on their way when the
//!   store went down and succeed a little later (a server that is going down still answers the
//!   requests it holds).
//! - The window of Writes in flight is the relay's, shared by every lane: it is halved on a
//!   store's failure only when no other store's Write succeeded lately and no other store works
//!   (OpenFGA as a whole struggling), so that one failing store leaves the window to the others.
//!   When one store's slow Writes fill it, it holds one Write more, for a store with none in
//!   flight (`Core::plan_spare`).
//! - Many stores in trouble at once: the stores not trusted (last Write failed, or Writes in
//!   flight never answered) have half the window together, after the trusted stores' rows, and
//!   take turns (`Core::plan`); once nothing has succeeded for [`QUIET`], the failing ones send a
//!   Write per [`PACE`] together.
//!
//! What is kept is bounded: the outcomes of the last minute (at most [`COMPARE_MAX`], a failed
//! Write's with the ids of its rows), and a lane for each store seen lately (at most
//! [`LANES_MAX`]).

use super::write::Gate;
use crate::backoff::Backoff;
use crate::openfga::Target;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How far back the outcomes of other Writes are looked at to judge whether a row's failure is
/// its own: long enough to hold many Writes of a busy relay, short enough to forget an outage
/// that is over.
const COMPARE_WINDOW: Duration = Duration::from_secs(60);
/// At most this many outcomes are kept (a relay delivering thousands of Writes a minute needs
/// no more to see whether most succeed).
const COMPARE_MAX: usize = 1024;
/// A row's failure is its own only if at least this many other Writes to its store succeeded in
/// the window, and at most one in [`COMPARE_SHARE`] of the others failed. Under a flaky server
/// failing half the Writes or more, the odds that a window of other Writes looks that clean by
/// chance are below one in a hundred for a handful of Writes and vanish for a busy relay; a row
/// that alone keeps failing while the traffic beside it flows meets both at once.
const COMPARE_MIN_OK: usize = 4;
const COMPARE_SHARE: usize = 4;
/// The window is left as it is on a store's failure while a Write to another store succeeded
/// this recently.
const OTHERS_WINDOW: Duration = Duration::from_secs(5);
/// Lanes kept before those idle and not held are forgotten (rows spread over many stores).
const LANES_MAX: usize = 4096;
/// Once no Write at all succeeded for this long while stores fail (OpenFGA down, or every
/// store the rows name failing), the failing stores are paced together (see [`PACE`]).
const QUIET: Duration = Duration::from_secs(5);
/// While nothing succeeds (see [`QUIET`]), the failing stores together send at most one Write
/// this often: each store's own backoff (2 s at most) lets hundreds of failing stores send
/// hundreds of Writes a second, which cost OpenFGA and the relay's CPU and tell nothing more
/// than one Write would. Stores not tried yet are not paced: they may work.
const PACE: Duration = Duration::from_millis(100);

/// The outcome of one Write, kept for [`COMPARE_WINDOW`].
struct Outcome {
    at: Instant,
    failed: bool,
    /// For a failure, the rows the Write carried: a row's own failures, alone or with others
    /// (before halving found it out), are not "others'" when its failure is judged.
    carried: Box<[i64]>,
    /// Its store (`None`: the configured one).
    store: Option<Arc<str>>,
}

/// One store's lane.
#[derive(Default)]
pub(super) struct Lane {
    /// Its failures since it last succeeded.
    streak: u32,
    /// Its rows are neither planned nor read until then.
    held_until: Option<Instant>,
    /// OpenFGA's `Retry-After` for it: no Write of its leaves before.
    gate: Gate,
    /// When the latest of its Writes that succeeded was launched: a row's failure counts as a
    /// strike only if this is after its previous failure.
    proven: Option<Instant>,
    /// Its Writes in flight.
    flying: usize,
    /// When its latest Write left: the stores that are not trusted take turns, the one that
    /// waited longest first.
    left: Option<Instant>,
    /// OpenFGA answered one of its Writes (accepted it, or refused a row of it for good).
    answered: bool,
}

impl Lane {
    /// Whether its rows go first and it may use the whole window: its last answered Write did
    /// not fail, and OpenFGA answered one of its Writes at all if it has Writes in flight (a
    /// store whose Writes hang from its first on is no more trusted than one that fails). A
    /// store not tried yet is.
    fn trusted(&self) -> bool {
        self.streak == 0 && (self.answered || self.flying == 0)
    }

    /// Whether it works at `now`: OpenFGA answered it, it is trusted, and it is not held.
    fn works(&self, now: Instant) -> bool {
        self.answered && self.trusted() && self.held_until.is_none_or(|t| t <= now)
    }
}

/// Every lane, and the outcomes of recent Writes.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: HashMap<Option<Arc<str>>, Lane>,
    recent: VecDeque<Outcome>,
    /// The first failure of a store since a Write last succeeded, of any store.
    failing_since: Option<Instant>,
    /// When the latest Write of a failing store left while they are paced (see [`PACE`]).
    paced_at: Option<Instant>,
}

impl Lanes {
    fn lane(&mut self, target: &Target) -> &mut Lane {
        if self.lanes.len() >= LANES_MAX && !self.lanes.contains_key(&target.store) {
            let now = Instant::now();
            // Forgotten: lanes neither held nor paused by OpenFGA (what proved them working too).
            self.lanes
                .retain(|_, l| l.held_until.is_some_and(|t| t > now) || l.gate.is_closed());
        }
        self.lanes.entry(target.store.clone()).or_default()
    }

    /// The `Retry-After` gate of `target`'s store, for a Write about to leave.
    pub(super) fn gate(&mut self, target: &Target) -> Gate {
        self.lane(target).gate.clone()
    }

    /// A Write of `target`'s store leaves, or lands.
    pub(super) fn flying(&mut self, target: &Target, leaves: bool) {
        let lane = self.lane(target);
        lane.flying = if leaves {
            lane.flying + 1
        } else {
            lane.flying.saturating_sub(1)
        };
    }

    /// Whether `target`'s store may have no more Writes in flight now: one not trusted (its
    /// last Write failed, or it never answered) has at most `limit` in flight, to find out
    /// whether it is back (each of its rows tried in turn), and leaves the rest of the window
    /// to the stores that work.
    pub(super) fn probing(&self, target: &Target, limit: usize) -> bool {
        self.lanes
            .get(&target.store)
            .is_some_and(|l| !l.trusted() && l.flying >= limit.max(1))
    }

    /// Whether `store`'s rows go first (see [`Lane::trusted`]).
    pub(super) fn trusted(&self, store: &Option<Arc<str>>) -> bool {
        self.lanes.get(store).is_none_or(Lane::trusted)
    }

    /// Whether `store` was not tried yet: no Write of it in flight, none answered (a lane
    /// forgotten counts as not tried).
    pub(super) fn untried(&self, store: &Option<Arc<str>>) -> bool {
        self.lanes
            .get(store)
            .is_none_or(|l| l.streak == 0 && !l.answered && l.flying == 0)
    }

    /// OpenFGA answered a Write of `target`'s store: it accepted it, or refused a row of it
    /// for good (a bad tuple, a store or model it does not have), which a store that works
    /// does too.
    pub(super) fn answered(&mut self, target: &Target) {
        self.lane(target).answered = true;
    }

    /// The stores that work: OpenFGA answered them, their last answered Write did not fail,
    /// and they are not held at `now`; the most recently proven first.
    pub(super) fn answered_trusted(&self, now: Instant) -> Vec<Option<Arc<str>>> {
        let mut stores: Vec<(Option<Instant>, &Option<Arc<str>>)> = self
            .lanes
            .iter()
            .filter(|(_, l)| l.works(now))
            .map(|(store, l)| (l.proven, store))
            .collect();
        stores.sort_by_key(|s| std::cmp::Reverse(s.0));
        stores.into_iter().map(|(_, store)| store.clone()).collect()
    }

    /// Whether any store works at `now` (see [`Lanes::answered_trusted`]): asked at each read
    /// while the queue is at its bound, so without collecting or sorting them.
    pub(super) fn any_works(&self, now: Instant) -> bool {
        self.lanes.values().any(|l| l.works(now))
    }

    /// Whether `store` failed: its last answered Write failed.
    pub(super) fn failing(&self, store: &Option<Arc<str>>) -> bool {
        self.lanes.get(store).is_some_and(|l| l.streak > 0)
    }

    /// When `store`'s latest Write left (`None`: never, or forgotten).
    pub(super) fn left_at(&self, store: &Option<Arc<str>>) -> Option<Instant> {
        self.lanes.get(store).and_then(|l| l.left)
    }

    /// Until when a failing store's Write must wait for its turn of the pace, if it must (see
    /// [`PACE`]).
    pub(super) fn paced(&self, now: Instant) -> Option<Instant> {
        let quiet = self
            .failing_since
            .is_some_and(|t| now.saturating_duration_since(t) >= QUIET);
        let next = self.paced_at.map(|t| t + PACE).filter(|t| *t > now);
        next.filter(|_| quiet)
    }

    /// A Write of `target`'s store leaves at `now`: its turn, and the pace's, if it fails.
    pub(super) fn left(&mut self, target: &Target, now: Instant) {
        let failing = self.failing(&target.store);
        self.lane(target).left = Some(now);
        if failing {
            self.paced_at = Some(now);
        }
    }

    /// How many Writes of `store` (`None`: the configured one) are in flight.
    /// The stores with Writes in flight.
    pub(super) fn flying_stores(&self) -> impl Iterator<Item = &Option<Arc<str>>> {
        self.lanes
            .iter()
            .filter(|(_, l)| l.flying > 0)
            .map(|(store, _)| store)
    }

    pub(super) fn flying_of(&self, store: &Option<Arc<str>>) -> usize {
        self.lanes.get(store).map_or(0, |l| l.flying)
    }

    /// Whether `target`'s store was working (its last Write did not fail).
    pub(super) fn working(&self, target: &Target) -> bool {
        self.lanes.get(&target.store).is_none_or(|l| l.streak == 0)
    }

    /// When the latest Write to `target`'s store that succeeded was launched.
    pub(super) fn proven(&self, target: &Target) -> Option<Instant> {
        self.lanes.get(&target.store).and_then(|l| l.proven)
    }

    /// Records a Write's outcome. A success ends its store's backoff, but not a `Retry-After`
    /// OpenFGA asked for meanwhile (a Write that left before it can land after it): its rows
    /// stay held until the gate opens, or they would be planned, turned back at the gate, and
    /// planned again, round and round until then.
    /// `carried`: the rows of a failed Write; `left`: when the Write was launched.
    pub(super) fn note(
        &mut self,
        failed: bool,
        carried: &[i64],
        target: &Target,
        now: Instant,
        left: Instant,
    ) {
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
            carried: if failed {
                carried.into()
            } else {
                Box::default()
            },
            store: target.store.clone(),
        });
        match failed {
            true => {
                self.failing_since.get_or_insert(now);
            }
            false => self.failing_since = None,
        }
        if !failed {
            let lane = self.lane(target);
            lane.answered = true;
            lane.proven = Some(lane.proven.map_or(left, |t| t.max(left)));
            lane.streak = 0;
            lane.held_until = lane.gate.until(now);
        }
    }

    /// Whether the recent Writes to `target`'s store that did not fail carrying row `id` nearly
    /// all succeeded: then a failure of that row is its own, not one that hits its store. Says
    /// what share of them failed, as the odds that any one Write fails by chance.
    pub(super) fn others_nearly_all_succeed(
        &self,
        id: i64,
        target: &Target,
        now: Instant,
    ) -> Option<f64> {
        let (mut ok, mut failed) = (0usize, 0usize);
        for o in &self.recent {
            if o.carried.contains(&id)
                || o.store != target.store
                || now.duration_since(o.at) > COMPARE_WINDOW
            {
                continue;
            }
            if o.failed {
                failed += 1;
            } else {
                ok += 1;
            }
        }
        (ok >= COMPARE_MIN_OK && failed * COMPARE_SHARE <= ok + failed)
            .then(|| failed as f64 / (ok + failed) as f64)
    }

    /// Whether a Write to another store than `target`'s succeeded within [`OTHERS_WINDOW`]:
    /// then a failure of `target`'s is its store's alone, and the window stays.
    pub(super) fn others_flow(&self, target: &Target, now: Instant) -> bool {
        self.recent
            .iter()
            .rev()
            .take_while(|o| now.duration_since(o.at) <= OTHERS_WINDOW)
            .any(|o| o.store != target.store && !o.failed)
    }

    /// Whether a store other than `target`'s works: OpenFGA answered its Writes, and its last
    /// answered Write did not fail. Then a failure of `target`'s is not OpenFGA's as a whole.
    pub(super) fn others_work(&self, target: &Target) -> bool {
        self.lanes
            .iter()
            .any(|(store, l)| *store != target.store && l.answered && l.streak == 0)
    }

    /// Holds `target`'s store on `schedule`, or for the server's `Retry-After` (then its gate
    /// closes too, for Writes of its already on their way); returns until when.
    pub(super) fn hold(
        &mut self,
        target: &Target,
        schedule: Backoff,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Instant {
        self.failing_since.get_or_insert(now);
        let lane = self.lane(target);
        lane.streak += 1;
        let until = now + retry_after.unwrap_or_else(|| schedule.delay(lane.streak));
        lane.held_until = Some(lane.held_until.map_or(until, |t| t.max(until)));
        if retry_after.is_some() {
            lane.gate.close_until(until);
        }
        until
    }

    /// Until when `target`'s store is held, if it is now.
    pub(super) fn held(&self, target: &Target, now: Instant) -> Option<Instant> {
        let lane = self.lanes.get(&target.store)?;
        lane.held_until.filter(|at| *at > now)
    }

    /// When the first hold of a store held now ends.
    pub(super) fn first_hold_end(&self, now: Instant) -> Option<Instant> {
        self.lanes
            .values()
            .filter_map(|l| l.held_until.filter(|t| *t > now))
            .min()
    }

    /// The stores held now, as lanes are keyed (`None`: the configured store).
    pub(super) fn held_stores(&self, now: Instant) -> Vec<Option<Arc<str>>> {
        self.lanes
            .iter()
            .filter(|(_, l)| l.held_until.is_some_and(|t| t > now))
            .map(|(store, _)| store.clone())
            .collect()
    }

    /// The stores held now, as their rows' `store_id` is matched when reading (`""`: the
    /// configured store's rows naming none; `configured`, its id, for those naming it).
    pub(super) fn closed(&self, configured: Option<&str>, now: Instant) -> Vec<String> {
        let mut closed = Vec::new();
        for (store, lane) in &self.lanes {
            if lane.held_until.is_none_or(|t| t <= now) {
                continue;
            }
            match store {
                Some(s) => closed.push(s.to_string()),
                None => {
                    closed.push(String::new());
                    closed.extend(configured.map(str::to_owned));
                }
            }
        }
        closed
    }
}
