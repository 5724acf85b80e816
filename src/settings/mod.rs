//! The flags several commands share (where the outbox is, how to reach OpenFGA, how delivery
//! behaves), each with its environment fallback (the OpenFGA ones named as the `fga` CLI names
//! them), and their validation into [`crate::config`]'s settings.
//!
//! clap only collects raw strings; each `settings()` checks them so that a bad setting produces
//! one line that names both the flag and the environment variable.

mod db;
mod delivery;
mod fga;
mod relay;
mod renamed;
mod run;
mod secret_file;

pub use db::DbArgs;
pub(crate) use db::table;
pub use delivery::DeliveryArgs;
pub use fga::FgaArgs;
pub use relay::RelayArgs;
pub use run::{RunArgs, RunSettings};

/// Defaults, shown by `--help` and used when a variable is set but empty (`FGA_RELAY_SWEEP_INTERVAL=`
/// in an env file means "the default", as it does for most tools).
const DEFAULT_API_URL: &str = "http://localhost:8080";
const DEFAULT_REQUEST_TIMEOUT: &str = "10s";
const DEFAULT_MAX_TUPLES: &str = "100";
const DEFAULT_SWEEP_INTERVAL: &str = "30s";
const DEFAULT_HEARTBEAT_INTERVAL: &str = "5s";
const DEFAULT_LEADER_LEASE: &str = "15s";
const DEFAULT_MAX_ATTEMPTS: &str = "10";
const DEFAULT_BATCH_SIZE: &str = "500";
const DEFAULT_MAX_IN_FLIGHT: &str = "16";
const DEFAULT_LINGER: &str = "1ms";
pub(crate) const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9464";
const DEFAULT_PENDING_AGE_WARN: &str = "2m";
const DEFAULT_SUMMARY_INTERVAL: &str = "1m";
pub(crate) const DEFAULT_LOG_FORMAT: &str = "text";
pub(crate) const DEFAULT_TABLE: &str = "fga_outbox";

/// The value, or the default when it is empty.
pub(crate) fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.trim().is_empty() {
        default
    } else {
        value
    }
}

/// The value, trimmed, or nothing when it is empty.
fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}
