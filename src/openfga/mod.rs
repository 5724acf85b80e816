//! The OpenFGA HTTP client: Write and Read (and the store checks), and what every
//! answer means.
//!
//! - `client`: the HTTP client, the Write and Read calls, the deadline of one whole Write.
//! - `auth`: the preshared token, or OIDC client-credentials tokens and their cache.
//! - `store`: the store id, resolved from a name once; the check that it exists, at start and
//!   every few seconds while the relay writes to it (a deleted store still answers Writes).
//! - `target`: the store and model a Write goes to (a row may name them), and what an answer
//!   means when a row names a store or model OpenFGA does not have.
//! - `probe`: what `fga-relay check` asks, changing nothing (answers, credentials, store, model).
//! - `classify`: what each answer means ([`WriteError`], [`FailureClass`]).
//! - `write_body`, `read_page`: what a Write sends and what a Read answers; `guarded_body`: a
//!   Write's body, which leaves only while the relay's lease holds.
//! - `retry_after`: `Retry-After` as seconds or an HTTP date.

mod answer;
mod auth;
mod classify;
mod client;
mod guarded_body;
mod probe;
mod read_page;
mod retry_after;
mod store;
mod target;
#[cfg(test)]
mod tests;
mod write_body;

pub use classify::{FailureClass, WriteError, classify};
pub use client::{FgaClient, Prepared};
pub use probe::{ModelRelations, NO_MODEL, Probe, StoreProbe};
pub use read_page::{MAX_READ_PAGE, ReadPage, ReadTuple};
pub use retry_after::parse_retry_after;
pub use store::PreflightError;
pub use target::Target;
pub use write_body::write_body;
