//! What a running relay says at info while it works, for operators who watch `journalctl` or a
//! log collector rather than /metrics: a summary line every interval (a minute) in which
//! anything happened, an idle line every ten intervals otherwise, and a warning when the oldest
//! pending row waits longer than `--pending-age-warn`, and again when it no longer does.
//!
//! Counts come from the metrics' counters (this process's work since the last line); pending,
//! the oldest pending row's age and dead rows from the table (every relay sees the same).

use crate::metrics::{ClassLabel, Metrics};
use crate::store::Store;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// An idle relay says so once every this many intervals.
const IDLE_EVERY: u32 = 10;

const CLASSES: [&str; 3] = ["transient", "permanent", "configuration"];

#[derive(Clone, Copy, Debug)]
pub struct SummarySettings {
    /// Between two summary lines (and two checks of the oldest pending row's age).
    pub interval: Duration,
    /// The oldest pending row waiting longer than this is warned about.
    pub pending_age_warn: Duration,
}

/// This process's counters at one moment.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Counts {
    rows: u64,
    tuples: u64,
    writes: u64,
    failed: [u64; 3],
    dead_lettered: u64,
}

impl Counts {
    fn read(m: &Metrics) -> Counts {
        Counts {
            rows: m.rows_delivered.get(),
            tuples: m.tuples_delivered.get(),
            writes: m.writes_sent.get(),
            failed: CLASSES.map(|class| {
                m.failed_attempts
                    .get(&ClassLabel { class })
                    .map_or(0, |c| c.get())
            }),
            dead_lettered: m.rows_dead_lettered.get(),
        }
    }

    fn since(self, before: Counts) -> Counts {
        Counts {
            rows: self.rows.saturating_sub(before.rows),
            tuples: self.tuples.saturating_sub(before.tuples),
            writes: self.writes.saturating_sub(before.writes),
            failed: std::array::from_fn(|i| self.failed[i].saturating_sub(before.failed[i])),
            dead_lettered: self.dead_lettered.saturating_sub(before.dead_lettered),
        }
    }
}

/// A duration for a log line, to the millisecond, without spaces (`1m3s250ms`), so that a log
/// collector reads it as one `key=value`.
fn short(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
        .to_string()
        .replace(' ', "")
}

/// What the table said at a line, as the lines print it.
struct Table {
    /// Whether it could be read: unknown changes nothing (no warning, no recovery).
    known: bool,
    /// "?" when the table could not be read.
    pending: String,
    dead: String,
    oldest: Option<Duration>,
    /// "-" when there is none, or the table could not be read.
    oldest_text: String,
}

impl Table {
    fn of(counts: Option<crate::store::PendingCounts>) -> Table {
        let oldest = counts
            .and_then(|t| t.oldest_pending_age_seconds)
            .map(|s| Duration::from_secs_f64(s.max(0.0)));
        Table {
            known: counts.is_some(),
            pending: counts.map_or_else(|| "?".to_owned(), |t| t.pending.to_string()),
            dead: counts.map_or_else(|| "?".to_owned(), |t| t.dead.to_string()),
            oldest,
            oldest_text: oldest.map_or_else(|| "-".to_owned(), short),
        }
    }
}

/// What an interval's line reports of this process's work.
struct Done {
    did: Counts,
    latency: Option<crate::latency_window::Percentiles>,
}

/// What the summary keeps from one line to the next.
struct Summary {
    metrics: Metrics,
    settings: SummarySettings,
    /// The counters at the last line.
    last: Counts,
    /// Intervals in a row in which nothing happened.
    idle_intervals: u32,
    /// The oldest pending row was last found waiting too long.
    too_old: bool,
}

/// Logs until `shutdown`.
pub async fn run(
    metrics: Metrics,
    store: Store,
    settings: SummarySettings,
    shutdown: CancellationToken,
) {
    let mut summary = Summary {
        last: Counts::read(&metrics),
        metrics,
        settings,
        idle_intervals: 0,
        too_old: false,
    };
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + settings.interval,
        settings.interval,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        // What was done up to the tick, before the table is asked (which may be slow).
        let done = summary.take();
        let counts = match store.status_pending().await {
            Ok(t) => Some(t),
            Err(e) => {
                debug!(error = %e, "summary: cannot count pending rows");
                None
            }
        };
        let table = Table::of(counts);
        summary.say(done, &table);
        summary.watch_age(&table);
    }
}

impl Summary {
    /// What was done since the last line, and the delivery latency's quantiles over it.
    fn take(&mut self) -> Done {
        let now = Counts::read(&self.metrics);
        let did = now.since(self.last);
        self.last = now;
        Done {
            did,
            latency: self.metrics.delivery_latency_seconds.take(),
        }
    }

    /// The interval's line: what was `done`, or, every `IDLE_EVERY` idle intervals, that
    /// nothing was.
    fn say(&mut self, done: Done, table: &Table) {
        let Done { did, latency } = done;
        let interval = self.settings.interval;
        if did != Counts::default() {
            self.idle_intervals = 0;
            info!(
                over = %short(interval),
                delivered = did.rows,
                tuples = did.tuples,
                writes = did.writes,
                failed_transient = did.failed[0],
                failed_permanent = did.failed[1],
                failed_configuration = did.failed[2],
                dead_lettered = did.dead_lettered,
                pending = %table.pending,
                oldest_pending_age = %table.oldest_text,
                dead = %table.dead,
                latency_p50 = %latency.map_or_else(|| "-".to_owned(), |p| short(p.p50)),
                latency_p99 = %latency.map_or_else(|| "-".to_owned(), |p| short(p.p99)),
                "summary"
            );
            return;
        }
        self.idle_intervals += 1;
        if self.idle_intervals >= IDLE_EVERY {
            self.idle_intervals = 0;
            info!(
                over = %short(interval * IDLE_EVERY),
                pending = %table.pending,
                oldest_pending_age = %table.oldest_text,
                dead = %table.dead,
                "idle: nothing delivered"
            );
        }
    }

    /// Warns when the oldest pending row starts to wait too long, and when it no longer does.
    fn watch_age(&mut self, table: &Table) {
        if !table.known {
            return;
        }
        let threshold = self.settings.pending_age_warn;
        let now_too_old = table.oldest.is_some_and(|age| age > threshold);
        if now_too_old && !self.too_old {
            warn!(
                oldest_pending_age = %table.oldest_text,
                threshold = %short(threshold),
                pending = %table.pending,
                "pending rows are waiting too long"
            );
        } else if self.too_old && !now_too_old {
            warn!(
                oldest_pending_age = %table.oldest_text,
                threshold = %short(threshold),
                pending = %table.pending,
                "pending rows no longer wait too long"
            );
        }
        self.too_old = now_too_old;
    }
}
