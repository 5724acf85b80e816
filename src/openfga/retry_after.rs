//! `Retry-After`, as OpenFGA or a proxy in front of it sends it.

use std::time::{Duration, SystemTime};

/// Reads `Retry-After`: seconds, or an HTTP date (any of the three forms HTTP allows, read by
/// `httpdate`; RFC 3339 too, which some proxies send). Values outside 30 min are ignored, as the
/// OpenFGA SDKs do; so is "now" (`0`, or a date already past, as a server whose clock is behind
/// sends), which would otherwise take away the backoff and retry at once, again and again.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let d = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = httpdate::parse_http_date(value)
            .ok()
            .or_else(|| humantime::parse_rfc3339_weak(value).ok())?;
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    };
    (!d.is_zero() && d <= Duration::from_secs(1800)).then_some(d)
}
