//! The read gate: whether the stream reads at a turn, and which read, from what the core holds.
//! No I/O: the stream asks it at each turn (`Deliverer::read_if_wanted`), and the model test
//! drives the same rules, not a copy of them.

use super::core::Core;
use super::read::{AHEAD_PAGES, Scope};
use std::time::Instant;

/// What the gate is told beside what the core holds.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadAsk {
    /// Rows are wanted: a notification, a sweep, a read that found more, something come due.
    pub(super) wanted: bool,
    /// The read of the stores with no row in hand came due (see `turn::FAIR_READ`).
    pub(super) fair: bool,
    /// The window is full and stalled: only the one Write more may go (see
    /// `Deliverer::spare_only`).
    pub(super) spare_only: bool,
    /// The configured store's id is known: its lane holds the rows naming none and those naming
    /// it, so that a read by lane can take them (without it, such a read would walk the backlog
    /// in id order).
    pub(super) store_known: bool,
}

impl Core {
    /// Which read the stream makes now, if any: the stores with none in hand when that read is
    /// due; else, if rows are wanted, the lowest rows while the queue has room, or has it once
    /// the rows of held stores are let go; else, at its bound, the trusted stores' lanes when
    /// that read is due.
    pub(super) fn read_due(&mut self, ask: ReadAsk, now: Instant) -> Option<Scope> {
        if ask.fair && self.fair_read_due(ask.store_known) {
            return Some(Scope::Others);
        }
        if !ask.wanted {
            return None;
        }
        if self.queue_has_room(ask.spare_only, now) || self.room_after_letting_go(now) {
            return Some(Scope::Lowest);
        }
        self.trusted_read_due(ask.spare_only, ask.store_known, now)
            .then_some(Scope::Trusted)
    }

    fn batch(&self) -> usize {
        self.settings.batch_size.max(1)
    }

    /// Rows in hand that may go now: all but those the last planning counted stuck; with
    /// `spare_only`, those the one Write more may take (`Core::ready_for_spare`).
    fn ready(&self, spare_only: bool, now: Instant) -> usize {
        match spare_only {
            true => self.ready_for_spare(now),
            false => self.queue.len().saturating_sub(self.stuck),
        }
    }

    /// Whether the queue has room for a read: fewer rows ready to go than a read's worth, and
    /// fewer in all than it holds at most. `spare_only`: only the one Write more of a full
    /// window may go, and only rows of stores with none in flight are ready for it.
    pub(super) fn queue_has_room(&self, spare_only: bool, now: Instant) -> bool {
        self.ready(spare_only, now) < self.batch() && self.queue.len() < AHEAD_PAGES * self.batch()
    }

    /// Whether the queue has room once the rows of held stores let it go, when they are what
    /// fills it: it is at its bound with fewer rows ready than a read's worth (see
    /// `Core::let_go_held`).
    fn room_after_letting_go(&mut self, now: Instant) -> bool {
        if self.ready(false, now) >= self.batch() {
            return false;
        }
        self.let_go_held(now) && self.queue_has_room(false, now)
    }

    /// Whether the read of the stores with no row in hand may go: rows are in hand, the queue,
    /// past its bound by one read at most, takes theirs, and the configured store's id is
    /// known.
    fn fair_read_due(&self, store_known: bool) -> bool {
        !self.nothing_in_hand()
            && self.queue.len() < (AHEAD_PAGES + 1) * self.batch()
            && store_known
    }

    /// Whether the read of the trusted stores' lanes may go, the queue being at its bound
    /// (with rows of stores not trusted, which do not count as ready: see `Core::plan`): fewer
    /// than a read's worth of rows ready, the queue no further than two reads past its bound
    /// (one past the read of the stores with none in hand), the configured store's id known,
    /// and a store that works. Without it, rows of stores that fail or never answer, waiting in
    /// hand for their turn, kept every read from taking a working store's rows in (or let it
    /// take them only behind their lower ids): a burst of 30 rows of a store that works, beside
    /// 40 stores that never answer, was not delivered within 30 s.
    ///
    /// Nor do the rows of stores not tried yet waiting for a turn the stores not trusted cannot
    /// have count as ready; and with `spare_only`, only those the one Write more may take (a
    /// full window's planning counts nothing stuck). Either way, a working store's row waited
    /// for Writes that hang to time out.
    fn trusted_read_due(&self, spare_only: bool, store_known: bool, now: Instant) -> bool {
        let ready = match spare_only {
            true => self.ready(true, now),
            false => self.ready(false, now).saturating_sub(self.untried_waiting),
        };
        ready < self.batch()
            && self.queue.len() < (AHEAD_PAGES + 2) * self.batch()
            && store_known
            && self.lanes.any_works(now)
    }
}
