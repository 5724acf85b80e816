//! What commands open before their work: the outbox store, once the schema is checked (waited
//! for, for the daemon), and for `run` and `drain` a relay with its OpenFGA client checked.

use super::failure::Failure;
use crate::config::{Auth, DbSettings, DeliverySettings, FgaSettings, TableName};
use crate::db::hint::{self, Explained};
use crate::db::{PgConnect, SharedPg};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::openfga::{FgaClient, PreflightError};
use crate::recurring::Recurring;
use crate::relay::Relay;
use crate::schema;
use crate::store::{Store, StoreError};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// A pool-backed store after checking that `migrate` has run.
pub(super) async fn open_store(db: &DbSettings, application_name: &str) -> Result<Store, Failure> {
    let cfg = crate::db::pg_config(db, application_name)?;
    let store = Store::new(crate::db::pool(cfg.clone(), 2), db.table.clone());
    check_schema(&store, &cfg).await?;
    Ok(store)
}

/// A command's database error as it fails the command; where the role lacks a privilege, with
/// what it lacks and the GRANT that gives it, as `fga-relay check` says it.
pub(super) async fn store_failure(store: &Store, e: StoreError) -> Failure {
    let StoreError::Db(db) = &e else {
        return e.into();
    };
    if db.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
        && let Ok(client) = store.pool().get().await
        && let Err(lacks) = crate::db::probe::privileges(&client, store.table()).await
    {
        return Failure::Other(anyhow::anyhow!("{e}: {lacks}"));
    }
    e.into()
}

/// As which role to run `command`, which does what only the owner of the table may (`migrate`'s
/// DDL, `prune`'s DELETE, neither of which the relay's role is granted, by design): its owner,
/// read from the catalog; where there is no table yet, a role that may create it.
pub(super) async fn run_as_owner(
    client: &tokio_postgres::Client,
    table: &TableName,
    command: &str,
) -> String {
    match crate::db::probe::table_owner(client, table.as_str()).await {
        Ok(Some(owner)) => format!("run {command} as the owner of {table}, role {owner}"),
        Ok(None) => format!(
            "run {command} as a role that may create tables in the schema (CREATE on it): it \
             then owns {table}, and runs migrate and prune"
        ),
        // The catalog unread: the owner is still the answer, unnamed.
        Err(_) => format!("run {command} as the owner of {table}"),
    }
}

/// Why the schema could not be checked.
enum Unchecked {
    /// No connection: why, and what that means.
    Connect(Explained),
    Failed(Failure),
}

async fn check_schema(store: &Store, pg: &PgConnect) -> Result<schema::TableInfo, Failure> {
    Ok(try_check_schema(store, pg).await?)
}

async fn try_check_schema(store: &Store, pg: &PgConnect) -> Result<schema::TableInfo, Unchecked> {
    let client = store
        .pool()
        .get()
        .await
        .map_err(|e| Unchecked::Connect(pool_error(&e, pg)))?;
    schema::check(&client, store.table())
        .await
        .map_err(|e| Unchecked::Failed(e.into()))
}

/// [`check_schema`] for the daemon: a database that is not up yet (the relay started first, or
/// is restarting) is waited for, with backoff, until `shutdown`, beating `liveness` at each
/// attempt (waiting is progress). A missing table is still bad configuration at once.
/// An error that does not heal by itself (a refused password, no database configured) is said at
/// ERROR with the next step, once a minute while it lasts (see `db::hint`).
async fn wait_for_schema(
    store: &Store,
    pg: &SharedPg,
    shutdown: &CancellationToken,
    liveness: &Liveness,
) -> Result<schema::TableInfo, Failure> {
    const WAIT: crate::backoff::Backoff =
        crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let recurring = Recurring::default();
    let mut attempt = 0;
    loop {
        liveness.beat();
        let unchecked = match try_check_schema(store, &pg.get()).await {
            Ok(table) => return Ok(table),
            Err(Unchecked::Failed(config @ Failure::Config(_))) => return Err(config),
            Err(unchecked) => unchecked,
        };
        attempt += 1;
        let wait = WAIT.delay(attempt).min(liveness.beat_interval());
        match &unchecked {
            Unchecked::Connect(why) => {
                hint::log("waiting for PostgreSQL", why, Some(wait), &recurring);
            }
            Unchecked::Failed(e) => warn!(error = %e, retry_in = ?wait, "waiting for PostgreSQL"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return Err(unchecked.into()),
        }
    }
}

impl From<Unchecked> for Failure {
    fn from(e: Unchecked) -> Failure {
        match e {
            Unchecked::Connect(why) => {
                Failure::Other(anyhow::anyhow!("cannot connect to PostgreSQL: {why}"))
            }
            Unchecked::Failed(f) => f,
        }
    }
}

fn pool_error(e: &deadpool_postgres::PoolError, pg: &PgConnect) -> Explained {
    match e {
        deadpool_postgres::PoolError::Backend(e) => hint::explain(e, pg),
        other => Explained {
            lasting: None,
            error: other.to_string(),
            next: None,
        },
    }
}

/// Says at start what `fga-relay check` says of a store without its model, rather than only
/// later, row by row. The relay starts anyway: rows wait (nothing is dead-lettered) until the
/// model is written. Read with ReadAuthorizationModels, not `check`'s refused Write: a start
/// writes nothing.
async fn say_model(client: &FgaClient) {
    match client.model_relations().await {
        Ok(model) => info!(model = %model.id, "OpenFGA authorization model found"),
        Err(e) if e == crate::openfga::NO_MODEL => error!(
            "{e}; until then rows wait, none is delivered (`fga-relay check` checks the model)"
        ),
        Err(e) => warn!(error = %e, "cannot read the store's authorization model; \
            `fga-relay check` checks it"),
    }
}

/// Builds a relay for `run` or `drain`: settings logged, schema checked, store checked.
pub(super) async fn build_relay(
    db: DbSettings,
    fga: FgaSettings,
    delivery: DeliverySettings,
    command: &str,
    wait_for_db: Option<&CancellationToken>,
    liveness: Arc<Liveness>,
) -> Result<(Relay, Registry), Failure> {
    log_start(command, &db, &fga, &delivery);
    let pg = crate::db::SharedPg::new(crate::db::delivery_pg(
        &db,
        &format!("fga-relay {command}"),
        fga.request_timeout,
    )?);
    // A connection for each Write in flight (it holds its rows' locks until the answer), the
    // one more a full window holds for a store with none in flight, and a few for bookkeeping,
    // the metrics endpoint and `drain`'s counts.
    let store = Store::new(
        crate::db::shared_pool(&pg, delivery.max_in_flight + 4),
        db.table.clone(),
    );
    let table = match wait_for_db {
        Some(shutdown) => wait_for_schema(&store, &pg, shutdown, &liveness).await?,
        None => check_schema(&store, &pg.get()).await?,
    };
    if !table.trigger {
        warn!(table = %db.table, "the wake-up trigger is missing or disabled: rows will be found \
            only by the sweep; run `fga-relay migrate`");
    }
    let client = Arc::new(FgaClient::new(&fga)?);
    check_store(&client).await?;
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry, &format!("{}.{}", table.schema, db.table));
    let relay = Relay {
        pg,
        db,
        fga,
        delivery,
        store,
        client,
        metrics,
        table,
        identity: crate::leadership::identity(),
        systemd: Arc::new(crate::systemd::Notifier::disabled()),
        liveness,
        terms: Default::default(),
        pooler: Default::default(),
        passes: Default::default(),
        problems: Default::default(),
    };
    Ok((relay, registry))
}

/// The settings a relay starts with, in one line: never a connection string, a URL's userinfo
/// or a credential.
fn log_start(command: &str, db: &DbSettings, fga: &FgaSettings, delivery: &DeliverySettings) {
    let auth = match &fga.auth {
        Auth::None => "none",
        Auth::ApiToken(_) => "preshared key",
        Auth::ClientCredentials { .. } => "client credentials",
    };
    info!(
        command,
        database = %crate::db::target::summary(db),
        table = %db.table,
        api_url = %crate::config::shown_url(&fga.api_url),
        store = %fga.store,
        model = fga.model_id.as_deref().unwrap_or("latest"),
        auth,
        request_timeout = ?fga.request_timeout,
        max_tuples_per_write = fga.max_tuples_per_write,
        sweep_interval = ?delivery.sweep_interval,
        heartbeat_interval = ?delivery.heartbeat_interval,
        leader_lease = ?delivery.leader_lease,
        max_attempts = delivery.max_attempts,
        batch_size = delivery.batch_size,
        max_in_flight = delivery.max_in_flight,
        linger = ?delivery.linger,
        version = %crate::build_info::VERSION,
        revision = %crate::build_info::REVISION,
        "fga-relay starting"
    );
}

/// Says which store the relay delivers to, and whether it has a model. A store that cannot be
/// asked now (OpenFGA down) does not stop a start; one that is wrong (not found, refused) does.
async fn check_store(client: &FgaClient) -> Result<(), Failure> {
    match client.preflight().await {
        Ok(name) => {
            info!(store = %name, "OpenFGA store found");
            say_model(client).await;
        }
        Err(PreflightError::Config(e)) => return Err(e.into()),
        Err(PreflightError::Unavailable(e)) => {
            warn!(error = %e, "cannot check the OpenFGA store now; starting anyway and retrying")
        }
    }
    Ok(())
}
