//! `fga-relay reconcile`: shows that OpenFGA holds what the delivered rows say it must, and
//! repairs drift through the outbox.
//!
//! # How it streams
//! Nothing proportional to the outbox or the store is held in the relay's memory. PostgreSQL does
//! the sorting and joining, in temporary tables of this session (`sql/queries/reconcile_*.sql`):
//! 1. The line: the newest row's id `M`; then the wait for transactions that were inserting rows
//!    at that moment, so that every row up to `M` is committed (or gone) for good.
//! 2. The expected state: per tuple that rows `from..=M` touch, its last operation in id order,
//!    computed by one `DISTINCT ON` statement into `reconcile_expected` (PostgreSQL sorts,
//!    spilling to disk past `work_mem`).
//! 3. What OpenFGA holds: the whole store read page by page (Read returns tuples in insertion
//!    order, not key order, so the pages cannot be merge-joined as they come), each batch of
//!    pages inserted into `reconcile_actual` keeping only the tuples the outbox speaks of; or,
//!    with `--since`, one Read per compared tuple, a page of keys at a time.
//! 4. The tuples that rows after `M` touch (they changed while checking) into `reconcile_moved`.
//! 5. One join, read through a cursor a page at a time, yields every tuple not in step, in key
//!    order; each is printed as it comes (and recorded for `--repair`).
//!
//! Memory: a page of keys, a batch of Read pages, a page of the cursor: a few thousand tuples.
//!
//! # Why a report can be trusted while the relay runs
//! A tuple whose last operation is in a pending or dead row is reported as such, never as drift.
//! A delivered operation reached OpenFGA before its row was marked, so before step 2 reads it;
//! anything that changes the tuple later comes from a row after `M` (step 1 makes sure of that),
//! and such tuples are reported as changed, not compared. `--repair` checks that once more under
//! a short lock, right before it inserts: see [`Db::repair`].

use crate::backoff::Backoff;
use crate::cli::{DbArgs, FgaArgs};
use crate::config::{self, ConfigError, DbSettings};
use crate::openfga::{
    FailureClass, FgaClient, MAX_READ_PAGE, PreflightError, ReadPage, WriteError,
};
use crate::payload::TupleKey;
use crate::schema::render;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};
use std::io::{BufWriter, IsTerminal, Stdout, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_postgres::types::ToSql;
use tracing::{info, warn};

/// `fga-relay reconcile`'s own flags, besides where the outbox and OpenFGA are.
#[derive(clap::Args, Debug)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub fga: FgaArgs,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Enqueue corrective rows into the outbox for the drift found (the relay delivers them).
    #[arg(long)]
    pub repair: bool,
    /// Check only the tuples of rows created within this long (e.g. 1h, 30m).
    #[arg(long)]
    pub since: Option<String>,
    /// Also list the tuples OpenFGA holds that the outbox does not mention (not drift).
    #[arg(long, conflicts_with = "since")]
    pub all: bool,
    /// How to read OpenFGA: store (every tuple, 100 a page), tuple (one Read per compared
    /// tuple), or auto (tuple with --since, store otherwise).
    #[arg(long, default_value = "auto")]
    pub read_by: String,
}

/// How OpenFGA is read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadBy {
    /// The whole store, a page at a time: store size / 100 requests.
    Store,
    /// One Read per compared tuple, [`READ_CONCURRENCY`] at a time.
    Tuple,
}

/// The validated flags.
#[derive(Debug)]
struct Options {
    json: bool,
    repair: bool,
    since: Option<Duration>,
    all: bool,
    read_by: ReadBy,
}

impl ReconcileArgs {
    fn options(&self) -> Result<Options, ConfigError> {
        let since = self
            .since
            .as_deref()
            .map(|s| config::parse_positive_duration("--since", s))
            .transpose()?;
        let read_by = match (self.read_by.trim(), since) {
            ("store", _) | ("auto", None) => ReadBy::Store,
            ("tuple", _) | ("auto", Some(_)) => ReadBy::Tuple,
            (other, _) => {
                return Err(ConfigError::new(
                    "--read-by",
                    format!("{other:?} is not one of auto, store, tuple"),
                ));
            }
        };
        if self.all && read_by == ReadBy::Tuple {
            return Err(ConfigError::new(
                "--all",
                "lists what the whole store holds: it needs --read-by store",
            ));
        }
        Ok(Options {
            json: self.json,
            repair: self.repair,
            since,
            all: self.all,
            read_by,
        })
    }
}

/// Runs `fga-relay reconcile`: exit status 0 when OpenFGA is in step with the outbox, 1 on
/// drift (also when `--repair` enqueued its corrections), 2 on error.
pub async fn command(args: ReconcileArgs) -> ExitCode {
    match reconcile(args).await {
        Ok(Verdict::InStep) => ExitCode::SUCCESS,
        Ok(Verdict::Drift) => ExitCode::from(1),
        Err(e) => {
            eprintln!("fga-relay: {e:#}");
            ExitCode::from(2)
        }
    }
}

enum Verdict {
    InStep,
    Drift,
}

/// Tuples read one by one at once, with `--read-by tuple`.
const READ_CONCURRENCY: usize = 8;
/// Keys taken from the database at a time for reads one by one.
const KEYS_PAGE: i64 = 500;
/// Tuples read from OpenFGA gathered before they are written to the database at once.
const ACTUAL_BATCH: usize = 1000;
/// Rows fetched from the comparison's cursor at a time.
const CURSOR_PAGE: usize = 1000;
/// Drifted tuples gathered before they are recorded for `--repair` at once.
const DRIFT_BATCH: usize = 1000;
/// How long to wait for transactions that were inserting rows when the check started.
const WRITERS_WAIT: Duration = Duration::from_secs(60);
/// Attempts at one Read before OpenFGA counts as unavailable.
const READ_ATTEMPTS: u32 = 6;
const READ_BACKOFF: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(4));
/// Without a terminal, a progress line this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(10);

async fn reconcile(args: ReconcileArgs) -> anyhow::Result<Verdict> {
    let db = args.db.settings()?;
    let fga = args.fga.settings()?;
    let opts = args.options()?;
    info!(
        database = %crate::db::target::summary(db.url.expose()),
        table = %db.table,
        api_url = %fga.api_url,
        store = ?fga.store,
        since = ?opts.since,
        read_by = ?opts.read_by,
        repair = opts.repair,
        "fga-relay reconcile starting"
    );
    let mut pg = Db::connect(&db).await?;
    let client = Arc::new(FgaClient::new(&fga)?);
    match client.preflight().await {
        Ok(name) => info!(store = %name, "OpenFGA store found"),
        Err(PreflightError::Config(e)) => return Err(e.into()),
        Err(PreflightError::Unavailable(e)) => anyhow::bail!("cannot reach OpenFGA: {e}"),
    }
    pg.setup().await?;

    let from = match opts.since {
        Some(d) => pg.first_row_since(d).await?,
        None => 0,
    };
    let through = pg.newest_row().await?;
    pg.wait_for_writers().await?;

    let mut progress = Progress::start("reading the outbox", Meter::Time);
    let tuples = pg.expected(from, through).await?;
    progress.add(tuples);
    progress.finish();

    let not_in_outbox = match opts.read_by {
        ReadBy::Store => Some(read_store(&client, &pg, opts.all).await?),
        ReadBy::Tuple => {
            read_tuples(&client, &pg).await?;
            None
        }
    };
    pg.moved_since(through).await?;

    let mut summary = Summary {
        from,
        through,
        tuples,
        // Tuples only the store knows are meaningful only against the whole outbox.
        not_in_outbox: not_in_outbox.filter(|_| opts.since.is_none()),
        ..Summary::default()
    };
    let mut out = Report::new(opts.json);
    pg.compare(&mut out, &mut summary, opts.repair).await?;
    if opts.all {
        pg.list_unknown(&mut out).await?;
    }
    if opts.repair && summary.drift() > 0 {
        summary.repair = Some(pg.repair(through, fga.max_tuples_per_write).await?);
    }
    out.finish(&summary)?;
    match peak_rss_kib() {
        Some(kib) => info!(
            tuples = summary.tuples,
            drift = summary.drift(),
            peak_rss_kib = kib,
            "reconcile finished"
        ),
        None => info!(
            tuples = summary.tuples,
            drift = summary.drift(),
            "reconcile finished"
        ),
    }
    Ok(if summary.drift() > 0 {
        Verdict::Drift
    } else {
        Verdict::InStep
    })
}

// ------------------------------------------------------------------------------------------------
// Reading OpenFGA
// ------------------------------------------------------------------------------------------------

/// One Read page, retried with backoff while OpenFGA fails transiently; any other failure, or
/// too many, ends the check.
async fn read_page(
    client: &FgaClient,
    filter: Option<&TupleKey>,
    token: &str,
) -> anyhow::Result<ReadPage> {
    let mut attempt = 0;
    loop {
        match client.read(filter, MAX_READ_PAGE, token).await {
            Ok(page) => return Ok(page),
            Err(e) if e.class() == FailureClass::Transient && attempt + 1 < READ_ATTEMPTS => {
                attempt += 1;
                let wait = match &e {
                    WriteError::Transient {
                        retry_after: Some(d),
                        ..
                    } => *d,
                    _ => READ_BACKOFF.delay(attempt),
                };
                warn!(error = %e, attempt, "OpenFGA Read failed; trying again");
                tokio::time::sleep(wait).await;
            }
            Err(e) => anyhow::bail!("OpenFGA Read failed: {e}"),
        }
    }
}

/// Reads the whole store, page after page, into `reconcile_actual`; returns how many tuples it
/// holds that the outbox does not speak of.
async fn read_store(client: &FgaClient, pg: &Db, all: bool) -> anyhow::Result<u64> {
    let mut progress = Progress::start("reading OpenFGA", Meter::Count);
    let mut token = String::new();
    let mut batch = Vec::with_capacity(ACTUAL_BATCH + MAX_READ_PAGE as usize);
    let mut unknown = 0;
    loop {
        let page = read_page(client, None, &token).await?;
        progress.add(page.tuples.len() as u64);
        batch.extend(page.tuples);
        if batch.len() >= ACTUAL_BATCH {
            unknown += pg.record_actual(&batch, all).await?;
            batch.clear();
        }
        if page.continuation_token.is_empty() {
            break;
        }
        if page.continuation_token == token {
            anyhow::bail!("OpenFGA Read answered the same continuation token twice");
        }
        token = page.continuation_token;
    }
    unknown += pg.record_actual(&batch, all).await?;
    progress.finish();
    Ok(unknown)
}

/// Reads each compared tuple by its key, [`READ_CONCURRENCY`] at a time, into
/// `reconcile_actual`.
async fn read_tuples(client: &Arc<FgaClient>, pg: &Db) -> anyhow::Result<()> {
    let total = pg.delivered_tuples().await?;
    let mut progress = Progress::start("reading OpenFGA", Meter::Total(total));
    let mut after = TupleKey {
        object: String::new(),
        relation: String::new(),
        user: String::new(),
    };
    loop {
        let keys = pg.keys_after(&after, KEYS_PAGE).await?;
        let Some(last) = keys.last() else { break };
        after = last.clone();
        let mut held = Vec::new();
        let mut reads = JoinSet::new();
        for key in keys {
            while reads.len() >= READ_CONCURRENCY {
                held.extend(joined(reads.join_next().await)?);
                progress.add(1);
            }
            let client = client.clone();
            reads.spawn(async move {
                let mut found = Vec::new();
                let mut token = String::new();
                loop {
                    let page = read_page(&client, Some(&key), &token).await?;
                    found.extend(page.tuples.into_iter().filter(|t| t.key == key));
                    if page.continuation_token.is_empty() || page.continuation_token == token {
                        return anyhow::Ok(found);
                    }
                    token = page.continuation_token;
                }
            });
        }
        while let Some(r) = reads.join_next().await {
            held.extend(joined(Some(r))?);
            progress.add(1);
        }
        pg.record_actual(&held, false).await?;
    }
    progress.finish();
    Ok(())
}

fn joined<T>(
    r: Option<Result<anyhow::Result<Vec<T>>, tokio::task::JoinError>>,
) -> anyhow::Result<Vec<T>> {
    match r {
        None => Ok(Vec::new()),
        Some(Ok(found)) => found,
        Some(Err(e)) => Err(anyhow::anyhow!("a Read task failed: {e}")),
    }
}

// ------------------------------------------------------------------------------------------------
// Conditions
// ------------------------------------------------------------------------------------------------

/// A condition as both sides are compared: `{"name", "context"}` (an empty context is `{}`).
fn condition_value(c: &crate::payload::Condition) -> Value {
    json!({
        "name": c.name,
        "context": Value::Object(c.context.clone()),
    })
}

/// Whether two conditions are the same for OpenFGA: its context is a protobuf Struct, whose
/// numbers are doubles (`1` and `1.0` are one value, and an integer beyond 2^53 comes back
/// rounded).
fn same_condition(expected: Option<&Value>, held: Option<&Value>) -> bool {
    match (expected, held) {
        (None, None) => true,
        (Some(a), Some(b)) => as_struct(a) == as_struct(b),
        _ => false,
    }
}

fn as_struct(v: &Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| v.clone(), Value::Number),
        Value::Array(items) => Value::Array(items.iter().map(as_struct).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), as_struct(v)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

/// `name {context}`, or `name` alone for an empty context, or `none`.
fn describe_condition(c: Option<&Value>) -> String {
    let Some(c) = c else {
        return "none".to_owned();
    };
    let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
    match c.get("context") {
        Some(Value::Object(m)) if !m.is_empty() => format!("{name} {}", Value::Object(m.clone())),
        _ => name.to_owned(),
    }
}

// ------------------------------------------------------------------------------------------------
// The database side
// ------------------------------------------------------------------------------------------------

/// The SQL of `sql/queries/reconcile_*.sql`, with the table name substituted.
struct Queries {
    setup: String,
    scope: String,
    newest: String,
    writers: String,
    writers_left: String,
    expected: String,
    index: String,
    delivered: String,
    keys: String,
    actual: String,
    moved: String,
    compare: String,
    unknown: String,
    drift: String,
    lock: String,
    recheck: String,
    repair: String,
}

/// The session `reconcile` works in: one dedicated connection, whose temporary tables hold what
/// is compared.
struct Db {
    client: tokio_postgres::Client,
    table: String,
    q: Queries,
}

fn db_error(what: &str, e: tokio_postgres::Error) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", crate::db::describe(&e))
}

/// Rows of the comparison's cursor: a tuple not plainly in step.
struct Candidate {
    key: TupleKey,
    present: bool,
    condition: Option<Value>,
    row: i64,
    state: String,
    held: bool,
    held_condition: Option<Value>,
    moved: bool,
}

impl Db {
    async fn connect(db: &DbSettings) -> anyhow::Result<Db> {
        let cfg = crate::db::pg_config(db, "fga-relay reconcile")?;
        let (client, conn) = crate::db::connect_dedicated(&cfg)
            .await
            .map_err(|e| db_error("cannot connect to PostgreSQL", e))?;
        tokio::spawn(conn);
        crate::schema::check(&client, &db.table)
            .await
            .map_err(|e| match e {
                crate::schema::SchemaProblem::Db(e) => db_error("cannot check the schema", e),
                other => anyhow::anyhow!(other),
            })?;
        let r = |sql: &str| render(sql, &db.table);
        let q = Queries {
            setup: r(include_str!("../sql/queries/reconcile_setup.sql")),
            scope: r(include_str!("../sql/queries/reconcile_scope.sql")),
            newest: r(include_str!("../sql/queries/reconcile_newest.sql")),
            writers: r(include_str!("../sql/queries/reconcile_writers.sql")),
            writers_left: r(include_str!("../sql/queries/reconcile_writers_left.sql")),
            expected: r(include_str!("../sql/queries/reconcile_expected.sql")),
            index: r(include_str!("../sql/queries/reconcile_index.sql")),
            delivered: r(include_str!("../sql/queries/reconcile_delivered.sql")),
            keys: r(include_str!("../sql/queries/reconcile_keys.sql")),
            actual: r(include_str!("../sql/queries/reconcile_actual.sql")),
            moved: r(include_str!("../sql/queries/reconcile_moved.sql")),
            compare: r(include_str!("../sql/queries/reconcile_compare.sql")),
            unknown: r(include_str!("../sql/queries/reconcile_unknown.sql")),
            drift: r(include_str!("../sql/queries/reconcile_drift.sql")),
            lock: r(include_str!("../sql/queries/reconcile_lock.sql")),
            recheck: r(include_str!("../sql/queries/reconcile_recheck.sql")),
            repair: r(include_str!("../sql/queries/reconcile_repair.sql")),
        };
        Ok(Db {
            client,
            table: db.table.to_string(),
            q,
        })
    }

    async fn setup(&self) -> anyhow::Result<()> {
        self.client
            .batch_execute(&self.q.setup)
            .await
            .map_err(|e| db_error("cannot create the working tables (TEMPORARY privilege?)", e))
    }

    /// The first id of the rows created within `d`: the rows after the last one older.
    async fn first_row_since(&self, d: Duration) -> anyhow::Result<i64> {
        let row = self
            .client
            .query_opt(&self.q.scope, &[&d.as_secs_f64()])
            .await
            .map_err(|e| db_error("cannot find the rows of --since", e))?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0) + 1))
    }

    async fn newest_row(&self) -> anyhow::Result<i64> {
        let row = self
            .client
            .query_one(&self.q.newest, &[])
            .await
            .map_err(|e| db_error("cannot read the outbox", e))?;
        Ok(row.get(0))
    }

    /// Waits until every transaction that may be inserting rows into the outbox now has ended,
    /// so that no row at or below the newest id seen before can still appear. Never blocks
    /// anyone: it only looks at `pg_locks`.
    async fn wait_for_writers(&self) -> anyhow::Result<()> {
        let rows = self
            .client
            .query(&self.q.writers, &[])
            .await
            .map_err(|e| db_error("cannot list the outbox's writers", e))?;
        if rows.is_empty() {
            return Ok(());
        }
        let vxids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let deadline = Instant::now() + WRITERS_WAIT;
        loop {
            let left: i64 = self
                .client
                .query_one(&self.q.writers_left, &[&vxids])
                .await
                .map_err(|e| db_error("cannot watch the outbox's writers", e))?
                .get(0);
            if left == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let pids: Vec<String> = rows
                    .iter()
                    .map(|r| r.get::<_, Option<i32>>(1).unwrap_or(0).to_string())
                    .collect();
                anyhow::bail!(
                    "transactions writing to {} have stayed open for over {WRITERS_WAIT:?} \
                     (pid {}); reconcile needs them committed to know what the outbox says",
                    self.table,
                    pids.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Fills `reconcile_expected` from rows `from..=through`; returns how many tuples.
    async fn expected(&self, from: i64, through: i64) -> anyhow::Result<u64> {
        let n = self
            .client
            .execute(&self.q.expected, &[&from, &through])
            .await
            .map_err(|e| db_error("cannot compute the expected state", e))?;
        self.client
            .batch_execute(&self.q.index)
            .await
            .map_err(|e| db_error("cannot index the expected state", e))?;
        Ok(n)
    }

    async fn delivered_tuples(&self) -> anyhow::Result<u64> {
        let n: i64 = self
            .client
            .query_one(&self.q.delivered, &[])
            .await
            .map_err(|e| db_error("cannot count the compared tuples", e))?
            .get(0);
        Ok(n as u64)
    }

    /// The next `limit` compared tuples after `after`, in key order.
    async fn keys_after(&self, after: &TupleKey, limit: i64) -> anyhow::Result<Vec<TupleKey>> {
        let rows = self
            .client
            .query(
                &self.q.keys,
                &[&after.object, &after.relation, &after.user, &limit],
            )
            .await
            .map_err(|e| db_error("cannot read the compared tuples", e))?;
        Ok(rows
            .iter()
            .map(|r| TupleKey {
                object: r.get(0),
                relation: r.get(1),
                user: r.get(2),
            })
            .collect())
    }

    /// Records tuples read from OpenFGA; returns how many the outbox does not speak of.
    async fn record_actual(
        &self,
        tuples: &[crate::openfga::ReadTuple],
        keep_unknown: bool,
    ) -> anyhow::Result<u64> {
        if tuples.is_empty() {
            return Ok(0);
        }
        let (objects, relations, users) = key_columns(tuples.iter().map(|t| &t.key));
        let conditions: Vec<Option<Value>> = tuples
            .iter()
            .map(|t| t.condition.as_ref().map(condition_value))
            .collect();
        let unknown: i64 = self
            .client
            .query_one(
                &self.q.actual,
                &[&objects, &relations, &users, &conditions, &keep_unknown],
            )
            .await
            .map_err(|e| db_error("cannot record what OpenFGA holds", e))?
            .get(0);
        Ok(unknown as u64)
    }

    /// Records the tuples that rows after `through` touch.
    async fn moved_since(&self, through: i64) -> anyhow::Result<()> {
        self.client
            .execute(&self.q.moved, &[&through])
            .await
            .map_err(|e| db_error("cannot read the rows that arrived while checking", e))?;
        Ok(())
    }

    /// Streams the tuples not plainly in step through a cursor, reports each, counts them, and
    /// records the drift for `--repair`.
    async fn compare(
        &mut self,
        out: &mut Report,
        summary: &mut Summary,
        record_drift: bool,
    ) -> anyhow::Result<()> {
        let mut progress = Progress::start("comparing", Meter::Time);
        let what = "cannot compare";
        let mut cursor = Cursor::open(&mut self.client, &self.q.compare, what).await?;
        let mut drift: Vec<Finding> = Vec::new();
        let mut not_plain = 0u64;
        loop {
            let rows = cursor.next().await?;
            if rows.is_empty() {
                break;
            }
            progress.add(rows.len() as u64);
            not_plain += rows.len() as u64;
            for r in rows {
                let c = Candidate {
                    key: TupleKey {
                        object: r.get(0),
                        relation: r.get(1),
                        user: r.get(2),
                    },
                    present: r.get(3),
                    condition: r.get(4),
                    row: r.get(5),
                    state: r.get(6),
                    held: r.get(7),
                    held_condition: r.get(8),
                    moved: r.get(9),
                };
                let Some(finding) = summary.classify(c) else {
                    continue;
                };
                progress.suspend(|| out.finding(&finding))?;
                if record_drift && finding.kind.is_drift() {
                    drift.push(finding);
                }
            }
            if drift.len() >= DRIFT_BATCH {
                record_drift_batch(&cursor.tx, &self.q.drift, &drift).await?;
                drift.clear();
            }
        }
        record_drift_batch(&cursor.tx, &self.q.drift, &drift).await?;
        cursor.close().await?;
        // The tuples the query did not return are in step; classify counted the others.
        summary.in_step += summary.tuples.saturating_sub(not_plain);
        progress.finish();
        Ok(())
    }

    /// Reports the tuples OpenFGA holds that the outbox does not speak of (`--all`).
    async fn list_unknown(&mut self, out: &mut Report) -> anyhow::Result<()> {
        let what = "cannot list the other tuples";
        let mut cursor = Cursor::open(&mut self.client, &self.q.unknown, what).await?;
        loop {
            let rows = cursor.next().await?;
            if rows.is_empty() {
                break;
            }
            for r in rows {
                out.finding(&Finding {
                    kind: Kind::Unknown,
                    key: TupleKey {
                        object: r.get(0),
                        relation: r.get(1),
                        user: r.get(2),
                    },
                    row: None,
                    condition: None,
                    held_condition: r.get(3),
                })?;
            }
        }
        cursor.close().await
    }

    /// Enqueues the corrections of the recorded drift, in one transaction: under a SHARE ROW
    /// EXCLUSIVE lock (no writer halfway through an insert, the relay's claims unhindered), it
    /// drops the tuples that rows after `through` touch (the application changed them while we
    /// checked: correcting them now would override it), then inserts the delete rows, then the
    /// write rows, so that a tuple whose condition differs is deleted before it is written.
    async fn repair(&mut self, through: i64, max_tuples: usize) -> anyhow::Result<Repair> {
        // Writers in flight hold the lock up; waiting for them first keeps the lock short.
        self.wait_for_writers().await?;
        let q = &self.q;
        let tx = self
            .client
            .transaction()
            .await
            .map_err(|e| db_error("cannot repair", e))?;
        if let Err(e) = tx.batch_execute(&q.lock).await {
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
                anyhow::bail!(
                    "cannot lock {} for the repair: writers kept it busy; nothing was enqueued, \
                     try again",
                    self.table
                );
            }
            return Err(db_error("cannot lock the outbox for the repair", e));
        }
        let left_alone = tx
            .execute(&q.recheck, &[&through])
            .await
            .map_err(|e| db_error("cannot check the rows that arrived while checking", e))?;
        let mut repair = Repair {
            left_alone,
            ..Repair::default()
        };
        for kind in ["deletes", "writes"] {
            let r = tx
                .query_one(&q.repair, &[&kind, &(max_tuples as i64)])
                .await
                .map_err(|e| db_error("cannot enqueue the corrections", e))?;
            let rows: i64 = r.get(0);
            if rows == 0 {
                continue;
            }
            repair.rows += rows as u64;
            repair.operations += r.get::<_, i64>(1) as u64;
            let (first, last): (i64, i64) = (r.get(2), r.get(3));
            repair.first_id.get_or_insert(first);
            repair.last_id = Some(last);
        }
        tx.commit()
            .await
            .map_err(|e| db_error("cannot enqueue the corrections", e))?;
        info!(
            rows = repair.rows,
            operations = repair.operations,
            left_alone = repair.left_alone,
            "corrective rows enqueued"
        );
        Ok(repair)
    }
}

/// A query read [`CURSOR_PAGE`] rows at a time, in a transaction of its own.
struct Cursor<'a> {
    tx: tokio_postgres::Transaction<'a>,
    /// What failed, for the error message.
    what: &'static str,
}

impl<'a> Cursor<'a> {
    async fn open(
        client: &'a mut tokio_postgres::Client,
        sql: &str,
        what: &'static str,
    ) -> anyhow::Result<Cursor<'a>> {
        let tx = client.transaction().await.map_err(|e| db_error(what, e))?;
        tx.batch_execute(&format!(
            "DECLARE reconcile_cursor NO SCROLL CURSOR FOR\n{sql}"
        ))
        .await
        .map_err(|e| db_error(what, e))?;
        Ok(Cursor { tx, what })
    }

    /// The next rows; none at the end.
    async fn next(&mut self) -> anyhow::Result<Vec<tokio_postgres::Row>> {
        self.tx
            .query(&format!("FETCH {CURSOR_PAGE} FROM reconcile_cursor"), &[])
            .await
            .map_err(|e| db_error(self.what, e))
    }

    async fn close(self) -> anyhow::Result<()> {
        let what = self.what;
        self.tx.commit().await.map_err(|e| db_error(what, e))
    }
}

/// The object, relation and user columns of keys, for `unnest`.
fn key_columns<'a>(
    keys: impl Iterator<Item = &'a TupleKey>,
) -> (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for k in keys {
        columns.0.push(k.object.as_str());
        columns.1.push(k.relation.as_str());
        columns.2.push(k.user.as_str());
    }
    columns
}

async fn record_drift_batch(
    tx: &tokio_postgres::Transaction<'_>,
    sql: &str,
    drift: &[Finding],
) -> anyhow::Result<()> {
    if drift.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = drift.iter().map(|f| f.kind.as_str()).collect();
    let (objects, relations, users) = key_columns(drift.iter().map(|f| &f.key));
    let conditions: Vec<&Option<Value>> = drift.iter().map(|f| &f.condition).collect();
    let params: [&(dyn ToSql + Sync); 5] = [&kinds, &objects, &relations, &users, &conditions];
    tx.execute(sql, &params)
        .await
        .map_err(|e| db_error("cannot record the drift", e))?;
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Findings and the report
// ------------------------------------------------------------------------------------------------

/// What a reported tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The outbox wrote it last; OpenFGA does not hold it.
    Missing,
    /// The outbox deleted it last; OpenFGA holds it.
    Unexpected,
    /// Both hold it, with different conditions.
    Condition,
    /// Its last operation is in a dead row: not compared.
    Dead,
    /// OpenFGA holds it; the outbox does not speak of it (`--all`): not drift.
    Unknown,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Unexpected => "unexpected",
            Kind::Condition => "condition",
            Kind::Dead => "dead",
            Kind::Unknown => "unknown",
        }
    }

    fn is_drift(self) -> bool {
        matches!(self, Kind::Missing | Kind::Unexpected | Kind::Condition)
    }
}

/// One reported tuple.
#[derive(Debug)]
struct Finding {
    kind: Kind,
    key: TupleKey,
    /// The row of its last operation in the outbox.
    row: Option<i64>,
    /// The condition the outbox wrote (for a tuple that must be present).
    condition: Option<Value>,
    /// The condition OpenFGA holds (for a tuple it holds).
    held_condition: Option<Value>,
}

/// What was found, for the closing lines and the JSON document.
#[derive(Debug, Default)]
struct Summary {
    /// Rows `from..=through` were read.
    from: i64,
    through: i64,
    /// Tuples those rows touch.
    tuples: u64,
    in_step: u64,
    missing: u64,
    unexpected: u64,
    condition: u64,
    /// Tuples whose last operation is in a pending row, or in a dead one.
    pending: u64,
    dead: u64,
    /// Tuples that rows after `through` touch: they changed while checking.
    changed: u64,
    /// Tuples OpenFGA holds that the outbox does not speak of (whole store read, no --since).
    not_in_outbox: Option<u64>,
    repair: Option<Repair>,
}

/// What `--repair` enqueued.
#[derive(Debug, Default)]
struct Repair {
    rows: u64,
    /// Tuple operations in them (a condition mismatch takes a delete and a write).
    operations: u64,
    first_id: Option<i64>,
    last_id: Option<i64>,
    /// Drifted tuples the application changed while checking: not corrected.
    left_alone: u64,
}

impl Summary {
    fn drift(&self) -> u64 {
        self.missing + self.unexpected + self.condition
    }

    /// Counts a candidate of the comparison and says what to report about it, if anything.
    fn classify(&mut self, c: Candidate) -> Option<Finding> {
        let finding = |kind| Finding {
            kind,
            key: c.key.clone(),
            row: Some(c.row),
            condition: c.condition.clone().filter(|_| c.present),
            held_condition: c.held_condition.clone().filter(|_| c.held),
        };
        if c.moved {
            self.changed += 1;
            return None;
        }
        match c.state.as_str() {
            "pending" => {
                self.pending += 1;
                return None;
            }
            "dead" => {
                self.dead += 1;
                return Some(finding(Kind::Dead));
            }
            _ => {}
        }
        let kind = match (c.present, c.held) {
            (true, false) => Kind::Missing,
            (false, true) => Kind::Unexpected,
            (true, true) if !same_condition(c.condition.as_ref(), c.held_condition.as_ref()) => {
                Kind::Condition
            }
            _ => {
                // Different as jsonb, the same as OpenFGA's doubles.
                self.in_step += 1;
                return None;
            }
        };
        match kind {
            Kind::Missing => self.missing += 1,
            Kind::Unexpected => self.unexpected += 1,
            _ => self.condition += 1,
        }
        Some(finding(kind))
    }

    fn to_json(&self) -> Value {
        json!({
            "rows": {"from": self.from.max(1), "through": self.through},
            "tuples": self.tuples,
            "in_step": self.in_step,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "condition_mismatch": self.condition,
            "drift": self.drift(),
            "pending": self.pending,
            "dead": self.dead,
            "changed": self.changed,
            "not_in_outbox": self.not_in_outbox,
            "repair": self.repair.as_ref().map(|r| json!({
                "rows": r.rows,
                "operations": r.operations,
                "first_id": r.first_id,
                "last_id": r.last_id,
                "left_alone": r.left_alone,
            })),
        })
    }
}

/// The report on stdout, written as findings come: text lines, or one JSON document whose
/// `findings` array is written item by item.
struct Report {
    out: BufWriter<Stdout>,
    json: bool,
    first: bool,
    /// On a terminal each finding shows at once (between redraws of the progress bar).
    flush_each: bool,
}

impl Report {
    fn new(json: bool) -> Report {
        Report {
            out: BufWriter::new(std::io::stdout()),
            json,
            first: true,
            flush_each: std::io::stdout().is_terminal(),
        }
    }

    fn finding(&mut self, f: &Finding) -> anyhow::Result<()> {
        if self.json {
            let item = json!({
                "status": f.kind.as_str(),
                "object": f.key.object,
                "relation": f.key.relation,
                "user": f.key.user,
                "row": f.row,
                "condition": f.condition,
                "openfga_condition": f.held_condition,
            });
            let sep = if self.first { "{\"findings\":[" } else { "," };
            write!(self.out, "{sep}{item}")?;
        } else {
            let row = f.row.unwrap_or_default();
            let detail = match f.kind {
                Kind::Missing => match &f.condition {
                    None => format!("row {row} wrote it; OpenFGA does not hold it"),
                    Some(c) => format!(
                        "row {row} wrote it with condition {}; OpenFGA does not hold it",
                        describe_condition(Some(c))
                    ),
                },
                Kind::Unexpected => format!("row {row} deleted it; OpenFGA holds it"),
                Kind::Condition => format!(
                    "row {row} wrote condition {}; OpenFGA holds condition {}",
                    describe_condition(f.condition.as_ref()),
                    describe_condition(f.held_condition.as_ref())
                ),
                Kind::Dead => format!("its last operation is in dead row {row}: not compared"),
                Kind::Unknown => "OpenFGA holds it; the outbox does not mention it".to_owned(),
            };
            writeln!(self.out, "{:<11} {}  {detail}", f.kind.as_str(), f.key)?;
        }
        self.first = false;
        if self.flush_each {
            self.out.flush()?;
        }
        Ok(())
    }

    fn finish(mut self, s: &Summary) -> anyhow::Result<()> {
        if self.json {
            let Value::Object(fields) = s.to_json() else {
                unreachable!("the summary is an object")
            };
            write!(
                self.out,
                "{}",
                if self.first { "{\"findings\":[" } else { "" }
            )?;
            write!(self.out, "]")?;
            for (k, v) in fields {
                write!(self.out, ",{}:{v}", Value::String(k))?;
            }
            writeln!(self.out, "}}")?;
        } else {
            self.summary_text(s)?;
        }
        self.out.flush()?;
        Ok(())
    }

    fn summary_text(&mut self, s: &Summary) -> anyhow::Result<()> {
        let o = &mut self.out;
        if s.through < s.from.max(1) {
            writeln!(o, "no rows to check")?;
        } else {
            writeln!(
                o,
                "rows {}..{}: {} tuple(s); {} in step, {} missing, {} unexpected, {} with \
                 another condition",
                s.from.max(1),
                s.through,
                s.tuples,
                s.in_step,
                s.missing,
                s.unexpected,
                s.condition
            )?;
        }
        if s.pending + s.dead + s.changed > 0 {
            writeln!(
                o,
                "not compared: {} in pending rows, {} in dead rows, {} changed while checking",
                s.pending, s.dead, s.changed
            )?;
        }
        if let Some(n) = s.not_in_outbox.filter(|n| *n > 0) {
            writeln!(
                o,
                "OpenFGA holds {n} other tuple(s) the outbox does not mention (not compared; \
                 --all lists them)"
            )?;
        }
        match (&s.repair, s.drift()) {
            (_, 0) => writeln!(o, "in step")?,
            (None, n) => writeln!(
                o,
                "drift: {n} tuple(s); `fga-relay reconcile --repair` enqueues the corrections"
            )?,
            (Some(r), n) => {
                if r.left_alone > 0 {
                    writeln!(
                        o,
                        "{} drifted tuple(s) changed in the outbox while checking: left alone",
                        r.left_alone
                    )?;
                }
                match (r.first_id, r.last_id) {
                    (Some(first), Some(last)) => writeln!(
                        o,
                        "drift: {n} tuple(s); enqueued {} corrective row(s), ids {first}..{last}, \
                         delivered in order after every earlier row; run `fga-relay reconcile` \
                         again once they are",
                        r.rows
                    )?,
                    _ => writeln!(o, "drift: {n} tuple(s); nothing left to enqueue")?,
                }
            }
        }
        Ok(())
    }
}

/// This process's peak resident memory (`VmHWM`), where Linux tells it. `getrusage`'s
/// `ru_maxrss` would not do: it also counts the address space the process had before `exec`,
/// which after a `vfork`-style spawn is its parent's.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

// ------------------------------------------------------------------------------------------------
// Progress
// ------------------------------------------------------------------------------------------------

/// What a phase's progress shows.
#[derive(Clone, Copy, Debug)]
enum Meter {
    /// A bar: so many of this many.
    Total(u64),
    /// A count, of an unknown total.
    Count,
    /// Only the time: one statement, whose progress PostgreSQL does not tell.
    Time,
}

/// Progress on stderr: a bar or a spinner on a terminal; otherwise a log line every
/// [`PLAIN_PROGRESS_EVERY`], and one at the end of the phase.
struct Progress {
    what: &'static str,
    bar: Option<ProgressBar>,
    done: u64,
    meter: Meter,
    started: Instant,
    last_line: Instant,
}

impl Progress {
    fn start(what: &'static str, meter: Meter) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let (bar, template) = match meter {
                Meter::Total(n) => (
                    ProgressBar::new(n),
                    "{msg} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta}",
                ),
                Meter::Count => (
                    ProgressBar::new_spinner(),
                    "{spinner} {msg}: {human_pos} {per_sec} {elapsed}",
                ),
                Meter::Time => (ProgressBar::new_spinner(), "{spinner} {msg} {elapsed}"),
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .expect("the template is valid")
                    .progress_chars("=> "),
            );
            bar.set_message(what);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        if bar.is_none() {
            info!("{what}");
        }
        let now = Instant::now();
        Progress {
            what,
            bar,
            done: 0,
            meter,
            started: now,
            last_line: now,
        }
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(bar) => bar.inc(n),
            None if self.last_line.elapsed() >= PLAIN_PROGRESS_EVERY => {
                self.last_line = Instant::now();
                match self.meter {
                    Meter::Total(total) => info!(count = self.done, total, "{}", self.what),
                    _ => info!(count = self.done, "{}", self.what),
                }
            }
            None => {}
        }
    }

    /// Runs `f` with the bar out of the way, so that what it prints is not drawn over.
    fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    fn finish(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        info!(
            count = self.done,
            seconds = self.started.elapsed().as_secs_f64(),
            "{}: done",
            self.what
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_compare_as_openfga_holds_them() {
        let c = |v: Value| Some(v);
        let a = json!({"name": "non_expired", "context": {"n": 1, "s": "x", "l": [2, {"m": 3}]}});
        let b =
            json!({"name": "non_expired", "context": {"n": 1.0, "s": "x", "l": [2.0, {"m": 3.0}]}});
        assert!(same_condition(c(a.clone()).as_ref(), c(b).as_ref()));
        // An integer beyond 2^53 comes back as the nearest double.
        let big = json!({"name": "c", "context": {"n": 12345678901234567890u64}});
        let rounded = json!({"name": "c", "context": {"n": 1.2345678901234567e19}});
        assert!(same_condition(Some(&big), Some(&rounded)));
        assert!(!same_condition(
            Some(&a),
            Some(&json!({"name": "non_expired", "context": {}}))
        ));
        assert!(!same_condition(Some(&a), None));
        assert!(same_condition(None, None));
        let empty = crate::payload::Condition {
            name: "c".into(),
            context: Map::new(),
        };
        assert_eq!(condition_value(&empty), json!({"name": "c", "context": {}}));
        assert_eq!(describe_condition(Some(&condition_value(&empty))), "c");
        assert_eq!(describe_condition(None), "none");
    }

    fn candidate(state: &str, present: bool, held: bool) -> Candidate {
        Candidate {
            key: TupleKey {
                object: "document:1".into(),
                relation: "viewer".into(),
                user: "user:anne".into(),
            },
            present,
            condition: None,
            row: 7,
            state: state.into(),
            held,
            held_condition: None,
            moved: false,
        }
    }

    #[test]
    fn pending_dead_and_changed_tuples_are_not_drift() {
        let mut s = Summary::default();
        assert!(s.classify(candidate("pending", true, false)).is_none());
        assert_eq!(
            s.classify(candidate("dead", true, false)).unwrap().kind,
            Kind::Dead
        );
        let mut moved = candidate("delivered", true, false);
        moved.moved = true;
        assert!(s.classify(moved).is_none());
        assert_eq!((s.pending, s.dead, s.changed, s.drift()), (1, 1, 1, 0));
        assert_eq!(
            s.classify(candidate("delivered", true, false))
                .unwrap()
                .kind,
            Kind::Missing
        );
        assert_eq!(
            s.classify(candidate("delivered", false, true))
                .unwrap()
                .kind,
            Kind::Unexpected
        );
        let mut cond = candidate("delivered", true, true);
        cond.condition = Some(json!({"name": "c", "context": {"n": 1}}));
        cond.held_condition = Some(json!({"name": "c", "context": {"n": 1.0}}));
        assert!(s.classify(cond).is_none(), "1 and 1.0 are one double");
        assert_eq!((s.drift(), s.in_step), (2, 1));
    }

    #[test]
    fn read_by_follows_since_unless_told() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            r: ReconcileArgs,
        }
        let opts = |args: &[&str]| {
            let mut all = vec!["t"];
            all.extend_from_slice(args);
            T::parse_from(all).r.options()
        };
        assert_eq!(opts(&[]).unwrap().read_by, ReadBy::Store);
        assert_eq!(opts(&["--since", "1h"]).unwrap().read_by, ReadBy::Tuple);
        assert_eq!(
            opts(&["--since", "1h", "--read-by", "store"])
                .unwrap()
                .read_by,
            ReadBy::Store
        );
        assert!(opts(&["--read-by", "object"]).is_err());
        assert!(opts(&["--all", "--read-by", "tuple"]).is_err());
        assert!(opts(&["--since", "soon"]).is_err());
    }
}
