//! The command line: flags with environment fallbacks (the OpenFGA ones named as the `fga` CLI
//! names them), turned into validated settings, and the commands.
//!
//! Exit status: 0 success; 1 failure (for `drain`: rows still pending at the timeout); 2 bad
//! settings, with one line naming the setting.

use crate::config::{
    self, Auth, ConfigError, DbSettings, DeliverySettings, FgaSettings, LogFormat, Secret,
    StoreRef, TableName,
};
use crate::http::Endpoint;
use crate::metrics::Metrics;
use crate::openfga::{FgaClient, PreflightError};
use crate::relay::Relay;
use crate::schema::{self, SchemaProblem};
use crate::store::Store;
use clap::{Args, Parser, Subcommand};
use prometheus_client::registry::Registry;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Defaults, shown by `--help` and used when a variable is set but empty (`FGA_RELAY_SWEEP_INTERVAL=`
/// in an env file means "the default", as it does for most tools).
const DEFAULT_API_URL: &str = "http://localhost:8080";
const DEFAULT_REQUEST_TIMEOUT: &str = "10s";
const DEFAULT_MAX_TUPLES: &str = "100";
const DEFAULT_SWEEP_INTERVAL: &str = "30s";
const DEFAULT_HEARTBEAT_INTERVAL: &str = "5s";
const DEFAULT_LEADER_LEASE: &str = "15s";
const DEFAULT_MAX_ATTEMPTS: &str = "10";
const DEFAULT_BATCH_SIZE: &str = "500";
const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9464";
const DEFAULT_LOG_FORMAT: &str = "text";
const DEFAULT_TABLE: &str = "fga_outbox";

/// The value, or the default when it is empty.
fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.trim().is_empty() {
        default
    } else {
        value
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "fga-relay",
    version,
    about = "Delivers a PostgreSQL outbox (fga_outbox) to OpenFGA's Write API, at least once, in order."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format: text, or json for one JSON object a line.
    #[arg(
        long,
        env = "FGA_RELAY_LOG_FORMAT",
        default_value = DEFAULT_LOG_FORMAT,
        global = true
    )]
    pub log_format: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the outbox schema or upgrade it, keeping every row (idempotent).
    Migrate(DbArgs),
    /// Print the schema SQL, for your own migration tool.
    Sql {
        /// The outbox table's name.
        #[arg(long = "table", env = "FGA_OUTBOX_TABLE", default_value = DEFAULT_TABLE)]
        table: String,
        /// Print the least-privilege roles instead (a writer role and a relay role), to run
        /// after `migrate`.
        #[arg(long)]
        roles: bool,
    },
    /// Run the relay: LISTEN, deliver, sweep, serve /healthz and /metrics, until SIGTERM/SIGINT.
    Run {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        fga: FgaArgs,
        #[command(flatten)]
        delivery: DeliveryArgs,
        /// Address for /healthz and /metrics, or "off".
        #[arg(long, env = "FGA_RELAY_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
        http_addr: String,
    },
    /// Deliver every row pending now, then exit: 0 when none is left pending, 1 when some are
    /// at the timeout.
    Drain {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        fga: FgaArgs,
        #[command(flatten)]
        delivery: DeliveryArgs,
        /// How long to try.
        #[arg(long, default_value = "60s")]
        timeout: String,
    },
    /// Pending, dead and delivered counts, and the age of the oldest pending row.
    Status {
        #[command(flatten)]
        db: DbArgs,
        /// Print JSON: {"pending","dead","delivered","oldest_pending_age_seconds"}.
        #[arg(long)]
        json: bool,
    },
    /// Send dead rows back to pending.
    Retry {
        #[command(flatten)]
        db: DbArgs,
        /// Every dead row.
        #[arg(long, conflicts_with = "ids")]
        dead: bool,
        /// These rows (ids).
        #[arg(required_unless_present = "dead")]
        ids: Vec<i64>,
    },
    /// Delete delivered rows older than a duration, in small batches. Never touches pending or
    /// dead rows.
    Prune {
        #[command(flatten)]
        db: DbArgs,
        /// E.g. 30d, 12h.
        #[arg(long)]
        older_than: String,
    },
    /// Compare what the delivered rows say OpenFGA must hold with what it holds: exit 0 in
    /// step, 1 on drift, 2 on error. --repair enqueues the corrections.
    Reconcile(crate::reconcile::ReconcileArgs),
}

/// Where the outbox is.
#[derive(Args, Debug)]
pub struct DbArgs {
    /// PostgreSQL connection string (URL or key=value); sslmode as usual.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// The outbox table's name (also the NOTIFY channel).
    #[arg(long = "table", env = "FGA_OUTBOX_TABLE", default_value = DEFAULT_TABLE)]
    pub table: String,
}

/// How to reach OpenFGA.
#[derive(Args, Debug)]
pub struct FgaArgs {
    /// OpenFGA's HTTP API.
    #[arg(long, env = "FGA_API_URL", default_value = DEFAULT_API_URL)]
    pub api_url: String,
    /// The store to write to.
    #[arg(long, env = "FGA_STORE_ID")]
    pub store_id: Option<String>,
    /// The store to write to, by name (resolved through ListStores), instead of --store-id.
    #[arg(long, env = "FGA_STORE_NAME")]
    pub store_name: Option<String>,
    /// The authorization model (default: the store's latest).
    #[arg(long, env = "FGA_MODEL_ID")]
    pub model_id: Option<String>,
    /// Preshared key, sent as a Bearer token.
    #[arg(long, env = "FGA_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// OIDC client credentials: client id.
    #[arg(long, env = "FGA_CLIENT_ID")]
    pub client_id: Option<String>,
    /// OIDC client credentials: client secret.
    #[arg(long, env = "FGA_CLIENT_SECRET", hide_env_values = true)]
    pub client_secret: Option<String>,
    /// OIDC token issuer (host or URL; the token endpoint is /oauth/token unless a path is given).
    #[arg(long, env = "FGA_API_TOKEN_ISSUER")]
    pub api_token_issuer: Option<String>,
    /// OIDC audience.
    #[arg(long, env = "FGA_API_AUDIENCE")]
    pub api_audience: Option<String>,
    /// One OpenFGA request's limit; past it the attempt counts as a transient failure.
    #[arg(long, env = "FGA_RELAY_REQUEST_TIMEOUT", default_value = DEFAULT_REQUEST_TIMEOUT)]
    pub request_timeout: String,
    /// The server's limit of tuples per Write.
    #[arg(long, env = "FGA_MAX_TUPLES_PER_WRITE", default_value = DEFAULT_MAX_TUPLES)]
    pub max_tuples_per_write: String,
    /// PEM file of CA certificates to trust for https, besides the system's.
    #[arg(long, env = "FGA_CA_FILE")]
    pub ca_file: Option<String>,
}

/// How the delivery loop behaves.
#[derive(Args, Debug)]
pub struct DeliveryArgs {
    /// Drain this often even without a notification.
    #[arg(long, env = "FGA_RELAY_SWEEP_INTERVAL", default_value = DEFAULT_SWEEP_INTERVAL)]
    pub sweep_interval: String,
    /// Check the dedicated connection this often; a silent connection is dead after two.
    #[arg(long, env = "FGA_RELAY_HEARTBEAT_INTERVAL", default_value = DEFAULT_HEARTBEAT_INTERVAL)]
    pub heartbeat_interval: String,
    /// How long leadership lasts unrenewed (renewed every heartbeat): past it, the session
    /// holding it is ended by another relay. At least three heartbeats, longer than the request
    /// timeout.
    #[arg(long, env = "FGA_RELAY_LEADER_LEASE", default_value = DEFAULT_LEADER_LEASE)]
    pub leader_lease: String,
    /// Attempts, while other rows are delivered, after which a row failing transiently is
    /// dead-lettered.
    #[arg(long, env = "FGA_RELAY_MAX_ATTEMPTS", default_value = DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: String,
    /// Rows claimed at a time.
    #[arg(long, env = "FGA_RELAY_BATCH_SIZE", default_value = DEFAULT_BATCH_SIZE)]
    pub batch_size: String,
}

impl DbArgs {
    pub fn settings(&self) -> Result<DbSettings, ConfigError> {
        let url = self
            .database_url
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| ConfigError::new("--database-url (DATABASE_URL)", "is required"))?;
        Ok(DbSettings {
            url: Secret::new(url),
            table: TableName::parse(or_default(&self.table, DEFAULT_TABLE))?,
        })
    }
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl FgaArgs {
    pub fn settings(&self) -> Result<FgaSettings, ConfigError> {
        let api_url = config::parse_http_url(
            "--api-url (FGA_API_URL)",
            or_default(&self.api_url, DEFAULT_API_URL),
        )?;
        let store = match (non_empty(&self.store_id), non_empty(&self.store_name)) {
            (Some(id), None) => StoreRef::Id(config::check_ulid("--store-id (FGA_STORE_ID)", id)?),
            (None, Some(name)) => StoreRef::Name(name.to_owned()),
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "--store-id (FGA_STORE_ID)",
                    "give either a store id or a store name (FGA_STORE_NAME), not both",
                ));
            }
            (None, None) => {
                return Err(ConfigError::new(
                    "--store-id (FGA_STORE_ID)",
                    "is required (or --store-name / FGA_STORE_NAME)",
                ));
            }
        };
        let model_id = non_empty(&self.model_id)
            .map(|m| config::check_ulid("--model-id (FGA_MODEL_ID)", m))
            .transpose()?;
        let auth = match (non_empty(&self.api_token), non_empty(&self.client_id)) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "--api-token (FGA_API_TOKEN)",
                    "give either a preshared key or OIDC client credentials (FGA_CLIENT_ID), not both",
                ));
            }
            (Some(token), None) => Auth::ApiToken(Secret::new(token)),
            (None, Some(client_id)) => {
                let secret = non_empty(&self.client_secret).ok_or_else(|| {
                    ConfigError::new(
                        "--client-secret (FGA_CLIENT_SECRET)",
                        "is required with FGA_CLIENT_ID",
                    )
                })?;
                let issuer = non_empty(&self.api_token_issuer).ok_or_else(|| {
                    ConfigError::new(
                        "--api-token-issuer (FGA_API_TOKEN_ISSUER)",
                        "is required with FGA_CLIENT_ID",
                    )
                })?;
                Auth::ClientCredentials {
                    client_id: client_id.to_owned(),
                    client_secret: Secret::new(secret),
                    token_issuer: token_endpoint(issuer)?,
                    audience: non_empty(&self.api_audience).map(str::to_owned),
                }
            }
            (None, None) => Auth::None,
        };
        let request_timeout = config::parse_positive_duration(
            "--request-timeout (FGA_RELAY_REQUEST_TIMEOUT)",
            or_default(&self.request_timeout, DEFAULT_REQUEST_TIMEOUT),
        )?;
        let max_tuples_per_write = config::parse_count(
            "--max-tuples-per-write (FGA_MAX_TUPLES_PER_WRITE)",
            or_default(&self.max_tuples_per_write, DEFAULT_MAX_TUPLES),
            1,
            100_000,
        )? as usize;
        let ca_file = non_empty(&self.ca_file).map(PathBuf::from);
        if let Some(path) = &ca_file
            && !path.is_file()
        {
            return Err(ConfigError::new(
                "--ca-file (FGA_CA_FILE)",
                format!("{} is not a readable file", path.display()),
            ));
        }
        Ok(FgaSettings {
            api_url,
            store,
            model_id,
            auth,
            request_timeout,
            max_tuples_per_write,
            ca_file,
        })
    }
}

/// The token endpoint for `FGA_API_TOKEN_ISSUER`, as the OpenFGA SDKs build it: a bare host gets
/// `https://` and `/oauth/token`; a URL without a path gets `/oauth/token`.
fn token_endpoint(issuer: &str) -> Result<reqwest::Url, ConfigError> {
    let setting = "--api-token-issuer (FGA_API_TOKEN_ISSUER)";
    let with_scheme = if issuer.contains("://") {
        issuer.to_owned()
    } else {
        format!("https://{issuer}")
    };
    let mut url = config::parse_http_url(setting, &with_scheme)?;
    if url.path() == "/" || url.path().is_empty() {
        url.set_path("/oauth/token");
    }
    Ok(url)
}

impl DeliveryArgs {
    pub fn settings(&self) -> Result<DeliverySettings, ConfigError> {
        Ok(DeliverySettings {
            sweep_interval: config::parse_positive_duration(
                "--sweep-interval (FGA_RELAY_SWEEP_INTERVAL)",
                or_default(&self.sweep_interval, DEFAULT_SWEEP_INTERVAL),
            )?,
            heartbeat_interval: config::parse_positive_duration(
                "--heartbeat-interval (FGA_RELAY_HEARTBEAT_INTERVAL)",
                or_default(&self.heartbeat_interval, DEFAULT_HEARTBEAT_INTERVAL),
            )?,
            leader_lease: config::parse_positive_duration(
                "--leader-lease (FGA_RELAY_LEADER_LEASE)",
                or_default(&self.leader_lease, DEFAULT_LEADER_LEASE),
            )?,
            max_attempts: config::parse_count(
                "--max-attempts (FGA_RELAY_MAX_ATTEMPTS)",
                or_default(&self.max_attempts, DEFAULT_MAX_ATTEMPTS),
                1,
                1_000_000,
            )? as u32,
            batch_size: config::parse_count(
                "--batch-size (FGA_RELAY_BATCH_SIZE)",
                or_default(&self.batch_size, DEFAULT_BATCH_SIZE),
                1,
                100_000,
            )? as usize,
        })
    }
}

/// How a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad settings or a missing schema: exit status 2.
    #[error("{0}")]
    Config(String),
    /// Anything else: exit status 1.
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(e.to_string())
    }
}

impl From<SchemaProblem> for Failure {
    fn from(e: SchemaProblem) -> Self {
        match e {
            SchemaProblem::Db(e) => Failure::Other(anyhow::anyhow!(crate::db::describe(&e))),
            other => Failure::Config(other.to_string()),
        }
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(e: crate::store::StoreError) -> Self {
        Failure::Other(e.into())
    }
}

/// The binary's entry point.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let format = match LogFormat::parse(or_default(&cli.log_format, DEFAULT_LOG_FORMAT)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("fga-relay: {e}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init(format);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fga-relay: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(Failure::Config(msg)) => {
            eprintln!("fga-relay: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("fga-relay: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, Failure> {
    match command {
        Command::Sql { table, roles } => {
            let table = TableName::parse(or_default(&table, DEFAULT_TABLE))?;
            if roles {
                print!("{}", schema::render(ROLES_SQL, &table));
            } else {
                print!("{}", schema::full_sql(&table));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate(db) => {
            let db = db.settings()?;
            let cfg = crate::db::pg_config(&db, "fga-relay migrate")?;
            let (mut client, conn) = crate::db::connect_dedicated(&cfg)
                .await
                .map_err(|e| anyhow::anyhow!("cannot connect: {}", crate::db::describe(&e)))?;
            let driver = tokio::spawn(conn);
            schema::migrate(&mut client, &db.table)
                .await
                .map_err(|e| anyhow::anyhow!("migrate failed: {}", crate::db::describe(&e)))?;
            drop(client);
            let _ = driver.await;
            info!(table = %db.table, "schema is up to date");
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { db, json } => {
            let store = open_store(&db.settings()?, "fga-relay status").await?;
            let s = store.status().await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&s).expect("status always serialises")
                );
            } else {
                println!("pending    {}", s.pending);
                println!("dead       {}", s.dead);
                println!("delivered  {}", s.delivered);
                match s.oldest_pending_age_seconds {
                    Some(age) => println!("oldest pending row: {age:.1}s old"),
                    None => println!("oldest pending row: none"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Retry { db, dead, ids } => {
            let store = open_store(&db.settings()?, "fga-relay retry").await?;
            let sent = store.retry((!dead).then_some(ids.as_slice())).await?;
            for (id, last_error) in &sent {
                info!(
                    id,
                    last_error = last_error.as_deref().unwrap_or(""),
                    "dead row sent back to pending"
                );
            }
            if !dead {
                for id in ids.iter().filter(|id| !sent.iter().any(|(s, _)| s == *id)) {
                    warn!(id, "not a dead row: left as it is");
                }
            }
            println!("{} row(s) sent back to pending", sent.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Prune { db, older_than } => {
            let age = config::parse_duration("--older-than", &older_than)?;
            let cutoff = std::time::SystemTime::now()
                .checked_sub(age)
                .ok_or_else(|| ConfigError::new("--older-than", "is too long"))?;
            let store = open_store(&db.settings()?, "fga-relay prune").await?;
            let mut total = 0u64;
            loop {
                let n = store.prune_batch(cutoff, PRUNE_BATCH).await?;
                total += n;
                if n < PRUNE_BATCH as u64 {
                    break;
                }
            }
            info!(rows = total, older_than = %older_than, "pruned delivered rows");
            println!("{total} delivered row(s) deleted");
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            db,
            fga,
            delivery,
            http_addr,
        } => {
            let http_addr = config::parse_http_addr(or_default(&http_addr, DEFAULT_HTTP_ADDR))?;
            let (db, fga, delivery) = (db.settings()?, fga.settings()?, delivery.settings()?);
            let shutdown = crate::shutdown::on_signals()
                .map_err(|e| anyhow::anyhow!("cannot handle signals: {e}"))?;
            let (mut relay, registry) =
                build_relay(db, fga, delivery, "run", Some(&shutdown)).await?;
            relay.systemd = Arc::new(crate::systemd::Notifier::from_env());
            let endpoint = Arc::new(Endpoint {
                registry,
                metrics: relay.metrics.clone(),
                healthy: false.into(),
                store: relay.store.clone(),
            });
            if let Some(addr) = http_addr {
                let (bound, _task) = crate::http::serve(addr, endpoint.clone(), shutdown.clone())
                    .await
                    .map_err(|e| {
                        ConfigError::new(
                            "--http-addr (FGA_RELAY_HTTP_ADDR)",
                            format!("cannot listen on {addr}: {e}"),
                        )
                    })?;
                info!(addr = %bound, "serving /healthz and /metrics");
            }
            let health = endpoint.clone();
            relay
                .run(shutdown, move |up| {
                    health.healthy.store(up, Ordering::Relaxed);
                })
                .await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Drain {
            db,
            fga,
            delivery,
            timeout,
        } => {
            let timeout = config::parse_positive_duration("--timeout", &timeout)?;
            let (relay, _) = build_relay(
                db.settings()?,
                fga.settings()?,
                delivery.settings()?,
                "drain",
                None,
            )
            .await?;
            let shutdown = crate::shutdown::on_signals()
                .map_err(|e| anyhow::anyhow!("cannot handle signals: {e}"))?;
            let left = relay.drain(timeout, shutdown).await?;
            if left == 0 {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("fga-relay: {left} row(s) still pending after {timeout:?}");
                Ok(ExitCode::from(1))
            }
        }
        Command::Reconcile(args) => Ok(crate::reconcile::command(args).await),
    }
}

/// `sql/roles.sql`: the writer and relay roles, printed by `fga-relay sql --roles`.
const ROLES_SQL: &str = include_str!("../sql/roles.sql");

/// Rows deleted per `prune` statement: small enough that no batch holds locks for long.
const PRUNE_BATCH: i64 = 1000;

/// A pool-backed store after checking that `migrate` has run.
async fn open_store(db: &DbSettings, application_name: &str) -> Result<Store, Failure> {
    let cfg = crate::db::pg_config(db, application_name)?;
    let store = Store::new(crate::db::pool(cfg, 2), db.table.clone());
    check_schema(&store).await?;
    Ok(store)
}

async fn check_schema(store: &Store) -> Result<schema::TableInfo, Failure> {
    let client = store
        .pool()
        .get()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL: {}", pool_error(&e)))?;
    Ok(schema::check(&client, store.table()).await?)
}

/// [`check_schema`] for the daemon: a database that is not up yet (the relay started first, or
/// is restarting) is waited for, with backoff, until `shutdown`. A missing table is still bad
/// configuration at once.
async fn wait_for_schema(
    store: &Store,
    shutdown: &CancellationToken,
) -> Result<schema::TableInfo, Failure> {
    const WAIT: crate::backoff::Backoff =
        crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut attempt = 0;
    loop {
        match check_schema(store).await {
            Err(Failure::Other(e)) if !shutdown.is_cancelled() => {
                attempt += 1;
                let wait = WAIT.delay(attempt);
                warn!(error = %format!("{e:#}"), retry_in = ?wait, "waiting for PostgreSQL");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return Err(Failure::Other(e)),
                }
            }
            other => return other,
        }
    }
}

fn pool_error(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => crate::db::describe(e),
        other => other.to_string(),
    }
}

/// Builds a relay for `run` or `drain`: settings logged, schema checked, store checked.
pub async fn build_relay(
    db: DbSettings,
    fga: FgaSettings,
    delivery: DeliverySettings,
    command: &str,
    wait_for_db: Option<&CancellationToken>,
) -> Result<(Relay, Registry), Failure> {
    delivery.check_timing(fga.request_timeout)?;
    let auth = match &fga.auth {
        Auth::None => "none",
        Auth::ApiToken(_) => "preshared key",
        Auth::ClientCredentials { .. } => "client credentials",
    };
    info!(
        command,
        database = %config::redact_database_url(db.url.expose()),
        table = %db.table,
        api_url = %fga.api_url,
        store = ?fga.store,
        model = fga.model_id.as_deref().unwrap_or("latest"),
        auth,
        request_timeout = ?fga.request_timeout,
        max_tuples_per_write = fga.max_tuples_per_write,
        sweep_interval = ?delivery.sweep_interval,
        heartbeat_interval = ?delivery.heartbeat_interval,
        leader_lease = ?delivery.leader_lease,
        max_attempts = delivery.max_attempts,
        batch_size = delivery.batch_size,
        version = env!("CARGO_PKG_VERSION"),
        "fga-relay starting"
    );
    let mut pg = crate::db::pg_config(&db, &format!("fga-relay {command}"))?;
    pg.idle_in_transaction = Some(crate::db::claim_idle_limit(fga.request_timeout));
    let store = Store::new(crate::db::pool(pg.clone(), 4), db.table.clone());
    let table = match wait_for_db {
        Some(shutdown) => wait_for_schema(&store, shutdown).await?,
        None => check_schema(&store).await?,
    };
    if !table.trigger {
        warn!(table = %db.table, "the wake-up trigger is missing or disabled: rows will be found \
            only by the sweep; run `fga-relay migrate`");
    }
    let client = Arc::new(FgaClient::new(&fga)?);
    match client.preflight().await {
        Ok(name) => info!(store = %name, "OpenFGA store found"),
        Err(PreflightError::Config(e)) => return Err(e.into()),
        Err(PreflightError::Unavailable(e)) => {
            warn!(error = %e, "cannot check the OpenFGA store now; starting anyway and retrying")
        }
    }
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let relay = Relay {
        pg,
        db,
        fga,
        delivery,
        store,
        client,
        metrics,
        table,
        identity: crate::relay::identity(),
        systemd: Arc::new(crate::systemd::Notifier::disabled()),
        terms: Default::default(),
    };
    Ok((relay, registry))
}
