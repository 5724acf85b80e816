//! `fga-relay drain`: delivers every row pending now, then exits, saying what became of those
//! rows: delivered, dead, still pending. A deploy gate reads its status: 0 only when every one of
//! them was delivered.

use super::failure::Failure;
use super::open::build_relay;
use crate::config;
use crate::liveness::Liveness;
use crate::output;
use crate::relay::{DrainError, LAST_COUNT_GRACE, Relay};
use crate::settings::RelayArgs;
use crate::store::{DeadFilter, DrainOutcome, DrainStart};
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;
use tracing::warn;

/// The exit status of a drain that left no row pending but some dead: not 0, which a deploy
/// gate reads as "delivered", and not 1, which says rows still wait.
pub const SOME_DEAD: u8 = 3;

/// Dead rows a drain names, with their errors (`retry --dead --dry-run` lists them all).
const DEAD_SHOWN: i64 = 5;

#[derive(Args, Debug)]
pub struct Drain {
    #[command(flatten)]
    relay: RelayArgs,
    /// How long to try.
    #[arg(long, default_value = "60s")]
    timeout: String,
    /// Exit 0 even when rows were dead-lettered (not 3): for a deploy gate that lets dead rows
    /// through and watches them elsewhere (the FgaRelayDeadRows alert, `fga-relay status`).
    #[arg(long)]
    allow_dead: bool,
}

impl Drain {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let timeout = config::parse_positive_duration("--timeout", &self.timeout)?;
        let (db, fga, delivery) = self.relay.settings()?;
        let liveness = Arc::new(Liveness::new(crate::liveness::DEFAULT_TIMEOUT));
        let (relay, _) = build_relay(db, fga, delivery, "drain", None, liveness).await?;
        let shutdown = crate::shutdown::on_signals()
            .map_err(|e| anyhow::anyhow!("cannot handle signals: {e}"))?;
        // One timeout for the whole drain, its first count included.
        let began = tokio::time::Instant::now();
        let start = relay
            .drain_count("pending", || relay.store.drain_start(), async {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(timeout) => {}
                }
            })
            .await?;
        let left = relay
            .drain(timeout.saturating_sub(began.elapsed()), shutdown)
            .await;
        // An error the drain ended with may be the first sign of a pooler in transaction mode.
        if let Err(DrainError::Store(crate::store::StoreError::Db(e))) = &left {
            relay.pooler.check(e);
        }
        if let Some(pooler) = relay.pooler.finding() {
            return Err(Failure::Config(pooler));
        }
        let left = left?;
        let outcome = relay
            .drain_count(
                "delivered, dead or left",
                || relay.store.drain_outcome(&start),
                tokio::time::sleep(LAST_COUNT_GRACE),
            )
            .await?;
        report(&relay, &start, &outcome).await?;
        if left > 0 {
            crate::telemetry::error_line(&format!("{left} row(s) still pending after {timeout:?}"));
            Ok(ExitCode::from(1))
        } else if outcome.dead > 0 && !self.allow_dead {
            crate::telemetry::error_line(&format!(
                "{} row(s) dead-lettered: they will not be delivered unless retried \
                 (fga-relay retry --dead --dry-run shows why; --allow-dead exits 0 on them)",
                outcome.dead
            ));
            Ok(ExitCode::from(SOME_DEAD))
        } else {
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One line of counts on stdout, then the newest dead rows with their errors.
async fn report(relay: &Relay, start: &DrainStart, outcome: &DrainOutcome) -> Result<(), Failure> {
    let DrainOutcome {
        delivered,
        dead,
        pending,
    } = *outcome;
    output::line(format_args!(
        "delivered {delivered}, dead {dead}, still pending {pending} (of the rows pending at the start)"
    ));
    if dead == 0 {
        return Ok(());
    }
    // The rows of the range dead since the start, told by their ids as the count tells them.
    let filter = DeadFilter {
        ids: start.ids,
        except: &start.dead,
    };
    // A list that does not come leaves the counts, and the exit status they give, as they are.
    let newest = relay
        .drain_count(
            "dead-lettered",
            || relay.store.dead_newest(filter, DEAD_SHOWN),
            tokio::time::sleep(LAST_COUNT_GRACE),
        )
        .await
        .inspect_err(|e| warn!(error = %e, "cannot list the dead rows"))
        .unwrap_or_default();
    for row in newest {
        output::line(format_args!(
            "  dead row {}: {}",
            row.id,
            row.last_error.as_deref().unwrap_or("(no error recorded)")
        ));
    }
    if dead > DEAD_SHOWN {
        output::line(format_args!("  … and {} more", dead - DEAD_SHOWN));
    }
    output::line(
        "see them all, with what a retry would replay: fga-relay retry --dead --dry-run; \
         send them back: fga-relay retry --dead",
    );
    Ok(())
}
