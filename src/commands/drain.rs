//! `fga-relay drain`: delivers every row pending now, then exits.

use super::failure::Failure;
use super::open::build_relay;
use crate::config;
use crate::liveness::Liveness;
use crate::settings::RelayArgs;
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct Drain {
    #[command(flatten)]
    relay: RelayArgs,
    /// How long to try.
    #[arg(long, default_value = "60s")]
    timeout: String,
}

impl Drain {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let timeout = config::parse_positive_duration("--timeout", &self.timeout)?;
        let (db, fga, delivery) = self.relay.settings()?;
        let liveness = Arc::new(Liveness::new(crate::liveness::DEFAULT_TIMEOUT));
        let (relay, _) = build_relay(db, fga, delivery, "drain", None, liveness).await?;
        let shutdown = crate::shutdown::on_signals()
            .map_err(|e| anyhow::anyhow!("cannot handle signals: {e}"))?;
        let left = relay.drain(timeout, shutdown).await;
        // An error the drain ended with may be the first sign of a pooler in transaction mode.
        if let Err(crate::store::StoreError::Db(e)) = &left {
            relay.pooler.check(e);
        }
        if let Some(pooler) = relay.pooler.finding() {
            return Err(Failure::Config(pooler));
        }
        let left = left?;
        if left == 0 {
            Ok(ExitCode::SUCCESS)
        } else {
            crate::telemetry::error_line(&format!("{left} row(s) still pending after {timeout:?}"));
            Ok(ExitCode::from(1))
        }
    }
}
