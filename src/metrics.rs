//! Metrics, in one registry per relay (so several relays in one test process never mix), served
//! in Prometheus text format by `http.rs`.
//!
//! Labels are bounded: a failure class, never an error message.

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

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `fga_relay_`.
    pub fn new(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            rows_delivered: Counter::default(),
            tuples_delivered: Counter::default(),
            writes_sent: Counter::default(),
            failed_attempts: Family::default(),
            rows_dead_lettered: Counter::default(),
            pending_rows: Gauge::default(),
            dead_rows: Gauge::default(),
            oldest_pending_age_seconds: Gauge::default(),
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
        let r = registry.sub_registry_with_prefix("fga_relay");
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
        r.register(
            "rows_delivered",
            "Outbox rows delivered to OpenFGA",
            m.rows_delivered.clone(),
        );
        r.register(
            "tuples_delivered",
            "Tuple operations OpenFGA accepted",
            m.tuples_delivered.clone(),
        );
        r.register(
            "writes",
            "Write requests sent to OpenFGA",
            m.writes_sent.clone(),
        );
        r.register(
            "failed_attempts",
            "Failed Write attempts, by class (transient, permanent, configuration)",
            m.failed_attempts.clone(),
        );
        r.register(
            "rows_dead_lettered",
            "Rows the relay gave up on (failed_at set)",
            m.rows_dead_lettered.clone(),
        );
        r.register(
            "pending_rows",
            "Rows waiting for delivery (at the last scrape)",
            m.pending_rows.clone(),
        );
        r.register(
            "dead_rows",
            "Dead-lettered rows in the table now, whichever process dead-lettered them \
             (at the last scrape)",
            m.dead_rows.clone(),
        );
        r.register(
            "oldest_pending_age_seconds",
            "Age of the oldest pending row (0 when none; at the last scrape)",
            m.oldest_pending_age_seconds.clone(),
        );
        r.register(
            "listen_connected",
            "1 while the dedicated LISTEN connection is up",
            m.listen_connected.clone(),
        );
        r.register(
            "leader",
            "1 while this relay is the one delivering (the others are standbys)",
            m.leader.clone(),
        );
        r.register(
            "write_window",
            "Writes the relay lets be in flight at once now: halved on 429, 5xx and timeouts, \
             grown back while Writes succeed, up to --max-in-flight",
            m.write_window.clone(),
        );
        r.register(
            "writes_in_flight",
            "Writes sent and not yet answered",
            m.writes_in_flight.clone(),
        );
        r.register(
            "listen_reconnects",
            "Times the LISTEN connection was lost and made again",
            m.reconnects.clone(),
        );
        r.register(
            "sweep_found_rows",
            "Rows delivered by the periodic sweep rather than after a notification \
             (a sign notifications are being lost)",
            m.sweep_found_rows.clone(),
        );
        r.register(
            "notifications",
            "Notifications received on the LISTEN connection",
            m.notifications.clone(),
        );
        r.register(
            "delivery_latency_seconds",
            "Time from a row's created_at to OpenFGA accepting it",
            m.delivery_latency_seconds.clone(),
        );
        r.register(
            "openfga_request_duration_seconds",
            "Duration of Write requests to OpenFGA, by outcome (ok, transient, permanent, \
             configuration)",
            m.request_duration_seconds.clone(),
        );
        // Every class from the start, so that dashboards see zeros rather than no series.
        for class in ["transient", "permanent", "configuration"] {
            let _ = m.failed_attempts.get_or_create(&ClassLabel { class });
            let _ = m
                .request_duration_seconds
                .get_or_create(&OutcomeLabel { outcome: class });
        }
        let _ = m
            .request_duration_seconds
            .get_or_create(&OutcomeLabel { outcome: "ok" });
        m
    }

    /// Metrics registered nowhere, for code paths that do not export them (commands, tests).
    pub fn unregistered() -> Metrics {
        Metrics::new(&mut Registry::default())
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
        let m = Metrics::new(&mut registry);
        m.rows_delivered.inc_by(3);
        m.failed("transient");
        m.delivery_latency_seconds.observe(0.001);
        m.request("ok", 0.002);
        let text = render(&registry);
        assert!(
            text.contains(&format!(
                "fga_relay_build_info{{version=\"{}\",revision=\"{}\"}} 1",
                crate::build_info::VERSION,
                crate::build_info::REVISION
            )),
            "{text}"
        );
        assert!(
            text.contains("fga_relay_openfga_request_duration_seconds_count{outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("fga_relay_openfga_request_duration_seconds_bucket{le=\"65.536\",outcome=\"transient\"} 0")
                || text.contains("fga_relay_openfga_request_duration_seconds_bucket{outcome=\"transient\",le=\"65.536\"} 0"),
            "{text}"
        );
        assert!(text.contains("fga_relay_rows_delivered_total 3"), "{text}");
        assert!(
            text.contains("fga_relay_failed_attempts_total{class=\"transient\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("fga_relay_delivery_latency_seconds_bucket"),
            "{text}"
        );
    }
}
