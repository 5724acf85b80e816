//! The delivery-latency histogram, with a window of its own that the summary log line empties
//! every interval: Prometheus' histogram only counts since the start, and its buckets (a factor
//! of 2 apart) are too coarse for a percentile worth printing.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The window's buckets: from 100 µs, each 10 % wider than the last, to about an hour (and one
/// for anything longer). A percentile is reported as its bucket's upper bound: at most 10 % high.
const SMALLEST: f64 = 0.0001;
const FACTOR: f64 = 1.1;
const BUCKETS: usize = 185;

/// What the window saw since it was last emptied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub p50: Duration,
    pub p99: Duration,
}

/// The Prometheus histogram (as registered) and the window, fed together by [`observe`].
///
/// [`observe`]: LatencyHistogram::observe
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    histogram: Histogram,
    window: Arc<[AtomicU64; BUCKETS]>,
}

impl LatencyHistogram {
    pub fn new(histogram: Histogram) -> LatencyHistogram {
        LatencyHistogram {
            histogram,
            window: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    pub fn observe(&self, seconds: f64) {
        self.histogram.observe(seconds);
        self.window[bucket(seconds)].fetch_add(1, Ordering::Relaxed);
    }

    /// The window's percentiles, and an empty window; None when it saw nothing.
    pub fn take(&self) -> Option<Percentiles> {
        let counts: Vec<u64> = self
            .window
            .iter()
            .map(|c| c.swap(0, Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        (count > 0).then(|| Percentiles {
            count,
            p50: percentile(&counts, count, 0.50),
            p99: percentile(&counts, count, 0.99),
        })
    }
}

fn bucket(seconds: f64) -> usize {
    if !seconds.is_finite() || seconds <= SMALLEST {
        return 0;
    }
    let i = ((seconds / SMALLEST).ln() / FACTOR.ln()).ceil();
    (i as usize).min(BUCKETS - 1)
}

fn upper_bound(i: usize) -> Duration {
    Duration::from_secs_f64(SMALLEST * FACTOR.powi(i as i32))
}

/// The upper bound of the bucket holding the `q`-th observation.
fn percentile(counts: &[u64], count: u64, q: f64) -> Duration {
    let rank = ((q * count as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return upper_bound(i);
        }
    }
    upper_bound(BUCKETS - 1)
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.histogram.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.histogram.metric_type()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::exponential_buckets;

    #[test]
    fn percentiles_of_the_window_within_ten_percent_then_empty() {
        let h = LatencyHistogram::new(Histogram::new(exponential_buckets(0.001, 2.0, 4)));
        for ms in 1..=100 {
            h.observe(ms as f64 / 1000.0);
        }
        let p = h.take().unwrap();
        assert_eq!(p.count, 100);
        let near = |d: Duration, ms: f64| {
            let got = d.as_secs_f64() * 1000.0;
            assert!(got >= ms && got <= ms * 1.1, "{got} ms for {ms} ms");
        };
        near(p.p50, 50.0);
        near(p.p99, 99.0);
        assert_eq!(h.take(), None, "emptied");
        h.observe(f64::NAN);
        h.observe(1e9);
        assert_eq!(h.take().unwrap().count, 2);
    }
}
