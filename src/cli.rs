//! The command line: flags with environment fallbacks (the OpenFGA ones named as the `fga` CLI
//! names them), turned into validated settings, and the commands.
//!
//! Exit status: 0 success; 1 failure (for `drain`: rows still pending at the timeout); 2 bad
//! settings, with one line naming the setting.

use crate::config::{
    self, Auth, ConfigError, DbSettings, DeliverySettings, FgaSettings, LogFormat, TableName,
};
use crate::http::Endpoint;
use crate::metrics::Metrics;
use crate::openfga::{FgaClient, PreflightError};
use crate::relay::Relay;
use crate::schema::{self, SchemaProblem};
use crate::settings::{
    DEFAULT_HTTP_ADDR, DEFAULT_LOG_FORMAT, DEFAULT_TABLE, DbArgs, DeliveryArgs, FgaArgs, or_default,
};
use crate::store::Store;
use clap::{Parser, Subcommand};
use prometheus_client::registry::Registry;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
        max_attempts = delivery.max_attempts,
        batch_size = delivery.batch_size,
        version = env!("CARGO_PKG_VERSION"),
        "fga-relay starting"
    );
    let pg = crate::db::pg_config(&db, &format!("fga-relay {command}"))?;
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
    };
    Ok((relay, registry))
}
