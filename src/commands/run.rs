//! `fga-relay run`: the relay as a daemon, with /livez, /readyz, /healthz and /metrics, until
//! SIGTERM/SIGINT.

use super::failure::Failure;
use super::open::build_relay;
use crate::config::ConfigError;
use crate::http::{Endpoint, Served};
use crate::liveness::Liveness;
use crate::reload::Reload;
use crate::settings::{RunArgs, RunSettings};
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

#[derive(Args, Debug)]
pub struct Run {
    #[command(flatten)]
    run: RunArgs,
}

impl Run {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let RunSettings {
            db,
            fga,
            delivery,
            http_addr,
            summary,
            liveness_timeout,
        } = self.run.settings()?;
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
                args: self.run.relay,
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
