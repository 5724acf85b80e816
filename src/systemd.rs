//! systemd's notify protocol (`Type=notify`): `READY=1` once the LISTEN connection is up,
//! `STATUS=` lines, and `WATCHDOG=1` from the relay's main loop, so that a wedged relay is
//! restarted. A datagram to `$NOTIFY_SOCKET`; without it (not under systemd) every call does
//! nothing.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The connection to systemd's notification socket, if the relay runs under systemd.
pub struct Notifier {
    socket: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
    /// How often the watchdog must be fed (half of `WATCHDOG_USEC`), if it is enabled for us.
    watchdog: Option<Duration>,
    /// Milliseconds since `start` at the last watchdog datagram, to send at most a few per
    /// interval however busy the loop is.
    last_fed: AtomicU64,
    start: Instant,
}

/// An abstract socket name, as systemd gives `NOTIFY_SOCKET=@name`: Linux only. Elsewhere (a
/// developer's macOS) there is no systemd, and the address is refused.
#[cfg(target_os = "linux")]
fn abstract_address(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn abstract_address(_name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

impl Notifier {
    /// A notifier that does nothing (commands other than `run`, tests).
    pub fn disabled() -> Notifier {
        Notifier {
            socket: None,
            watchdog: None,
            last_fed: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` as systemd sets them.
    pub fn from_env() -> Notifier {
        let mut n = Notifier::disabled();
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return n;
        };
        let path = path.to_string_lossy().into_owned();
        let addr = match path.strip_prefix('@') {
            Some(name) => abstract_address(name),
            None => std::os::unix::net::SocketAddr::from_pathname(&path),
        };
        let (Ok(addr), Ok(socket)) = (addr, UnixDatagram::unbound()) else {
            tracing::warn!(notify_socket = %path, "cannot use NOTIFY_SOCKET; not notifying systemd");
            return n;
        };
        n.socket = Some((socket, addr));
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|pid| pid == std::process::id());
        if for_us
            && let Some(usec) = std::env::var("WATCHDOG_USEC")
                .ok()
                .and_then(|u| u.parse::<u64>().ok())
                .filter(|u| *u > 0)
        {
            n.watchdog = Some(Duration::from_micros(usec) / 2);
        }
        n
    }

    fn send(&self, msg: &str) {
        if let Some((socket, addr)) = &self.socket
            && let Err(e) = socket.send_to_addr(msg.as_bytes(), addr)
        {
            tracing::debug!(error = %e, "systemd notification failed");
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
    }

    /// A status line (`systemctl status` shows it).
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={status}"));
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    /// Tells the watchdog the main loop is alive; cheap to call often.
    pub fn alive(&self) {
        let Some(every) = self.watchdog else {
            return;
        };
        let now = self.start.elapsed().as_millis() as u64;
        let last = self.last_fed.load(Ordering::Relaxed);
        let gap = (every.as_millis() as u64 / 2).max(1);
        if last == 0 || now.saturating_sub(last) >= gap {
            self.last_fed.store(now.max(1), Ordering::Relaxed);
            self.send("WATCHDOG=1");
        }
    }

    /// The longest the main loop may wait between [`Notifier::alive`] calls.
    pub fn feed_interval(&self) -> Duration {
        self.watchdog
            .map(|w| w / 2)
            .unwrap_or(Duration::from_secs(3600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_the_socket_and_the_watchdog_is_rate_limited() {
        let dir = std::env::temp_dir().join(format!("fga-relay-sd-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        server.set_nonblocking(true).unwrap();
        let n = Notifier {
            socket: Some((
                UnixDatagram::unbound().unwrap(),
                std::os::unix::net::SocketAddr::from_pathname(&path).unwrap(),
            )),
            watchdog: Some(Duration::from_secs(10)),
            last_fed: AtomicU64::new(0),
            start: Instant::now(),
        };
        n.ready("listening");
        n.alive();
        n.alive();
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        while let Ok(len) = server.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..len]).into_owned());
        }
        assert_eq!(got, vec!["READY=1\nSTATUS=listening", "WATCHDOG=1"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
