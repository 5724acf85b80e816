//! PostgreSQL connections: the pool for claims, marks and commands, and the dedicated
//! connection the relay listens and leads on (never a pooled one: a pool discards notifications
//! and may close or recycle the connection at any time). Where to connect comes from
//! `DATABASE_URL` and libpq's environment and password file ([`conninfo`]); both use TLS as
//! `sslmode` says, with libpq's semantics (see [`tls`]). A pooler in transaction mode in between
//! is found and refused ([`pooler`]); `fga-relay check` asks its questions through [`probe`]; what an
//! error means and the next step, for the errors that do not heal by themselves, is in [`hint`].

pub mod conninfo;
pub mod hint;
pub mod pgpass;
pub mod pooler;
pub mod probe;
pub mod target;
pub mod tls;

use crate::config::{ConfigError, DbSettings};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
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
    /// What its sessions are for, which decides some of their settings (see [`session_setup`]).
    pub sessions: Sessions,
    /// Nothing named a server: the hosts are libpq's default sockets (to say so, see [`hint`]).
    pub hosts_defaulted: bool,
}

/// What a relay's sessions are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sessions {
    /// `run` and `drain`: claims, each Write's transaction, marks, leadership. Its transactions
    /// may stay idle for `idle_in_transaction` at most (see [`claim_idle_limit`]).
    Delivery { idle_in_transaction: Duration },
    /// The other commands, whose reports (`status`, `reconcile`) may read much of the table.
    Commands,
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

/// The TCP connect's timeout where neither `DATABASE_URL` nor `PGCONNECT_TIMEOUT` sets one.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the client waits for the server to acknowledge what it sent, and the server for the
/// client, before the connection counts as dead. TCP keepalives alone stop probing as soon as one
/// side has unacknowledged data (a notification, an answer), and Linux then retries for about 15
/// minutes; with this, a dead peer becomes an error in about 20 s either way.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a command's statement waits for a lock another session holds (a row an operator
/// holds `FOR UPDATE`, a table under `LOCK`) before it fails with 55P03: the commands' sessions
/// run with no statement timeout, and such a wait otherwise lasted, silently, as long as the
/// other session's transaction. Long enough for the relay's own Writes, which hold their rows
/// for a request at most, to end first.
pub const COMMAND_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings every relay session runs with, whatever the server's defaults say.
///
/// - `synchronous_commit` on where the role or server turned it off (a stronger setting, such as
///   `remote_apply`, stays): a row's mark is durable when its COMMIT returns, before any later
///   row on its tuples is sent. With it off, a PostgreSQL crash lost the last marks, the grant's
///   and then the revoke's, and the relay sent the grant again after OpenFGA had applied the
///   revoke: the tuple passed through an earlier state again. The dedicated session records
///   leadership and the lease, which a new leader must not find older than they were.
/// - `idle_in_transaction_session_timeout`: each Write's transaction holds its rows' locks while
///   the Write is in flight, so a server-wide limit meant for applications (say 1 s) would end it
///   before a slow OpenFGA answers, and the Write would be sent again forever. The relay sets its
///   own: long enough for a Write and the one request after it (see [`claim_idle_limit`]),
///   short enough that the locks
///   of a relay that stopped or was cut off are freed by the server.
///   0 (none) for the commands that do not deliver.
/// - `enable_seqscan = off` (delivering sessions): every statement they run finds its rows
///   through an index (the claim index, the primary key). The relay prepares each statement once
///   a connection, and after five runs PostgreSQL may keep a generic plan for it, chosen for the
///   table as it was then. Chosen while the table held a page of rows, that plan is a scan of
///   the whole table, and it stays while the table grows to the millions of delivered rows kept
///   as evidence (until VACUUM or ANALYZE happen to make PostgreSQL plan again): every Write
///   read them all (measured: 99 scans of 100,100 rows to deliver 50 of them). Off, a scan is
///   chosen only where no index can serve. Not for the other commands: their counts and
///   reports read much of the table, which a scan does best.
/// - `jit = off` (delivering sessions): with sequential scans off, a statement that has no
///   other way (the one-row leader table's lease renewal) costs over 10^10 to the planner, far
///   above `jit_above_cost`, and PostgreSQL compiled it to machine code each time: 200 ms to
///   1.3 s for a statement that runs in 0.02 ms, every heartbeat, with the wake lock queued
///   behind it on the same connection (commit → OpenFGA p99 went from 1 ms to 71–154 ms in the
///   benchmark). The relay's statements are short; JIT never pays for them.
/// - `default_transaction_isolation = 'read committed'`: the relay's claims skip and wait on
///   row locks, and a wait for rows reads later commits, as READ COMMITTED does. A role or
///   database defaulting to SERIALIZABLE made every pass beside in-flight Writes fail with
///   serialization errors, and delivery crawl.
/// - `statement_timeout = 0`, and `idle_session_timeout = 0` and `transaction_timeout = 0` where
///   they exist: the relay's statements are short, and waits on its own sessions are bounded by
///   the relay itself (the heartbeat, `idle_in_transaction_session_timeout`); a server-wide limit
///   would end the idle LISTEN session of a standby, and a transaction limit shorter than a
///   Write every Write's transaction, sent again and again.
/// - `lock_timeout` ([`COMMAND_LOCK_TIMEOUT`]) for the commands that do not deliver: with no
///   statement timeout, a lock another session holds stopped them without a word for as long as
///   it was held. Not for delivering sessions, which bound their own waits where they wait
///   (`SET LOCAL lock_timeout`, the heartbeat).
/// - `client_encoding = SQL_ASCII` where the server's encoding is `SQL_ASCII` (text stored as
///   the bytes written, none checked): PostgreSQL checks such text against the client's encoding
///   before it sends it, so one payload that is not UTF-8 failed every read that reached it,
///   and delivery stopped there. Sent as stored, the relay finds it is not UTF-8 itself, and
///   dead-letters that row with the reason.
/// - TCP keepalives and `tcp_user_timeout` from the server's side: a relay that vanished
///   (network cut, not closed) is noticed by PostgreSQL within about 20 s, even when the server
///   has data for it (a notification) that is never acknowledged. (Ignored on Unix sockets,
///   which cannot vanish that way.)
fn session_setup(sessions: Sessions) -> String {
    let (idle_ms, seqscan, jit, lock_wait) = match sessions {
        Sessions::Delivery {
            idle_in_transaction,
        } => (idle_in_transaction.as_millis(), "off", "off", String::new()),
        // Whatever the role or database says.
        Sessions::Commands => (0, "DEFAULT", "DEFAULT", bound_lock_waits_sql()),
    };
    format!(
        "SELECT set_config('synchronous_commit', 'on', false) \
          WHERE current_setting('synchronous_commit') = 'off'; \
         SET idle_in_transaction_session_timeout = {idle_ms}; SET statement_timeout = 0; \
         {lock_wait}\
         SET enable_seqscan = {seqscan}; SET jit = {jit}; \
         SET default_transaction_isolation = 'read committed'; \
         SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 5; \
         SET tcp_keepalives_count = 3; \
         SELECT set_config('tcp_user_timeout', '{}', false) \
          WHERE current_setting('server_version_num')::integer >= 120000; \
         SELECT set_config('idle_session_timeout', '0', false) \
          WHERE current_setting('server_version_num')::integer >= 140000; \
         SELECT set_config('transaction_timeout', '0', false) \
          WHERE current_setting('server_version_num')::integer >= 170000; \
         SELECT set_config('client_encoding', 'SQL_ASCII', false) \
          WHERE current_setting('server_encoding') = 'SQL_ASCII'",
        TCP_USER_TIMEOUT.as_millis()
    )
}

fn bound_lock_waits_sql() -> String {
    format!("SET lock_timeout = {}; ", COMMAND_LOCK_TIMEOUT.as_millis())
}

/// Bounds a command's waits for locks on a connection of its own, which runs without the
/// session settings (`migrate`, `check`): see [`COMMAND_LOCK_TIMEOUT`].
pub async fn bound_lock_waits(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(&bound_lock_waits_sql()).await
}

/// Whether a statement failed because it waited [`COMMAND_LOCK_TIMEOUT`] for a lock in vain.
pub fn is_lock_wait(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// A statement that waited [`COMMAND_LOCK_TIMEOUT`] for a lock in vain, as said (what failed and
/// the database's words), kept apart where errors travel as `anyhow` (`reconcile`'s), so that the
/// command can still name the session that held the lock.
#[derive(Debug, thiserror::Error)]
#[error("{said}")]
pub struct LockWaited {
    pub said: String,
    /// How long it waited: [`COMMAND_LOCK_TIMEOUT`] unless the statement bounds its own wait.
    pub waited: Duration,
}

/// The longest a delivering relay's transaction may stay idle (the server ends it past that):
/// each Write's transaction is idle while the Write runs and, when OpenFGA's answer needs a
/// look, the one request after it (a read-back, a GetStore), each bounded by `request_timeout`
/// (what is asked before a Write is asked before its rows are locked); with a margin.
pub fn claim_idle_limit(request_timeout: Duration) -> Duration {
    request_timeout * 2 + Duration::from_secs(5)
}

/// Resolves `DATABASE_URL` and libpq's environment into a connection config with the relay's
/// defaults: a writable server (after a failover, a standby is skipped), a connect timeout, and
/// client-side keepalives.
pub fn pg_config(settings: &DbSettings, application_name: &str) -> Result<PgConnect, ConfigError> {
    let url = settings.url.as_ref().map(|u| u.expose());
    let info = conninfo::resolve(url, &|k| std::env::var(k).ok(), true)?;
    let mut cfg = info.config;
    let tls_params = info.tls;
    let unix_only = cfg.get_hosts().iter().all(|h| !matches!(h, Host::Tcp(_)));
    let pg_tls = tls::configure(&tls_params, unix_only).map_err(|mut e| {
        if !info.tls_from_env.is_empty() {
            e.setting = format!("{} or {}", e.setting, info.tls_from_env.join(", "));
        }
        e
    })?;
    cfg.ssl_mode(pg_tls.mode);
    if cfg.get_application_name().is_none() {
        cfg.application_name(application_name);
    }
    // Defaults the URL may override. tokio-postgres' own target_session_attrs default is `any`.
    if !info.target_session_attrs_given {
        cfg.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    if !info.connect_timeout_given {
        cfg.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    cfg.keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
    Ok(PgConnect {
        config: cfg,
        tls: pg_tls.connector,
        sessions: Sessions::Commands,
        hosts_defaulted: info.hosts_defaulted,
    })
}

/// Where a relay's new connections go, shared by its pool and its dedicated connection: a
/// SIGHUP replaces it with what `DATABASE_URL_FILE` (or the credential), libpq's password file
/// and the TLS files say then (see `reload`). Connections already open stay as they are.
#[derive(Clone)]
pub struct SharedPg(Arc<RwLock<PgConnect>>);

impl SharedPg {
    pub fn new(pg: PgConnect) -> SharedPg {
        SharedPg(Arc::new(RwLock::new(pg)))
    }

    /// The settings new connections use now.
    pub fn get(&self) -> PgConnect {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// New connections use `pg` from now on.
    pub fn set(&self, pg: PgConnect) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = pg;
    }
}

type Connecting<'a> = Pin<
    Box<
        dyn Future<Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>>
            + Send
            + 'a,
    >,
>;

/// The pool's way to connect: with what [`SharedPg`] says at that moment, not what it said
/// when the pool was made.
struct SharedConnect(SharedPg);

impl deadpool_postgres::Connect for SharedConnect {
    fn connect(&self, _made_with: &Config) -> Connecting<'_> {
        let pg = self.0.get();
        Box::pin(async move {
            let (client, connection) = pg.config.connect(pg.tls).await?;
            let driver = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %describe(&e), "pooled connection failed");
                }
            });
            Ok((client, driver))
        })
    }
}

/// [`pg_config`] for `run` and `drain`: their sessions' settings follow the request timeout (see
/// [`claim_idle_limit`]).
pub fn delivery_pg(
    settings: &DbSettings,
    application_name: &str,
    request_timeout: Duration,
) -> Result<PgConnect, ConfigError> {
    let mut pg = pg_config(settings, application_name)?;
    pg.sessions = Sessions::Delivery {
        idle_in_transaction: claim_idle_limit(request_timeout),
    };
    Ok(pg)
}

/// The pool for short statements: claims, marks and the commands.
pub fn pool(pg: PgConnect, size: usize) -> Pool {
    shared_pool(&SharedPg::new(pg), size)
}

/// [`pool`], whose new connections go where `shared` says at the time.
pub fn shared_pool(shared: &SharedPg, size: usize) -> Pool {
    let pg = shared.get();
    let setup = session_setup(pg.sessions);
    let manager = Manager::from_connect(
        pg.config,
        SharedConnect(shared.clone()),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .post_create(Hook::async_fn(move |client, _| {
            let setup = setup.clone();
            Box::pin(async move {
                client
                    .batch_execute(&setup)
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
pub async fn setup_session(pg: &PgConnect, client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(&session_setup(pg.sessions)).await
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
