//! The commands, one a file, in the shape of mini-redis's `cmd/`: each holds its flags (a clap
//! `Args` struct, its help text the subcommand's in `cli.rs`) and `execute`, which does the work
//! and says the exit status.
//!
//! Exit status: 0 success; 1 failure (for `drain`: rows still pending at the timeout; for
//! `reconcile`: drift; for `check`: a check failed; for `migrate --check`: it would change
//! something; for `retry`: an id given was left as it is); 2 bad settings, with one line naming
//! the setting; 3 for `drain`: rows were dead-lettered and none is left pending.

mod check;
mod drain;
mod failure;
mod lock_wait;
mod migrate;
mod open;
mod prune;
mod reconcile;
mod retry;
mod run;
mod sql;
mod status;

pub use check::Check;
pub use drain::Drain;
pub use failure::Failure;
pub use migrate::Migrate;
pub use prune::Prune;
pub use reconcile::Reconcile;
pub use retry::Retry;
pub use run::Run;
pub use sql::Sql;
pub use status::Status;

/// The relay's configured store as a command takes it (`--store-id`, `FGA_STORE_ID`): an empty
/// value is unset, as for every setting.
fn configured_store(given: Option<String>) -> Option<String> {
    given
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}
