//! PostgreSQL connections: the pool for claims, marks and commands, and the dedicated
//! connection the relay listens and leads on (never a pooled one: a pool discards notifications
//! and may close or recycle the connection at any time). Both use TLS as `sslmode` in
//! `DATABASE_URL` says, with libpq's semantics (see [`tls`]).

pub mod target;
pub mod tls;

use crate::config::{ConfigError, DbSettings};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use std::time::Duration;
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The TLS stream of a PostgreSQL connection.
pub type TlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// Where and how to connect: tokio-postgres' settings, and the TLS connector that `sslmode`,
/// `sslrootcert` and friends in `DATABASE_URL` call for (a `tokio_postgres::Config` cannot carry
/// root certificates, so the two travel together).
#[derive(Clone)]
pub struct PgConnect {
    pub config: Config,
    tls: MakeRustlsConnect,
}

impl PgConnect {
    /// The same, under another `application_name` (so operators can tell connections apart in
    /// `pg_stat_activity`).
    pub fn named(&self, application_name: &str) -> PgConnect {
        let mut c = self.clone();
        c.config.application_name(application_name);
        c
    }

    /// The `application_name` connections carry.
    pub fn application_name(&self) -> &str {
        self.config.get_application_name().unwrap_or("fga-relay")
    }
}

/// Settings every relay session runs with.
///
/// - `synchronous_commit = off`: marking rows delivered need not wait for the WAL flush. If
///   PostgreSQL crashes, the last few hundred milliseconds of marks may be lost, and those rows
///   are delivered again: harmless, deliveries are idempotent, and it spares a disk flush per
///   batch.
/// - TCP keepalives from the server's side: a relay that vanished (network cut, not closed) is
///   noticed by PostgreSQL within about 25 s instead of 2 hours, which releases its leadership
///   and its row locks. (Ignored on Unix sockets, which cannot vanish that way.)
const SESSION_SETUP: &str = "SET synchronous_commit = off; \
    SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3";

/// Parses `DATABASE_URL` into a connection config with the relay's defaults: a writable server
/// (after a failover, a standby is skipped), a connect timeout, and client-side keepalives.
pub fn pg_config(settings: &DbSettings, application_name: &str) -> Result<PgConnect, ConfigError> {
    let (url, tls_params) = tls::split(settings.url.expose().trim());
    let url = url.as_str();
    let mut cfg: Config = url.parse().map_err(|e| {
        ConfigError::new(
            "--database-url (DATABASE_URL)",
            format!("not a PostgreSQL connection string ({e})"),
        )
    })?;
    if cfg.get_hosts().is_empty() {
        return Err(ConfigError::new(
            "--database-url (DATABASE_URL)",
            "names no host",
        ));
    }
    let unix_only = cfg.get_hosts().iter().all(|h| !matches!(h, Host::Tcp(_)));
    let pg_tls = tls::configure(&tls_params, unix_only)?;
    cfg.ssl_mode(pg_tls.mode);
    if cfg.get_application_name().is_none() {
        cfg.application_name(application_name);
    }
    // Defaults the URL may override. tokio-postgres' own target_session_attrs default is `any`;
    // a URL that says otherwise wins because it is parsed into `cfg` before we look.
    if !url.contains("target_session_attrs") {
        cfg.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(Duration::from_secs(5));
    }
    cfg.keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3);
    Ok(PgConnect {
        config: cfg,
        tls: pg_tls.connector,
    })
}

/// The pool for short statements: claims, marks and the commands.
pub fn pool(pg: PgConnect, size: usize) -> Pool {
    let manager = Manager::from_config(
        pg.config,
        pg.tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .batch_execute(SESSION_SETUP)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .build()
        .expect("a pool with a runtime and timeouts always builds")
}

/// A dedicated connection. The caller drives `connection` itself (to read notifications).
pub async fn connect_dedicated(
    pg: &PgConnect,
) -> Result<(Client, tokio_postgres::Connection<Socket, TlsStream>), tokio_postgres::Error> {
    pg.config.connect(pg.tls.clone()).await
}

/// Runs the relay's session settings on a dedicated connection.
pub async fn setup_session(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(SESSION_SETUP).await
}

/// A short description of a database error with its SQLSTATE, for logs and `last_error`.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => {
            let mut out = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                out.push_str(": ");
                out.push_str(&s.to_string());
                source = s.source();
            }
            out
        }
    }
}
