//! The flags of the commands that run a relay (`run`, `drain`): where the outbox is, how to reach
//! OpenFGA, and how delivery behaves.

use super::{DbArgs, DeliveryArgs, FgaArgs};
use crate::config::{ConfigError, DbSettings, DeliverySettings, FgaSettings};
use clap::Args;

#[derive(Args, Debug)]
pub struct RelayArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub fga: FgaArgs,
    #[command(flatten)]
    pub delivery: DeliveryArgs,
}

impl RelayArgs {
    /// The three settings, checked in that order, then the timings that must hold together
    /// (heartbeat, lease, request timeout).
    pub fn settings(&self) -> Result<(DbSettings, FgaSettings, DeliverySettings), ConfigError> {
        let (db, fga, delivery) = (
            self.db.settings()?,
            self.fga.settings()?,
            self.delivery.settings()?,
        );
        delivery.check_timing(fga.request_timeout)?;
        Ok((db, fga, delivery))
    }

    /// The settings read from files (a `_FILE` or a systemd credential), by name: what a SIGHUP
    /// rereads.
    pub fn secret_files(&self) -> Vec<String> {
        let mut files: Vec<String> = self.db.secret_file().into_iter().collect();
        files.extend(self.fga.secret_files());
        files
    }
}
