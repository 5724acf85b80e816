//! `fga-relay reconcile`'s own flags, besides where the outbox and OpenFGA are, and what they
//! are once checked.

use crate::config::{self, ConfigError};
use crate::settings::{DbArgs, FgaArgs};
use std::time::Duration;

/// `fga-relay reconcile`'s own flags, besides where the outbox and OpenFGA are.
#[derive(clap::Args, Debug)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub fga: FgaArgs,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Enqueue corrective rows into the outbox for the drift found (the relay delivers them).
    #[arg(long)]
    pub repair: bool,
    /// Check only the tuples of rows created within this long (e.g. 1h, 30m).
    #[arg(long)]
    pub since: Option<String>,
    /// Also list the tuples OpenFGA holds that the outbox does not mention (not drift).
    #[arg(long, conflicts_with = "since")]
    pub all: bool,
    /// How to read OpenFGA: store (every tuple, 100 a page), tuple (one Read per compared
    /// tuple), or auto (tuple with --since, store otherwise).
    #[arg(long, default_value = "auto")]
    pub read_by: String,
}

/// How OpenFGA is read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadBy {
    /// The whole store, a page at a time: store size / 100 requests.
    Store,
    /// One Read per compared tuple, [`READ_CONCURRENCY`] at a time.
    Tuple,
}

/// The validated flags.
#[derive(Debug)]
pub(super) struct Options {
    pub(super) json: bool,
    pub(super) repair: bool,
    pub(super) since: Option<Duration>,
    pub(super) all: bool,
    pub(super) read_by: ReadBy,
}

impl ReconcileArgs {
    pub(super) fn options(&self) -> Result<Options, ConfigError> {
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
        Ok(Options {
            json: self.json,
            repair: self.repair,
            since,
            all: self.all,
            read_by,
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
            r: ReconcileArgs,
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
    }
}
