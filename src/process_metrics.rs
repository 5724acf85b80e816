//! Prometheus' standard process metrics, under their standard names and types:
//! `process_cpu_seconds_total` (counter), `process_resident_memory_bytes`, `process_open_fds` and
//! `process_start_time_seconds` (gauges). Read from `/proc/self` at each scrape, on Linux; none
//! elsewhere. No crate does this for `prometheus-client`, so it is this small file.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What one look at `/proc/self` found.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    resident_bytes: i64,
    open_fds: i64,
    start_time_seconds: f64,
}

/// The process metrics, registered once in the registry `/metrics` renders.
#[derive(Debug, Default)]
pub struct ProcessMetrics;

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = sample() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                ConstGauge::new(s.resident_bytes as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                ConstGauge::new(s.open_fds as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                ConstGauge::new(s.start_time_seconds),
            ),
        ];
        for (name, help, gauge) in gauges {
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let system = std::fs::read_to_string("/proc/stat").ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    parse(
        &stat,
        &system,
        open_fds,
        rustix::param::clock_ticks_per_second(),
        rustix::param::page_size() as u64,
    )
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn sample() -> Option<Sample> {
    None
}

/// `/proc/self/stat` (fields 14 and 15 the CPU time in clock ticks, 22 the start in ticks after
/// boot, 24 the resident set in pages; the command name, field 2, may hold spaces and
/// parentheses, so fields are counted after its last `)`) and `/proc/stat`'s `btime` (the boot,
/// in seconds since the epoch).
fn parse(stat: &str, system: &str, open_fds: i64, ticks: u64, page: u64) -> Option<Sample> {
    let ticks = ticks.max(1) as f64;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // The first field after the name is field 3.
    let field = |n: usize| -> Option<u64> { fields.get(n.checked_sub(3)?)?.parse().ok() };
    let boot: u64 = system
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(Sample {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_bytes: field(24)?.saturating_mul(page) as i64,
        open_fds,
        start_time_seconds: boot as f64 + field(22)? as f64 / ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_by_field_and_never_panic() {
        let stat = "4242 (fga (re) lay) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 \
                    3 0 123400 104857600 2560 18446744073709551615";
        let system = "cpu  1 2 3\nbtime 1700000000\nprocesses 99\n";
        assert_eq!(
            parse(stat, system, 12, 100, 4096),
            Some(Sample {
                cpu_seconds: 3.0,
                resident_bytes: 2560 * 4096,
                open_fds: 12,
                start_time_seconds: 1_700_000_000.0 + 1234.0,
            })
        );
        for (stat, system) in [
            ("", system),
            ("4242 (x) S 1", system),
            (stat, "cpu 1 2 3\n"),
            ("4242 (x) S 1 2 3 4 5 6 7 8 9 10 x y", system),
        ] {
            assert_eq!(parse(stat, system, 1, 100, 4096), None);
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_measured() {
        let s = sample().expect("/proc/self");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(s.resident_bytes > 0 && s.open_fds > 0, "{s:?}");
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0,
            "{s:?}"
        );
    }
}
