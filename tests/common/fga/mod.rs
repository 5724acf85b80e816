//! OpenFGA for the relay's tests and its benchmark: a real OpenFGA server, and a fault proxy in
//! front of it.
//!
//! The server is OpenFGA itself, built once per version with `go install` into a cache outside
//! the repository (`openfga`): the newest ([`MODERN`]) and the last before 1.10 ([`LEGACY`]).
//! One server runs per test binary and configuration, on the memory datastore; each test gets a
//! store of its own, with its model ([`Model`]), so tests never see each other's tuples.
//!
//! The relay talks to the proxy (`proxy`), never to the server directly. The proxy passes every
//! request on, records each Write ([`Fga::writes`]), and injects into Writes, or into ListStores
//! ([`FaultRule::on_list_stores`]), the faults a real server cannot be made to produce on demand
//! ([`Fault`]); it can also stop listening
//! ([`Fga::set_refusing`]), as a server that went down. What OpenFGA applied, and in which
//! order, is read from the server itself: Read for [`Fga::tuples`] and [`Fga::has`], ReadChanges
//! for [`Fga::changelog`] (`api`).
//!
//! Where things are: `handle`: [`Fga`] as a test holds it; `openfga`: building and running the
//! servers; `api`: the harness's own calls to a server; `proxy` and `faults`: the fault proxy;
//! `server`: the proxy's listening and connections; `records`: what a test reads back.

// Shared by the tests and the benchmark, which each use a part of it.
#![allow(dead_code, unused_imports)]

mod api;
mod faults;
mod handle;
mod model;
mod openfga;
mod proxy;
mod records;
mod server;

pub use faults::{Fault, FaultRule, Latency, RandomFaults, Route};
pub use handle::{DEFAULT_MAX_TUPLES_PER_WRITE, Fga, FgaBuilder};
pub use model::Model;
pub use openfga::{LEGACY, MODERN};
pub use records::{Change, Op, StoredTuple, WriteRecord};
