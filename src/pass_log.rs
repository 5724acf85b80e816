//! What the relay says about its passes: the first delivery after start at info (at the default
//! level a relay that delivers would otherwise say nothing until its first summary line), the
//! warning when a sweep finds rows no notification announced, and each pass at debug.

use crate::delivery::PassReport;
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{debug, info, warn};

/// Why the relay ran a pass: a sweep pass that finds rows means notifications were missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The first pass after taking leadership (a start or a reconnect).
    Connect,
    Notification,
    Sweep,
    /// The pass before found work, or a retry came due.
    Again,
}

impl Trigger {
    /// The word logged for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Connect => "leadership",
            Trigger::Notification => "notification",
            Trigger::Sweep => "sweep",
            Trigger::Again => "again",
        }
    }
}

/// What this process has said about its passes so far.
#[derive(Default)]
pub struct PassLog {
    delivered_once: AtomicBool,
}

impl PassLog {
    /// Counts and logs a pass's outcome.
    pub fn account(&self, metrics: &Metrics, trigger: Trigger, report: &PassReport) {
        if trigger == Trigger::Sweep && report.delivered > 0 {
            metrics.sweep_found_rows.inc_by(report.delivered);
            warn!(
                rows = report.delivered,
                "the sweep found rows no notification announced: notifications are being lost"
            );
        }
        if report.delivered > 0 && !self.delivered_once.swap(true, Ordering::Relaxed) {
            info!(
                rows = report.delivered,
                writes = report.writes,
                trigger = %trigger.as_str(),
                "first rows delivered since start"
            );
        }
        if report.did_work() {
            debug!(
                trigger = %trigger.as_str(),
                delivered = report.delivered,
                dead = report.dead,
                failed_writes = report.failed_writes,
                writes = report.writes,
                held = report.held,
                "drained"
            );
        }
    }
}
