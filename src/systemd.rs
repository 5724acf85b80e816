//! systemd's notify protocol (`Type=notify`): `READY=1` once the LISTEN connection is up,
//! `STATUS=` lines, `RELOADING=1` while a SIGHUP rereads files, and `WATCHDOG=1` while the main
//! loop is alive (see `liveness`), so that a stuck relay is restarted. Sent by the `sd-notify`
//! crate to `$NOTIFY_SOCKET`; without it (not under systemd) every call does nothing.

use sd_notify::NotifyState;
use std::time::Duration;

/// The relay's side of systemd's notifications.
pub struct Notifier {
    /// `NOTIFY_SOCKET` is set: the relay runs under systemd with `Type=notify`.
    enabled: bool,
    /// `WATCHDOG_USEC`, if the watchdog is enabled for us.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier that does nothing (commands other than `run`, tests).
    pub fn disabled() -> Notifier {
        Notifier {
            enabled: false,
            watchdog: None,
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
        n.watchdog = sd_notify::watchdog_enabled().filter(|d| !d.is_zero());
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

    /// `RELOADING=1`, with the monotonic clock's time as systemd wants it, before rereading
    /// settings; [`Notifier::ready`] after.
    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(e) => tracing::debug!(error = %e, "cannot read the monotonic clock"),
        }
    }

    /// `READY=1` again, after [`Notifier::reloading`].
    pub fn reloaded(&self) {
        self.send(&[NotifyState::Ready]);
    }

    /// `WATCHDOG=1`: the main loop is alive.
    pub fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    /// The watchdog's interval (`WatchdogSec=`), when it is enabled for this process.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }
}
