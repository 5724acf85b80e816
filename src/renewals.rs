//! What the leader's heartbeat did about its lease, kept for the moment the lease is found run
//! out by the relay's own clock, so that the line saying so tells which of two things happened.
//! While the process runs, a renewal that PostgreSQL does not answer ends the session at the
//! heartbeat's own deadline ("heartbeat got no answer"), which comes no later than the lease's
//! end: the lease is found run out first almost only when this process did not run in time
//! (stopped, suspended, starved of CPU), which the line then says. The exception is the two
//! deadlines meeting, a renewal sent before the end still waiting when the end is noticed at
//! once: that one is PostgreSQL's slowness, and said as such.

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
    /// PostgreSQL was slow: a renewal sent before the end had waited this long for its answer,
    /// and the end was noticed as it came.
    Slow(Duration),
    /// This process did not run in time. The last renewal (or the taking) was sent this long
    /// ago; a renewal sent since, too late or unanswered, had waited this long.
    Paused {
        last_renewed: Option<Duration>,
        waiting: Option<Duration>,
    },
}

/// How soon after the lease's end a running relay notices it: within this, the end was noticed
/// as it came (the process ran); later, the process did not run meanwhile.
const NOTICED_AT_ONCE: Duration = Duration::from_millis(500);

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

    /// Why a lease whose end was `end` by this relay's clock, found run out at `now`, ran out.
    pub fn lapse(&self, end: LeaseInstant, now: LeaseInstant) -> Lapse {
        let s = *self.state();
        let past_end = now.saturating_duration_since(end);
        match s.waiting {
            Some(sent) if sent < end && past_end < NOTICED_AT_ONCE => {
                Lapse::Slow(now.saturating_duration_since(sent))
            }
            waiting => Lapse::Paused {
                last_renewed: s.answered.map(|a| now.saturating_duration_since(a)),
                waiting: waiting.map(|w| now.saturating_duration_since(w)),
            },
        }
    }

    /// Says that the lease, whose end by this relay's clock was `end`, was found run out at
    /// `now`, and what to look at.
    pub fn say_lapse(&self, end: LeaseInstant, now: LeaseInstant) {
        let past_end = now.saturating_duration_since(end);
        let text = |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), |d| format!("{d:?}"));
        match self.lapse(end, now) {
            Lapse::Slow(waited) => warn!(
                renewal_waited = ?waited,
                "the leadership lease ran out while its renewal waited for PostgreSQL's answer; \
                 stopping (this relay reconnects and stands by). A renewal commits durably: if \
                 PostgreSQL is slow to commit (its disk or CPU saturated), a longer \
                 --leader-lease and --heartbeat-interval give renewals room"
            ),
            Lapse::Paused {
                last_renewed,
                waiting,
            } => warn!(
                past_end = ?past_end,
                last_renewed = %text(last_renewed),
                renewal_waited = %text(waiting),
                "the leadership lease ran out before it could be renewed: this process did not \
                 run in time (stopped, suspended, or starved of CPU: look at the host's load, \
                 its CPU limits, and at what paused the process); stopping (this relay \
                 reconnects and stands by)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_renewal_left_waiting_by_postgresql_is_told_from_a_process_that_did_not_run() {
        let r = Renewals::default();
        let t0 = LeaseInstant::now();
        let end = t0 + secs(10);
        assert_eq!(
            r.lapse(end, end),
            Lapse::Paused {
                last_renewed: None,
                waiting: None
            }
        );
        r.answered(t0, true);
        r.sent(t0 + secs(5));
        // Noticed as the end came, the renewal sent before it still waiting: PostgreSQL.
        assert_eq!(r.lapse(end, end), Lapse::Slow(secs(5)));
        // Noticed 20 s late: the process did not run, whatever was waiting.
        assert_eq!(
            r.lapse(end, end + secs(20)),
            Lapse::Paused {
                last_renewed: Some(secs(30)),
                waiting: Some(secs(25))
            }
        );
        // Continued after a stop, the overdue renewal goes out before the end is noticed: sent
        // after the end, it is not PostgreSQL's slowness.
        let ms = Duration::from_millis;
        r.sent(end + ms(100));
        assert_eq!(
            r.lapse(end, end + ms(200)),
            Lapse::Paused {
                last_renewed: Some(ms(10_200)),
                waiting: Some(ms(100))
            }
        );
        // Answered too late: it renewed nothing.
        r.answered(end + secs(3), false);
        assert_eq!(
            r.lapse(end, end + secs(4)),
            Lapse::Paused {
                last_renewed: Some(secs(14)),
                waiting: None
            }
        );
    }
}
