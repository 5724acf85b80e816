//! What the leader's heartbeat did about its lease, kept for the moment the lease is found run
//! out by the relay's own clock: the line that says so tells the operator which of two things
//! happened. A renewal was waiting for PostgreSQL's answer (PostgreSQL slow to commit it, or the
//! connection gone quiet), or none was (this process did not run in time: stopped, suspended,
//! starved of CPU). The remedies differ: room for slow renewals, or a look at the host.

use crate::lease_clock::LeaseInstant;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tracing::warn;

/// Shared by the heartbeat and the lease's checks. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct Renewals(Arc<Mutex<State>>);

#[derive(Clone, Copy, Debug, Default)]
struct State {
    /// The renewal sent and not answered yet, since then.
    waiting: Option<LeaseInstant>,
    /// When the last renewal answered (or the taking of leadership) was sent: the lease runs
    /// from then.
    answered: Option<LeaseInstant>,
}

/// Why the lease ran out, as far as this relay can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lapse {
    /// A renewal had waited this long for its answer.
    Waiting(Duration),
    /// No renewal was waiting; the last renewal (or the taking) was sent this long ago.
    Unsent(Option<Duration>),
}

impl Renewals {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves a plain value behind: keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renewal leaves at `at`.
    pub fn sent(&self, at: LeaseInstant) {
        self.state().waiting = Some(at);
    }

    /// A renewal (or the taking of leadership) sent at `at` was answered; `in_time`: before
    /// the lease had run out (a later answer renews nothing).
    pub fn answered(&self, at: LeaseInstant, in_time: bool) {
        let mut s = self.state();
        s.waiting = None;
        if in_time {
            s.answered = Some(at);
        }
    }

    /// Why a lease found run out at `now` ran out.
    pub fn lapse(&self, now: LeaseInstant) -> Lapse {
        let s = *self.state();
        match s.waiting {
            Some(sent) => Lapse::Waiting(now.saturating_duration_since(sent)),
            None => Lapse::Unsent(s.answered.map(|a| now.saturating_duration_since(a))),
        }
    }

    /// Says that the lease, whose end by this relay's clock was `end`, was found run out at
    /// `now`, and what to look at.
    pub fn say_lapse(&self, end: LeaseInstant, now: LeaseInstant) {
        let past_end = now.saturating_duration_since(end);
        match self.lapse(now) {
            Lapse::Waiting(waited) => warn!(
                renewal_waited = ?waited,
                past_end = ?past_end,
                "the leadership lease ran out while its renewal waited for PostgreSQL's answer; \
                 stopping (this relay reconnects and stands by). A renewal commits durably: if \
                 PostgreSQL is slow to commit (its disk or CPU saturated), a longer \
                 --leader-lease and --heartbeat-interval give renewals room"
            ),
            Lapse::Unsent(last) => warn!(
                last_renewed = ?last,
                past_end = ?past_end,
                "the leadership lease ran out before it could be renewed, with no renewal \
                 waiting: this process did not run in time (stopped, suspended, or starved of \
                 CPU: look at the host's load and at what paused the process); stopping (this \
                 relay reconnects and stands by)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_waiting_is_told_from_none_sent() {
        let r = Renewals::default();
        let t0 = LeaseInstant::now();
        assert_eq!(r.lapse(t0), Lapse::Unsent(None));
        r.answered(t0, true);
        r.sent(t0 + Duration::from_secs(5));
        assert_eq!(
            r.lapse(t0 + Duration::from_secs(11)),
            Lapse::Waiting(Duration::from_secs(6))
        );
        r.answered(t0 + Duration::from_secs(12), true);
        assert_eq!(
            r.lapse(t0 + Duration::from_secs(30)),
            Lapse::Unsent(Some(Duration::from_secs(18)))
        );
        // Sent after the lease had run out (the process stopped between two renewals): it
        // renewed nothing.
        r.sent(t0 + Duration::from_secs(40));
        r.answered(t0 + Duration::from_secs(40), false);
        assert_eq!(
            r.lapse(t0 + Duration::from_secs(41)),
            Lapse::Unsent(Some(Duration::from_secs(29)))
        );
    }
}
