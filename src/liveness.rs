//! Whether the relay's main loop is alive: it beats at every step of its work (each read and
//! each Write answered, each turn of the stream's wait while no Write is in flight or one landed
//! within the timeout, each connection attempt), and no beat for `--liveness-timeout` means it
//! is stuck. `/livez` answers from this, and
//! systemd's watchdog is fed only while it holds, so that either restarts a stuck relay. Neither
//! asks PostgreSQL: a database outage is waited out by a loop that keeps beating.

use crate::systemd::Notifier;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The default `--liveness-timeout`: far above the longest step the relay's own settings allow
/// with their defaults (a Write's deadline and a lost connection's discovery, about 21 s), so that
/// only a loop that is stuck, not one that waits as designed, is declared dead.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// When something last happened, to the millisecond: set from any task, cheaply and often, and
/// never moved back.
pub struct Stamp {
    start: Instant,
    /// Milliseconds from `start` to the last mark.
    last: AtomicU64,
}

impl Stamp {
    /// Marked now.
    pub fn new() -> Stamp {
        Stamp {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    pub fn mark(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last.fetch_max(now, Ordering::Relaxed);
    }

    /// Marked at `at`, unless marked later already.
    pub fn mark_at(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.start).as_millis() as u64;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    /// When it was last marked.
    pub fn at(&self) -> Instant {
        self.start + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }

    /// How long since the last mark.
    pub fn elapsed(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

impl Default for Stamp {
    fn default() -> Stamp {
        Stamp::new()
    }
}

/// The main loop's last sign of life.
pub struct Liveness {
    last: Stamp,
    timeout: Duration,
}

impl Liveness {
    pub fn new(timeout: Duration) -> Liveness {
        Liveness {
            last: Stamp::new(),
            timeout,
        }
    }

    /// The main loop made progress; cheap to call often.
    pub fn beat(&self) {
        self.last.mark();
    }

    /// The main loop made progress at `progress`'s last mark: its work waits on others (the
    /// Writes in flight) and is alive as long as they move.
    pub fn beat_at(&self, progress: &Stamp) {
        self.last.mark_at(progress.at());
    }

    /// How long since the last beat, when that is longer than the timeout (stuck).
    pub fn stalled_for(&self) -> Option<Duration> {
        let since = self.last.elapsed();
        (since > self.timeout).then_some(since)
    }

    pub fn is_alive(&self) -> bool {
        self.stalled_for().is_none()
    }

    /// How long without a beat counts as stuck.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How often a loop that waits must beat: well within the timeout.
    pub fn beat_interval(&self) -> Duration {
        (self.timeout / 4).max(Duration::from_millis(10))
    }
}

/// Watches `liveness` for as long as the process runs: says so in the log when the main loop
/// stops making progress (and when it makes some again), and feeds systemd's watchdog
/// (`WatchdogSec=`), at half its interval, only while the loop is alive.
pub async fn watch(liveness: Arc<Liveness>, systemd: Arc<Notifier>) {
    let watchdog = systemd.watchdog_interval();
    let every = watchdog.map_or(liveness.beat_interval(), |w| {
        (w / 2).min(liveness.beat_interval())
    });
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalled = false;
    loop {
        tick.tick().await;
        match liveness.stalled_for() {
            None => {
                if std::mem::take(&mut stalled) {
                    tracing::info!("the main loop makes progress again");
                }
                if watchdog.is_some() {
                    systemd.watchdog();
                }
            }
            Some(since) => {
                if !std::mem::replace(&mut stalled, true) {
                    tracing::error!(stalled_for = ?since, timeout = ?liveness.timeout,
                        "the main loop is stuck (no progress within --liveness-timeout): /livez \
                         answers 503 and systemd's watchdog is no longer fed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alive_until_the_timeout_passes_without_a_beat() {
        let l = Liveness::new(Duration::from_millis(50));
        l.beat();
        assert!(l.is_alive());
        std::thread::sleep(Duration::from_millis(80));
        assert!(
            l.stalled_for()
                .is_some_and(|d| d > Duration::from_millis(50))
        );
        l.beat();
        assert!(l.is_alive());
    }
}
