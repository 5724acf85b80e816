//! Black-box tests of the `fga-relay` binary against a real PostgreSQL (started by the tests)
//! and a real OpenFGA behind a fault proxy.

#[path = "../common/mod.rs"]
mod common;

mod adopted;
mod check;
mod commands;
mod delivery;
mod deploy;
mod failover;
mod faults;
mod lanes;
mod leadership;
mod libpq;
mod listen;
mod many_stores;
mod messages;
mod observability;
mod openfga;
mod order;
mod payloads;
mod pooler;
mod probes;
mod reconcile;
mod secret_files;
mod secrets;
mod security;
mod sessions;
mod settings;
mod signals;
mod stores;
mod stream;
mod summary;
mod upgrade;
mod version;
mod wait;
mod writers;
