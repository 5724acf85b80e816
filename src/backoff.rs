//! Capped exponential backoff with jitter: a small pure function, so every loop backs off the
//! same way and tests can check the bounds.

use std::time::Duration;

/// A backoff schedule: `base`, doubling per attempt, never above `max`.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max }
    }

    /// The ceiling for the `attempt`-th consecutive failure (1-based): `base * 2^(attempt-1)`,
    /// capped at `max`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// The delay before retrying after the `attempt`-th consecutive failure: uniformly random in
    /// the upper half of [`Backoff::ceiling`] ("equal jitter"), so that relays that failed
    /// together do not retry together, yet no retry comes much earlier than the schedule says.
    pub fn delay(&self, attempt: u32) -> Duration {
        let c = self.ceiling(attempt);
        let half = c / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_stay_capped_with_jitter_in_the_upper_half() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        assert_eq!(b.ceiling(1), Duration::from_millis(100));
        assert_eq!(b.ceiling(2), Duration::from_millis(200));
        assert_eq!(b.ceiling(5), Duration::from_millis(1600));
        assert_eq!(b.ceiling(6), Duration::from_secs(2));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(2));
        for attempt in 1..40 {
            let d = b.delay(attempt);
            let c = b.ceiling(attempt);
            assert!(
                d >= c / 2 && d <= c,
                "attempt {attempt}: {d:?} outside [{:?}, {c:?}]",
                c / 2
            );
        }
    }
}
