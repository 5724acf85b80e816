//! fga-relay delivers a PostgreSQL transactional outbox to OpenFGA's Write API, at least once,
//! in order per tuple, keeping delivered rows as evidence.
//!
//! # Map
//! Arrows point one way: `cli` → `commands` → the rest; nothing imports the command line back.
//! - [`cli`]: parses the command line and dispatches to a command.
//! - [`commands`]: one file per command (`migrate`, `check`, `sql`, `run`, `drain`, `status`,
//!   `retry`, `prune`, `reconcile`), each with its own flags; what they open before working
//!   (`commands::open`), and how they fail (`commands::Failure`, the exit status).
//! - [`settings`]: the flags several commands share (where the outbox is, how to reach OpenFGA,
//!   how delivery behaves), checked into [`config`]'s settings.
//! - [`config`]: settings, validated once; secrets that never reach a log line.
//! - [`schema`]: the SQL of `sql/schema/`, embedded, and `migrate`.
//! - [`store`]: every statement against the outbox, from `sql/queries/`.
//! - [`db`]: connections: the pool, the dedicated connection's settings, and TLS as libpq
//!   understands `sslmode` (`db::tls`).
//! - [`payload`]: what a row's payload must be, and why it is not.
//! - [`openfga`]: the OpenFGA client. One file each for the HTTP client with its Write and Read
//!   calls and the Write's deadline (`client`), the preshared token or OIDC client-credentials
//!   tokens and their cache (`auth`), the store's id and the check at start (`store`), what each
//!   answer means (`classify`), the Write body (`write_body`), the Read page (`read_page`) and
//!   `Retry-After` (`retry_after`).
//! - [`delivery`]: one continuous stream over the pending rows, with a lane per store: batching,
//!   the per-tuple order rule, retries, isolation of bad rows and failing stores, dead letters.
//! - [`wake`]: how the stream hears of new rows (notifications, the sweep) and why it read.
//! - [`listener`]: the dedicated connection: LISTEN, heartbeat, leadership and wake locks.
//! - [`send_window`]: until when a Write may leave (the lease by the leader's own clock),
//!   asked by each Write's body as the connection writes it.
//! - [`leadership`]: leadership as a lease: renewal, takeover of a stale leader, the fence;
//!   [`lease_clock`]: the clock the lease runs on, which counts suspended time.
//! - [`relay`]: `run` and `drain`: leadership around the delivery stream; [`pass_log`]: what
//!   they say about what it did (the first delivery after start at info).
//! - [`reconcile`]: the delivered rows against what OpenFGA holds, streamed; repair via the
//!   outbox. One file each for its session's SQL (`db`), reading OpenFGA back (`read`), the
//!   comparison (`compare`), the report (`report`), progress and peak memory (`progress`), and
//!   what it is asked to do (`settings`).
//! - [`metrics`], [`http`]: Prometheus metrics and the endpoint (`/livez`, `/readyz`, `/healthz`,
//!   `/metrics`); [`process_metrics`]: the standard `process_*` metrics, from `/proc`;
//!   [`latency_window`]: the delivery latency's percentiles since the last summary.
//! - [`summary`]: the summary log line every minute, and the warning when rows wait too long.
//! - [`systemd`]: readiness and watchdog under `Type=notify`; [`liveness`]: whether the main
//!   loop makes progress (`/livez`, and what feeds the watchdog).
//! - [`reload`]: what a SIGHUP rereads (the settings' files).
//! - [`output`]: what commands print on stdout, ending quietly when the reader goes away.
//! - [`recurring`]: how often a problem that lasts is said again (once a minute).
//! - [`backoff`], [`shutdown`], [`telemetry`]: small pieces every loop shares; [`build_info`]:
//!   the version and git revision (found by `build.rs`).

pub mod backoff;
pub mod build_info;
pub mod cli;
pub mod commands;
pub mod config;
pub mod db;
pub mod delivery;
pub mod http;
pub mod latency_window;
pub mod leadership;
pub mod lease_clock;
pub mod listener;
pub mod liveness;
pub mod metrics;
pub mod openfga;
pub mod output;
pub mod pass_log;
pub mod payload;
pub mod process_metrics;
pub mod reconcile;
pub mod recurring;
pub mod relay;
pub mod reload;
pub mod renewals;
pub mod schema;
pub mod send_window;
pub mod settings;
pub mod shutdown;
pub mod store;
pub mod summary;
pub mod systemd;
pub mod telemetry;
pub mod wake;
