//! `fga-relay run`: the relay as a daemon, with /livez, /readyz, /healthz and /metrics, until
//! SIGTERM/SIGINT.

use super::failure::Failure;
use super::open::build_relay;
use crate::config::{self, ConfigError};
use crate::http::{Endpoint, Served};
use crate::liveness::Liveness;
use crate::reload::Reload;
use crate::settings::{DEFAULT_HTTP_ADDR, RelayArgs, or_default};
use crate::summary::SummarySettings;
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

#[derive(Args, Debug)]
pub struct Run {
    #[command(flatten)]
    relay: RelayArgs,
    /// Address for /livez, /readyz, /healthz and /metrics, or "off".
    #[arg(long, env = "FGA_RELAY_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
    http_addr: String,
    /// Warn when the oldest pending row has waited longer than this (and again once it no
    /// longer has).
    #[arg(long, env = "FGA_RELAY_PENDING_AGE_WARN", default_value = DEFAULT_PENDING_AGE_WARN)]
    pending_age_warn: String,
    /// A summary line at info this often while anything happened; an idle line every ten.
    #[arg(long, env = "FGA_RELAY_SUMMARY_INTERVAL", default_value = DEFAULT_SUMMARY_INTERVAL)]
    summary_interval: String,
    /// How long the main loop may make no progress before /livez answers 503 and systemd's
    /// watchdog is no longer fed [default: 2m, or twice the longest step the other settings
    /// allow when that is longer].
    #[arg(long, env = "FGA_RELAY_LIVENESS_TIMEOUT")]
    liveness_timeout: Option<String>,
}

const DEFAULT_PENDING_AGE_WARN: &str = "2m";
const DEFAULT_SUMMARY_INTERVAL: &str = "1m";

impl Run {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
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
        let shutdown = crate::shutdown::on_signals()
            .map_err(|e| anyhow::anyhow!("cannot handle signals: {e}"))?;
        // Taken now, not once the relay is built: until then, SIGHUP's default would end it.
        let hangup = signal(SignalKind::hangup())
            .map_err(|e| anyhow::anyhow!("cannot handle signals: {e}"))?;
        let systemd = Arc::new(crate::systemd::Notifier::from_env());
        let liveness = Arc::new(Liveness::new(liveness_timeout));
        tokio::spawn(crate::liveness::watch(liveness.clone(), systemd.clone()));
        // Served before PostgreSQL is reached (a relay waiting for it is live, and not ready),
        // and through the drain after SIGTERM, until the process exits.
        let endpoint = Arc::new(Endpoint::new(liveness.clone()));
        if let Some(addr) = http_addr {
            let (bound, _task) = crate::http::serve(addr, endpoint.clone(), Default::default())
                .await
                .map_err(|e| {
                    ConfigError::new(
                        "--http-addr (FGA_RELAY_HTTP_ADDR)",
                        format!("cannot listen on {addr}: {e}"),
                    )
                })?;
            info!(addr = %bound, "serving /livez, /readyz, /healthz and /metrics");
        }
        let (mut relay, registry) =
            build_relay(db, fga, delivery, "run", Some(&shutdown), liveness).await?;
        relay.systemd = systemd;
        crate::reload::on_hangup(
            hangup,
            Reload {
                args: self.relay,
                client: relay.client.clone(),
                pg: relay.pg.clone(),
                application_name: "fga-relay run".to_owned(),
                systemd: relay.systemd.clone(),
                url: relay.db.url.clone(),
            },
        );
        endpoint.serve_relay(Served {
            registry,
            metrics: relay.metrics.clone(),
            store: relay.store.clone(),
            client: relay.client.clone(),
        });
        tokio::spawn(crate::summary::run(
            relay.metrics.clone(),
            relay.store.clone(),
            summary,
            shutdown.clone(),
        ));
        let health = endpoint.clone();
        relay
            .run(shutdown, move |session| health.set_listening(session))
            .await;
        if let Some(pooler) = relay.pooler.finding() {
            return Err(Failure::Config(pooler));
        }
        Ok(ExitCode::SUCCESS)
    }
}
