//! Judgement per store: the outcomes of recent Writes, each with its store, tell a row's own
//! failure from its store's, and a store's failure from the whole relay's.
//!
//! - A row's transient failure is its own (a *strike*) only when the other Writes to its store
//!   nearly all succeed: the traffic of other stores says nothing about this one, so an outage of
//!   one store is never a strike against its rows.
//! - A failure (transient, configuration, an answer not OpenFGA's) is one store's while Writes to
//!   other stores succeed (one did in the last [`OTHERS_WINDOW`]): that store alone is held, with
//!   a backoff of its own, its rows passed over until then; the other stores' rows keep flowing,
//!   and the window stays as it is. When no Write to another store succeeded that recently (no
//!   other store is written to, or OpenFGA is down for all), the failure is the relay's: the
//!   whole relay backs off and halves its window, as with one store. A 429 is always the
//!   relay's.
//!
//! What is kept is bounded: the outcomes of the last minute (at most [`COMPARE_MAX`]), and a
//! hold for each store failing now.

use super::Deliverer;
use crate::backoff::Backoff;
use crate::openfga::Target;
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
/// A failure is one store's while a Write to another store succeeded this recently. When
/// OpenFGA goes down for every store, each store's failures are its own for this long (each
/// store held on its own backoff meanwhile), and then the relay's.
const OTHERS_WINDOW: Duration = Duration::from_secs(5);
/// Holds kept before those long over are forgotten (thousands of stores failing at once).
const HOLDS_MAX: usize = 4096;

/// The outcome of one Write, kept for [`COMPARE_WINDOW`].
pub(super) struct Outcome {
    pub(super) at: Instant,
    pub(super) failed: bool,
    /// The row, for a Write that carried one row alone: its own failures are not "others'".
    pub(super) alone: Option<i64>,
    /// Its store (`None`: the configured one).
    pub(super) store: Option<Arc<str>>,
}

/// A store whose Writes fail while other stores' succeed.
#[derive(Debug)]
pub(super) struct StoreHold {
    /// Its failures since it last succeeded.
    pub(super) streak: u32,
    /// Its rows are passed over until then.
    pub(super) until: Instant,
}

impl Deliverer {
    /// Records a Write's outcome for [`Deliverer::others_nearly_all_succeed`] and
    /// [`Deliverer::store_failure_alone`].
    pub(super) fn note(&mut self, failed: bool, alone: Option<i64>, target: &Target) {
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
            store: target.store.clone(),
        });
        if !failed {
            self.holds.remove(&target.store);
        }
    }

    /// Whether the recent Writes to `target`'s store that did not carry row `id` alone nearly
    /// all succeeded: then a failure of that row is its own, not one that hits its store.
    pub(super) fn others_nearly_all_succeed(&self, id: i64, target: &Target) -> bool {
        let now = Instant::now();
        let (mut ok, mut failed) = (0usize, 0usize);
        for o in &self.recent {
            if o.alone == Some(id)
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
        ok >= COMPARE_MIN_OK && failed * COMPARE_SHARE <= ok + failed
    }

    /// Whether a failure of a Write to `target`'s store is that store's alone: a Write to
    /// another store succeeded within [`OTHERS_WINDOW`].
    pub(super) fn store_failure_alone(&self, target: &Target) -> bool {
        let now = Instant::now();
        self.recent
            .iter()
            .rev()
            .take_while(|o| now.duration_since(o.at) <= OTHERS_WINDOW)
            .any(|o| o.store != target.store && !o.failed)
    }

    /// Holds `target`'s store on `schedule` (or the server's `Retry-After`); returns until when.
    pub(super) fn hold_store(
        &mut self,
        target: &Target,
        schedule: Backoff,
        retry_after: Option<Duration>,
    ) -> Instant {
        if self.holds.len() >= HOLDS_MAX {
            let now = Instant::now();
            self.holds.retain(|_, h| h.until + COMPARE_WINDOW > now);
        }
        let hold = self.holds.entry(target.store.clone()).or_insert(StoreHold {
            streak: 0,
            until: Instant::now(),
        });
        hold.streak += 1;
        hold.until = Instant::now() + retry_after.unwrap_or_else(|| schedule.delay(hold.streak));
        hold.until
    }

    /// Until when `target`'s store is held, if it is now.
    pub(super) fn store_held(&self, target: &Target) -> Option<Instant> {
        if self.holds.is_empty() {
            return None;
        }
        self.holds
            .get(&target.store)
            .map(|h| h.until)
            .filter(|at| *at > Instant::now())
    }
}
