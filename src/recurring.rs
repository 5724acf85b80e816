//! How often a problem that lasts is said again. A relay retries for ever what may heal (a
//! server restarting), and also what will not until someone acts (a refused password, a missing
//! grant): the latter must stand out in the log, at ERROR, without a line every few seconds for
//! as long as nobody acts. Each kind of problem is said when first seen, then at most once a
//! period while it recurs; a kind not seen before is said at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a lasting problem is said again while it recurs.
pub const AGAIN_AFTER: Duration = Duration::from_secs(60);

/// When each kind of problem was last said.
pub struct Recurring {
    period: Duration,
    said: Mutex<HashMap<&'static str, Instant>>,
}

impl Default for Recurring {
    fn default() -> Self {
        Recurring::every(AGAIN_AFTER)
    }
}

impl Recurring {
    /// Says each kind at most once every `period`.
    pub fn every(period: Duration) -> Recurring {
        Recurring {
            period,
            said: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a problem of `kind`, seen now, is to be said (and if so, it counts as said).
    pub fn due(&self, kind: &'static str) -> bool {
        self.due_at(kind, Instant::now())
    }

    fn due_at(&self, kind: &'static str, now: Instant) -> bool {
        // A plain map of instants, never half-updated: a panic elsewhere leaves it usable.
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        match said.get(kind) {
            Some(last) if now.saturating_duration_since(*last) < self.period => false,
            _ => {
                said.insert(kind, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_said_at_once_then_once_a_period() {
        let r = Recurring::every(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(r.due_at("password", t0));
        assert!(!r.due_at("password", t0 + Duration::from_secs(5)));
        assert!(!r.due_at("password", t0 + Duration::from_secs(59)));
        // Another kind is not held back by the first.
        assert!(r.due_at("grant", t0 + Duration::from_secs(5)));
        assert!(r.due_at("password", t0 + Duration::from_secs(60)));
        assert!(!r.due_at("password", t0 + Duration::from_secs(61)));
        assert!(!r.due_at("grant", t0 + Duration::from_secs(64)));
        assert!(r.due_at("grant", t0 + Duration::from_secs(65)));
    }
}
