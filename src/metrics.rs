//! Metrics, in one registry per relay (so several relays in one test process never mix), served
//! in Prometheus text format by `http.rs`.
//!
//! Every `fga_relay_*` series carries `table`, the outbox table as `schema.name`, so that the
//! relays of several outboxes can be told apart (and alerts grouped `by (table)`); the standard
//! `process_*` metrics (`process_metrics.rs`) do not. Labels are bounded: a failure class, never
//! an error message.

use crate::latency_window::LatencyHistogram;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The `class` label of failed attempts: `transient`, `permanent` or `configuration`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: &'static str,
}

/// The `outcome` label of OpenFGA request durations: `ok`, or the failure class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// The label of `fga_relay_store_info`: the store's id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabel {
    pub store: String,
}

/// The labels of `fga_relay_build_info`: the crate's version and the git revision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    pub revision: &'static str,
}

/// Buckets of the request-duration histogram: 0.5 ms to about 65 s, so that requests cut off by
/// `--request-timeout` (10 s by default, up to a minute in practice) land in a bucket of their own
/// rather than all in `+Inf`.
fn request_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 18)
}

/// Every metric the relay exports. Cloning shares the same series.
#[derive(Clone)]
pub struct Metrics {
    pub rows_delivered: Counter,
    pub tuples_delivered: Counter,
    pub writes_sent: Counter,
    pub failed_attempts: Family<ClassLabel, Counter>,
    pub rows_dead_lettered: Counter,
    pub pending_rows: Gauge,
    pub dead_rows: Gauge,
    pub oldest_pending_age_seconds: Gauge<f64, AtomicU64>,
    /// 1 when the last count of the table (for the three gauges above) succeeded, 0 when it
    /// failed and they kept their earlier values.
    pub table_count_ok: Gauge,
    pub store_info: Family<StoreLabel, Gauge>,
    pub listen_connected: Gauge,
    pub leader: Gauge,
    pub write_window: Gauge,
    pub writes_in_flight: Gauge,
    pub reconnects: Counter,
    pub sweep_found_rows: Counter,
    pub notifications: Counter,
    pub delivery_latency_seconds: LatencyHistogram,
    pub request_duration_seconds: Family<OutcomeLabel, Histogram>,
}

/// Always 1, with the version and git revision as labels.
fn register_build_info(r: &mut Registry) {
    let build_info: Family<BuildLabels, Gauge> = Family::default();
    build_info
        .get_or_create(&BuildLabels {
            version: crate::build_info::VERSION,
            revision: crate::build_info::REVISION,
        })
        .set(1);
    r.register(
        "build_info",
        "Always 1; the labels say which version and git revision of fga-relay runs",
        build_info,
    );
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `fga_relay_`, with the label
    /// `table` (the outbox table as `schema.name`), beside the process metrics.
    pub fn new(registry: &mut Registry, table: &str) -> Metrics {
        let m = Metrics {
            rows_delivered: Counter::default(),
            tuples_delivered: Counter::default(),
            writes_sent: Counter::default(),
            failed_attempts: Family::default(),
            rows_dead_lettered: Counter::default(),
            pending_rows: Gauge::default(),
            dead_rows: Gauge::default(),
            oldest_pending_age_seconds: Gauge::default(),
            table_count_ok: Gauge::default(),
            store_info: Family::default(),
            listen_connected: Gauge::default(),
            leader: Gauge::default(),
            write_window: Gauge::default(),
            writes_in_flight: Gauge::default(),
            reconnects: Counter::default(),
            sweep_found_rows: Counter::default(),
            notifications: Counter::default(),
            // 0.25 ms .. ~16 s: commit-to-OpenFGA is around a millisecond when all is well.
            delivery_latency_seconds: LatencyHistogram::new(Histogram::new(exponential_buckets(
                0.00025, 2.0, 17,
            ))),
            request_duration_seconds: Family::new_with_constructor(|| {
                Histogram::new(request_buckets())
            }),
        };
        registry.register_collector(Box::new(crate::process_metrics::ProcessMetrics));
        let r = registry
            .sub_registry_with_prefix("fga_relay")
            .sub_registry_with_label(("table".into(), table.to_owned().into()));
        // Before the first count, nothing has failed.
        m.table_count_ok.set(1);
        register_build_info(r);
        m.register_delivery(r);
        m.register_table(r);
        m.register_session(r);
        m.register_timings(r);
        m.zero_series();
        m
    }

    /// What delivery did: rows, tuples, Writes, failures, rows given up on.
    fn register_delivery(&self, r: &mut Registry) {
        r.register(
            "rows_delivered",
            "Outbox rows delivered to OpenFGA",
            self.rows_delivered.clone(),
        );
        r.register(
            "tuples_delivered",
            "Tuple operations OpenFGA accepted",
            self.tuples_delivered.clone(),
        );
        r.register(
            "writes",
            "Write requests sent to OpenFGA",
            self.writes_sent.clone(),
        );
        r.register(
            "failed_attempts",
            "Failed Write attempts, by class (transient, permanent, configuration)",
            self.failed_attempts.clone(),
        );
        r.register(
            "rows_dead_lettered",
            "Rows the relay gave up on (failed_at set)",
            self.rows_dead_lettered.clone(),
        );
    }

    /// What the table holds, at the last scrape, and the store written to.
    fn register_table(&self, r: &mut Registry) {
        r.register(
            "pending_rows",
            "Rows waiting for delivery (at the last scrape)",
            self.pending_rows.clone(),
        );
        r.register(
            "dead_rows",
            "Dead-lettered rows in the table now, whichever process dead-lettered them \
             (at the last scrape)",
            self.dead_rows.clone(),
        );
        r.register(
            "oldest_pending_age_seconds",
            "Age of the oldest pending row (0 when none; at the last scrape)",
            self.oldest_pending_age_seconds.clone(),
        );
        r.register(
            "table_count_ok",
            "1 when the last count of the table (pending_rows, dead_rows, \
             oldest_pending_age_seconds) succeeded; 0 when it failed, and they show the last \
             values counted",
            self.table_count_ok.clone(),
        );
        r.register(
            "store_info",
            "Always 1; the label says which OpenFGA store the relay writes to (its id, once \
             known)",
            self.store_info.clone(),
        );
    }

    /// The relay's connection, role, window and wake-ups.
    fn register_session(&self, r: &mut Registry) {
        r.register(
            "listen_connected",
            "1 while the dedicated LISTEN connection is up",
            self.listen_connected.clone(),
        );
        r.register(
            "leader",
            "1 while this relay is the one delivering (the others are standbys)",
            self.leader.clone(),
        );
        r.register(
            "write_window",
            "Writes the relay lets be in flight at once now: halved on 429, 5xx and timeouts, \
             grown back while Writes succeed, up to --max-in-flight",
            self.write_window.clone(),
        );
        r.register(
            "writes_in_flight",
            "Writes sent and not yet answered",
            self.writes_in_flight.clone(),
        );
        r.register(
            "listen_reconnects",
            "Times the LISTEN connection was lost and made again",
            self.reconnects.clone(),
        );
        r.register(
            "sweep_found_rows",
            "Rows delivered by the periodic sweep rather than after a notification \
             (a sign notifications are being lost)",
            self.sweep_found_rows.clone(),
        );
        r.register(
            "notifications",
            "Notifications received on the LISTEN connection",
            self.notifications.clone(),
        );
    }

    /// How long rows and Writes took.
    fn register_timings(&self, r: &mut Registry) {
        r.register(
            "delivery_latency_seconds",
            "Time from a row's created_at to OpenFGA accepting it",
            self.delivery_latency_seconds.clone(),
        );
        r.register(
            "openfga_request_duration_seconds",
            "Duration of Write requests to OpenFGA, by outcome (ok, transient, permanent, \
             configuration)",
            self.request_duration_seconds.clone(),
        );
    }

    /// Every class and outcome from the start, so that dashboards see zeros rather than no
    /// series.
    fn zero_series(&self) {
        for class in ["transient", "permanent", "configuration"] {
            let _ = self.failed_attempts.get_or_create(&ClassLabel { class });
            let _ = self
                .request_duration_seconds
                .get_or_create(&OutcomeLabel { outcome: class });
        }
        let _ = self
            .request_duration_seconds
            .get_or_create(&OutcomeLabel { outcome: "ok" });
    }

    /// Metrics registered nowhere, for code paths that do not export them (commands, tests).
    pub fn unregistered() -> Metrics {
        Metrics::new(&mut Registry::default(), "")
    }

    /// Says which store the relay writes to.
    pub fn store(&self, id: &str) {
        self.store_info
            .get_or_create(&StoreLabel {
                store: id.to_owned(),
            })
            .set(1);
    }

    /// Records how long one OpenFGA request took and how it ended (`ok` or a failure class).
    pub fn request(&self, outcome: &'static str, seconds: f64) {
        self.request_duration_seconds
            .get_or_create(&OutcomeLabel { outcome })
            .observe(seconds);
    }

    pub fn failed(&self, class: &'static str) {
        self.failed_attempts
            .get_or_create(&ClassLabel { class })
            .inc();
    }
}

/// The registry's content in Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_in_prometheus_text() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry, "public.fga_outbox");
        m.rows_delivered.inc_by(3);
        m.failed("transient");
        m.delivery_latency_seconds.observe(0.001);
        m.request("ok", 0.002);
        m.store("01ARZ3NDEKTSV4RRFFQ69G5FAV");
        let text = render(&registry);
        let t = "table=\"public.fga_outbox\"";
        for series in [
            format!(
                "fga_relay_build_info{{{t},version=\"{}\",revision=\"{}\"}} 1",
                crate::build_info::VERSION,
                crate::build_info::REVISION
            ),
            format!("fga_relay_openfga_request_duration_seconds_count{{{t},outcome=\"ok\"}} 1"),
            format!(
                "fga_relay_openfga_request_duration_seconds_bucket{{{t},outcome=\"transient\",le=\"65.536\"}} 0"
            ),
            format!("fga_relay_rows_delivered_total{{{t}}} 3"),
            format!("fga_relay_failed_attempts_total{{{t},class=\"transient\"}} 1"),
            format!("fga_relay_table_count_ok{{{t}}} 1"),
            format!("fga_relay_store_info{{{t},store=\"01ARZ3NDEKTSV4RRFFQ69G5FAV\"}} 1"),
        ] {
            assert!(text.contains(&series), "{series} not in:\n{text}");
        }
        assert!(
            text.contains("fga_relay_delivery_latency_seconds_bucket"),
            "{text}"
        );
        // Every fga_relay series says its table; the process metrics (read from /proc, on
        // Linux) are the process's.
        for line in text.lines().filter(|l| l.starts_with("fga_relay_")) {
            assert!(line.contains(t), "{line}");
        }
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                !cfg!(target_os = "linux") || text.lines().any(|l| l.starts_with(name)),
                "{name}not in:\n{text}"
            );
        }
    }
}
