//! How the delivery loop behaves: sweep and heartbeat intervals, the leader's lease, attempts,
//! batch size, Writes in flight, linger.

use super::{
    DEFAULT_BATCH_SIZE, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEADER_LEASE, DEFAULT_LINGER,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_IN_FLIGHT, DEFAULT_SWEEP_INTERVAL, or_default,
};
use crate::config::{self, ConfigError, DeliverySettings};
use clap::Args;

/// Beyond this a linger is a sweep: the relay would sit on rows it has been told about.
const MAX_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// How the delivery loop behaves.
#[derive(Args, Debug)]
pub struct DeliveryArgs {
    /// Drain this often even without a notification.
    #[arg(long, env = "FGA_RELAY_SWEEP_INTERVAL", default_value = DEFAULT_SWEEP_INTERVAL)]
    pub sweep_interval: String,
    /// Check the dedicated connection this often; a silent connection is dead after two.
    #[arg(long, env = "FGA_RELAY_HEARTBEAT_INTERVAL", default_value = DEFAULT_HEARTBEAT_INTERVAL)]
    pub heartbeat_interval: String,
    /// How long leadership lasts unrenewed (renewed every heartbeat): past it, the session
    /// holding it is ended by another relay. At least three heartbeats, longer than the request
    /// timeout.
    #[arg(long, env = "FGA_RELAY_LEADER_LEASE", default_value = DEFAULT_LEADER_LEASE)]
    pub leader_lease: String,
    /// Strikes after which a row failing transiently is dead-lettered: failures of the row alone
    /// while nearly all other Writes to its store succeed (an outage or throttling is never a
    /// strike); more where some of those fail too, until chance would not explain them.
    #[arg(long, env = "FGA_RELAY_MAX_ATTEMPTS", default_value = DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: String,
    /// Rows read at a time to plan Writes.
    #[arg(long, env = "FGA_RELAY_BATCH_SIZE", default_value = DEFAULT_BATCH_SIZE)]
    pub batch_size: String,
    /// Writes in flight at once, at most, each on tuples no other in-flight Write touches, and
    /// one more for a store with none in flight. The relay halves its window on 429, 5xx and
    /// timeouts and grows it back while Writes succeed.
    #[arg(long, env = "FGA_RELAY_MAX_IN_FLIGHT", default_value = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: String,
    /// While rows keep coming, wait this long between passes so that more of them go in each
    /// Write (0 turns it off): less relay and PostgreSQL CPU per row, for up to this much more
    /// latency under a steady stream.
    #[arg(long, env = "FGA_RELAY_LINGER", default_value = DEFAULT_LINGER)]
    pub linger: String,
}

impl DeliveryArgs {
    pub fn settings(&self) -> Result<DeliverySettings, ConfigError> {
        Ok(DeliverySettings {
            sweep_interval: config::parse_positive_duration(
                "--sweep-interval (FGA_RELAY_SWEEP_INTERVAL)",
                or_default(&self.sweep_interval, DEFAULT_SWEEP_INTERVAL),
            )?,
            heartbeat_interval: config::parse_positive_duration(
                "--heartbeat-interval (FGA_RELAY_HEARTBEAT_INTERVAL)",
                or_default(&self.heartbeat_interval, DEFAULT_HEARTBEAT_INTERVAL),
            )?,
            leader_lease: config::parse_positive_duration(
                "--leader-lease (FGA_RELAY_LEADER_LEASE)",
                or_default(&self.leader_lease, DEFAULT_LEADER_LEASE),
            )?,
            max_attempts: config::parse_count(
                "--max-attempts (FGA_RELAY_MAX_ATTEMPTS)",
                or_default(&self.max_attempts, DEFAULT_MAX_ATTEMPTS),
                1,
                1_000_000,
            )? as u32,
            batch_size: config::parse_count(
                "--batch-size (FGA_RELAY_BATCH_SIZE)",
                or_default(&self.batch_size, DEFAULT_BATCH_SIZE),
                1,
                100_000,
            )? as usize,
            max_in_flight: config::parse_count(
                "--max-in-flight (FGA_RELAY_MAX_IN_FLIGHT)",
                or_default(&self.max_in_flight, DEFAULT_MAX_IN_FLIGHT),
                1,
                256,
            )? as usize,
            linger: config::parse_duration_up_to(
                "--linger (FGA_RELAY_LINGER)",
                or_default(&self.linger, DEFAULT_LINGER),
                MAX_LINGER,
            )?,
        })
    }
}
