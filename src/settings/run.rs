//! The flags of `run` beyond a relay's: the endpoint's address, the summary line, liveness.
//! `check` takes these same flags and checks them the same way, so that what `check` passes
//! `run` accepts.

use super::{
    DEFAULT_HTTP_ADDR, DEFAULT_PENDING_AGE_WARN, DEFAULT_SUMMARY_INTERVAL, RelayArgs, or_default,
};
use crate::config::{self, ConfigError, DbSettings, DeliverySettings, FgaSettings};
use crate::summary::SummarySettings;
use clap::Args;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub relay: RelayArgs,
    /// Address for /livez, /readyz, /healthz and /metrics, or "off".
    #[arg(long, env = "FGA_RELAY_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: String,
    /// Warn when the oldest pending row has waited longer than this (and again once it no
    /// longer has).
    #[arg(long, env = "FGA_RELAY_PENDING_AGE_WARN", default_value = DEFAULT_PENDING_AGE_WARN)]
    pub pending_age_warn: String,
    /// A summary line at info this often while anything happened; an idle line every ten.
    #[arg(long, env = "FGA_RELAY_SUMMARY_INTERVAL", default_value = DEFAULT_SUMMARY_INTERVAL)]
    pub summary_interval: String,
    /// How long the main loop may make no progress before /livez answers 503 and systemd's
    /// watchdog is no longer fed [default: 2m, or twice the longest step the other settings
    /// allow when that is longer].
    #[arg(long, env = "FGA_RELAY_LIVENESS_TIMEOUT")]
    pub liveness_timeout: Option<String>,
}

/// `run`'s settings, checked.
#[derive(Debug)]
pub struct RunSettings {
    pub db: DbSettings,
    pub fga: FgaSettings,
    pub delivery: DeliverySettings,
    /// None: "off".
    pub http_addr: Option<SocketAddr>,
    pub summary: SummarySettings,
    pub liveness_timeout: Duration,
}

impl RunArgs {
    /// Every setting of `run`, checked in the order `run` has always checked them.
    pub fn settings(&self) -> Result<RunSettings, ConfigError> {
        let http_addr = config::parse_http_addr(or_default(&self.http_addr, DEFAULT_HTTP_ADDR))?;
        let (db, fga, delivery) = self.relay.settings()?;
        let summary = SummarySettings {
            interval: config::parse_positive_duration(
                "--summary-interval (FGA_RELAY_SUMMARY_INTERVAL)",
                or_default(&self.summary_interval, DEFAULT_SUMMARY_INTERVAL),
            )?,
            pending_age_warn: config::parse_positive_duration(
                "--pending-age-warn (FGA_RELAY_PENDING_AGE_WARN)",
                or_default(&self.pending_age_warn, DEFAULT_PENDING_AGE_WARN),
            )?,
        };
        let liveness_timeout = config::liveness_timeout(
            self.liveness_timeout.as_deref(),
            crate::liveness::DEFAULT_TIMEOUT,
            &delivery,
            fga.request_timeout,
        )?;
        Ok(RunSettings {
            db,
            fga,
            delivery,
            http_addr,
            summary,
            liveness_timeout,
        })
    }
}
