//! Helpers shared by the integration tests and the benchmark: a real PostgreSQL the tests start
//! themselves, real OpenFGA servers behind a fault proxy, and ways to run the relay (this one,
//! and the relay of 0.2.0 built once from this repository's history).

pub mod fga;
pub mod metrics;
pub mod oidc;
pub mod pg;
pub mod pgbouncer;
pub mod procs;
pub mod proxy;
pub mod relay;
pub mod systemd;
pub mod tls;
pub mod v020;
