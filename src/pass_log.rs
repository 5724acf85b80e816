//! What the relay says about its passes: the first delivery after start at info (at the default
//! level a relay that delivers would otherwise say nothing until its first summary line), the
//! warning when a sweep finds rows no notification announced, and each pass at debug.

use crate::delivery::PassReport;
use crate::metrics::Metrics;
pub use crate::wake::Trigger;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{debug, info, warn};

/// What this process has said about its passes so far.
#[derive(Default)]
pub struct PassLog {
    delivered_once: AtomicBool,
}

impl PassLog {
    /// Counts and logs a pass's outcome.
    pub fn account(&self, metrics: &Metrics, trigger: Trigger, report: &PassReport) {
        if report.swept > 0 {
            metrics.sweep_found_rows.inc_by(report.swept);
            warn!(
                rows = report.swept,
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
