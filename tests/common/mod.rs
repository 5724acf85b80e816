//! Helpers shared by the integration tests and the benchmark: a real PostgreSQL the tests start
//! themselves, an OpenFGA stand-in that answers as OpenFGA does, and ways to run the relay.

pub mod fga;
pub mod metrics;
pub mod pg;
pub mod pgbouncer;
pub mod proxy;
pub mod relay;
pub mod systemd;
pub mod tls;
