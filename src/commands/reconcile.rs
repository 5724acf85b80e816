//! `fga-relay reconcile`: its flags, checked into [`Options`], and the exit status of the check
//! (the check itself is [`crate::reconcile`]).

use super::failure::Failure;
use super::lock_wait;
use crate::config::{self, ConfigError};
use crate::db::LockWaited;
use crate::payload::store_filter;
use crate::reconcile::{self, Options, ReadBy, Verdict};
use crate::settings::{DbArgs, FgaArgs};
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct Reconcile {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    fga: FgaArgs,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Enqueue corrective rows into the outbox for the drift found (the relay delivers them).
    #[arg(long)]
    repair: bool,
    /// Check only the tuples of rows created within this long (e.g. 1h, 30m).
    #[arg(long)]
    since: Option<String>,
    /// Also list the tuples OpenFGA holds that the outbox does not mention (not drift).
    #[arg(long, conflicts_with = "since")]
    all: bool,
    /// Only this store: the id rows name (the configured store's id also takes the rows
    /// naming none), or `none` for the rows naming none. Default: every store, each against
    /// its own Read.
    #[arg(long)]
    store: Option<String>,
    /// How to read OpenFGA: store (every tuple, 100 a page), tuple (one Read per compared
    /// tuple), or auto (tuple with --since, store otherwise) [possible values: auto, store,
    /// tuple].
    #[arg(long, default_value = "auto")]
    read_by: String,
}

impl Reconcile {
    fn options(&self) -> Result<Options, ConfigError> {
        let since = self
            .since
            .as_deref()
            .map(|s| config::parse_positive_duration("--since", s))
            .transpose()?;
        let read_by = match (self.read_by.trim(), since) {
            ("store", _) | ("auto", None) => ReadBy::Store,
            ("tuple", _) | ("auto", Some(_)) => ReadBy::Tuple,
            (other, _) => {
                return Err(ConfigError::new(
                    "--read-by",
                    format!("{other:?} is not one of auto, store, tuple"),
                ));
            }
        };
        if self.all && read_by == ReadBy::Tuple {
            return Err(ConfigError::new(
                "--all",
                "lists what the whole store holds: it needs --read-by store",
            ));
        }
        let store = self
            .store
            .as_deref()
            .map(store_filter)
            .transpose()
            .map_err(|e| ConfigError::new("--store", e))?;
        Ok(Options {
            json: self.json,
            repair: self.repair,
            since,
            all: self.all,
            read_by,
            store,
        })
    }

    /// Exit status 0 when OpenFGA is in step with the outbox, 1 on drift (also when `--repair`
    /// enqueued its corrections), 2 on error (a lock waited for in vain included, said with the
    /// session that held it, as the other commands say it).
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let checked = async {
            let db = self.db.settings()?;
            let fga = self.fga.settings()?;
            let opts = self.options()?;
            let run = async {
                reconcile::run(&db, &fga, &opts).await.map_err(|e| {
                    match e.downcast::<LockWaited>() {
                        Ok(waited) => Failure::LockWait(waited.said, waited.waited),
                        Err(e) => Failure::Other(e),
                    }
                })
            };
            lock_wait::bounded("reconcile", &db, run).await
        };
        Ok(match checked.await {
            Ok(Verdict::InStep) => ExitCode::SUCCESS,
            Ok(Verdict::Drift) => ExitCode::from(1),
            Err(e) => {
                crate::telemetry::error_line(&e.to_string());
                ExitCode::from(2)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_by_follows_since_unless_told() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            r: Reconcile,
        }
        let opts = |args: &[&str]| {
            let mut all = vec!["t"];
            all.extend_from_slice(args);
            T::parse_from(all).r.options()
        };
        assert_eq!(opts(&[]).unwrap().read_by, ReadBy::Store);
        assert_eq!(opts(&["--since", "1h"]).unwrap().read_by, ReadBy::Tuple);
        assert_eq!(
            opts(&["--since", "1h", "--read-by", "store"])
                .unwrap()
                .read_by,
            ReadBy::Store
        );
        assert!(opts(&["--read-by", "object"]).is_err());
        assert!(opts(&["--all", "--read-by", "tuple"]).is_err());
        assert!(opts(&["--since", "soon"]).is_err());
        assert_eq!(
            opts(&["--store", "none"]).unwrap().store.as_deref(),
            Some("")
        );
        assert!(opts(&["--store", "tenant-a"]).is_err());
    }
}
