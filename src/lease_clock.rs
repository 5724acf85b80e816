//! The clock the leadership lease runs on. It must keep counting while the host is suspended:
//! a leader suspended after its lease was renewed, and resumed after a replacement delivered,
//! must find its lease over, not still running. Rust's `Instant` (`CLOCK_MONOTONIC` on Linux)
//! stops while the system sleeps; `CLOCK_BOOTTIME` does not. Elsewhere there is no such clock
//! in the standard library, and the monotonic one stands in.
//!
//! A guest whose hypervisor pauses it (a paused or migrated VM) may see neither clock move over
//! the pause: what the relay can still do then is in the README (Guarantees, Failover).

use std::time::Duration;

/// A point on the lease's clock: time since boot, suspended time included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaseInstant(Duration);

impl LeaseInstant {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn now() -> LeaseInstant {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        // The kernel gives a normalised, non-negative time since boot.
        LeaseInstant(Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        ))
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub fn now() -> LeaseInstant {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        LeaseInstant(START.get_or_init(std::time::Instant::now).elapsed())
    }

    /// How long after `earlier` this is (zero if it is not after).
    pub fn saturating_duration_since(self, earlier: LeaseInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::ops::Add<Duration> for LeaseInstant {
    type Output = LeaseInstant;
    fn add(self, d: Duration) -> LeaseInstant {
        LeaseInstant(self.0.saturating_add(d))
    }
}

impl std::ops::Sub<Duration> for LeaseInstant {
    type Output = LeaseInstant;
    fn sub(self, d: Duration) -> LeaseInstant {
        LeaseInstant(self.0.saturating_sub(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn it_moves_with_the_monotonic_clock_while_the_host_is_awake() {
        let (b0, m0) = (LeaseInstant::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let (b1, m1) = (LeaseInstant::now(), Instant::now());
        let boot = b1.saturating_duration_since(b0);
        let mono = m1 - m0;
        assert!(boot >= Duration::from_millis(50), "{boot:?}");
        // Suspended time (none here) is the only difference between the two.
        let diff = boot.abs_diff(mono);
        assert!(
            diff < Duration::from_millis(20),
            "{boot:?} against {mono:?}"
        );
        assert!(b0 + Duration::from_secs(1) > b1);
        assert!(b1 - Duration::from_secs(1) < b0);
    }

    /// The kernel's uptime (`/proc/uptime`) counts suspended time: the lease's clock must be
    /// that one, not a process's monotonic clock.
    #[cfg(target_os = "linux")]
    #[test]
    fn it_is_the_time_since_boot_that_uptime_reports() {
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .expect("/proc/uptime")
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .expect("uptime in seconds");
        let now = LeaseInstant::now().0.as_secs_f64();
        assert!(
            (now - uptime).abs() < 0.5,
            "{now} s against uptime {uptime} s"
        );
    }
}
