//! Until when this relay may put a Write on the wire: the end of its leadership lease by its own
//! clock. The leader's heartbeat moves it on at every renewal; losing or letting go of
//! leadership closes it.
//!
//! The fence a new leader waits (the lease's end plus one Write's deadline) covers Writes that
//! left before the old leader's lease ran out. So the check belongs where a Write leaves: the
//! OpenFGA client's request body asks the window at the moment the HTTP connection writes it
//! (see `openfga::client`). A relay stopped (SIGSTOP, a hung host) with Writes planned, handed
//! to a connection or waiting for one, finds the window closed when it is continued and sends
//! none of them: a Write with no body is not a Write OpenFGA can apply.
//!
//! Its clock counts time the host spent suspended (see `lease_clock`).

use crate::lease_clock::LeaseInstant;
use std::sync::{Arc, Mutex, MutexGuard};

/// Shared by the session that holds the lease and every Write it sends. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct SendWindow(Arc<Mutex<Option<LeaseInstant>>>);

impl SendWindow {
    fn until(&self) -> MutexGuard<'_, Option<LeaseInstant>> {
        // A panic while holding this lock leaves a plain value behind: keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the window (leadership taken) until `until`.
    pub fn open_until(&self, until: LeaseInstant) {
        *self.until() = Some(until);
    }

    /// Moves the end on after a renewal, if the window is still open. A renewal that answers
    /// after leadership was let go, or after the end had passed, opens nothing: past its end the
    /// session counts as lost (another relay may have ended it and be delivering), and only a
    /// new term opens the window again.
    /// Returns whether it did.
    pub fn extend_to(&self, until: LeaseInstant) -> bool {
        let mut u = self.until();
        let open = u.is_some_and(|end| LeaseInstant::now() < end);
        if open {
            *u = Some(until);
        }
        open
    }

    /// Closes the window: leadership let go or lost.
    pub fn close(&self) {
        *self.until() = None;
    }

    /// The end of the window, if leadership is held (whether or not it has passed).
    pub fn end(&self) -> Option<LeaseInstant> {
        *self.until()
    }

    /// Whether a Write may leave now.
    pub fn is_open(&self) -> bool {
        self.end().is_some_and(|until| LeaseInstant::now() < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn open_until_its_end_closed_before_and_after() {
        let w = SendWindow::default();
        assert!(!w.is_open());
        w.extend_to(LeaseInstant::now() + Duration::from_secs(60));
        assert!(!w.is_open(), "a renewal opens nothing");
        w.open_until(LeaseInstant::now() + Duration::from_secs(60));
        assert!(w.is_open());
        w.extend_to(LeaseInstant::now() - Duration::from_millis(1));
        assert!(!w.is_open(), "past its end");
        w.extend_to(LeaseInstant::now() + Duration::from_secs(60));
        assert!(!w.is_open(), "a renewal after the end reopens nothing");
        w.open_until(LeaseInstant::now() + Duration::from_secs(60));
        w.close();
        assert!(!w.is_open());
    }
}
