//! The stream's bell on the relay's dedicated connection: the wake lock it holds while it
//! waits, the notifications it hears, and the sweep that catches what notifications miss.

use crate::listener::Session;
use crate::wake::{Bell, Ring, Trigger};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::{Interval, MissedTickBehavior};

/// A leader's bell, for one session.
pub(super) struct SessionBell<'a> {
    session: &'a Session,
    sweep: Mutex<Interval>,
}

impl<'a> SessionBell<'a> {
    pub(super) fn new(session: &'a Session, sweep: Duration) -> SessionBell<'a> {
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + sweep, sweep);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        SessionBell {
            session,
            sweep: Mutex::new(interval),
        }
    }
}

impl Bell for SessionBell<'_> {
    fn listen(&self) -> Ring<'_, Result<bool, tokio_postgres::Error>> {
        Box::pin(self.session.take_wake_lock())
    }

    fn mute(&self) -> Ring<'_, Result<(), tokio_postgres::Error>> {
        Box::pin(self.session.release_wake_lock())
    }

    fn rung(&self) -> Ring<'_, Trigger> {
        Box::pin(async move {
            let mut sweep = self.sweep.lock().await;
            tokio::select! {
                // A notification that comes with a sweep tick explains the rows: checked first,
                // so that the sweep is credited only with rows nothing announced.
                biased;
                _ = self.session.wake().notified() => Trigger::Notification,
                _ = sweep.tick() => Trigger::Sweep,
            }
        })
    }
}
