//! What `reconcile` is asked to do, once its flags are checked (`commands/reconcile.rs`).

use std::time::Duration;

/// How OpenFGA is read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBy {
    /// Each whole store, a page at a time: store size / 100 requests.
    Store,
    /// One Read per compared tuple, several at a time (`READ_CONCURRENCY`).
    Tuple,
}

impl ReadBy {
    /// The word `--read-by` takes for it, as logged.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadBy::Store => "store",
            ReadBy::Tuple => "tuple",
        }
    }
}

/// The validated flags of `fga-relay reconcile`.
#[derive(Debug)]
pub struct Options {
    pub json: bool,
    pub repair: bool,
    pub since: Option<Duration>,
    pub all: bool,
    pub read_by: ReadBy,
    /// Only this store: the id rows name, `""` for the configured store (rows naming none, or
    /// it); `None`: every store.
    pub store: Option<String>,
}
