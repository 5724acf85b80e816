//! `Retry-After`, as OpenFGA or a proxy in front of it sends it.

use std::time::Duration;

/// Reads `Retry-After`: seconds, or an HTTP date. Values outside 30 min are ignored, as the
/// OpenFGA SDKs do; so is "now" (`0`, or a date already past, as a server whose clock is behind
/// sends), which would otherwise take away the backoff and retry at once, again and again.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let d = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = humantime::parse_rfc3339_weak(value)
            .ok()
            .or_else(|| httpdate(value))?;
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO)
    };
    (!d.is_zero() && d <= Duration::from_secs(1800)).then_some(d)
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form `Retry-After` uses.
fn httpdate(s: &str) -> Option<std::time::SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])?
        + 1;
    let iso = format!("{}-{:02}-{:0>2}T{}Z", parts[3], month, parts[1], parts[4]);
    humantime::parse_rfc3339(&iso).ok()
}
