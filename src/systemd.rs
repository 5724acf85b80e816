//! systemd's notify protocol (`Type=notify`): `READY=1` once the LISTEN connection is up,
//! `STATUS=` lines, and `WATCHDOG=1` from the relay's main loop, so that a wedged relay is
//! restarted. Sent by the `sd-notify` crate to `$NOTIFY_SOCKET`; without it (not under systemd)
//! every call does nothing.

use sd_notify::NotifyState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The relay's side of systemd's notifications.
pub struct Notifier {
    /// `NOTIFY_SOCKET` is set: the relay runs under systemd with `Type=notify`.
    enabled: bool,
    /// How often the watchdog must be fed (half of `WATCHDOG_USEC`), if it is enabled for us.
    watchdog: Option<Duration>,
    /// Milliseconds since `start` at the last watchdog notification, to send at most a few per
    /// interval however busy the loop is.
    last_fed: AtomicU64,
    start: Instant,
}

impl Notifier {
    /// A notifier that does nothing (commands other than `run`, tests).
    pub fn disabled() -> Notifier {
        Notifier {
            enabled: false,
            watchdog: None,
            last_fed: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` as systemd sets them.
    pub fn from_env() -> Notifier {
        let mut n = Notifier::disabled();
        let Some(socket) = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty()) else {
            return n;
        };
        // systemd gives services a path; an address in the abstract namespace (`@name`) is not
        // something `sd-notify` can send to.
        if socket.as_encoded_bytes().starts_with(b"@") {
            tracing::warn!(notify_socket = %socket.to_string_lossy(),
                "NOTIFY_SOCKET in the abstract namespace is not supported; not notifying systemd");
            return n;
        }
        n.enabled = true;
        n.watchdog = sd_notify::watchdog_enabled()
            .filter(|d| !d.is_zero())
            .map(|d| d / 2);
        n
    }

    fn send(&self, states: &[NotifyState]) {
        if !self.enabled {
            return;
        }
        if let Err(e) = sd_notify::notify(states) {
            tracing::debug!(error = %e, "systemd notification failed");
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// A status line (`systemctl status` shows it).
    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    /// Tells the watchdog the main loop is alive; cheap to call often.
    pub fn alive(&self) {
        let Some(every) = self.watchdog else {
            return;
        };
        let now = self.start.elapsed().as_millis() as u64;
        if due(self.last_fed.load(Ordering::Relaxed), now, every) {
            self.last_fed.store(now.max(1), Ordering::Relaxed);
            self.send(&[NotifyState::Watchdog]);
        }
    }

    /// The longest the main loop may wait between [`Notifier::alive`] calls.
    pub fn feed_interval(&self) -> Duration {
        self.watchdog
            .map(|w| w / 2)
            .unwrap_or(Duration::from_secs(3600))
    }
}

/// Whether the watchdog is due another notification at `now` (ms), last fed at `last` (ms, 0 for
/// never), fed every `every`: a few times an interval, not at every turn of a busy loop.
fn due(last: u64, now: u64, every: Duration) -> bool {
    let gap = (every.as_millis() as u64 / 2).max(1);
    last == 0 || now.saturating_sub(last) >= gap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_is_fed_a_few_times_an_interval() {
        let every = Duration::from_secs(10);
        assert!(due(0, 5, every));
        assert!(!due(5, 4_000, every));
        assert!(due(5, 5_005, every));
    }
}
