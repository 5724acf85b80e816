//! The command line: parses it and hands the work to the command (`commands/`), whose flags come
//! with their environment fallbacks (the OpenFGA ones named as the `fga` CLI names them).
//!
//! Exit status: 0 success; 1 failure (for `drain`: rows still pending at the timeout); 3 for
//! `drain`: rows dead-lettered, none left pending (unless `--allow-dead`); 2 bad
//! settings, with one line naming the setting; 143 or 130 when a second SIGTERM or SIGINT ended
//! `run` or `drain` at once (see `shutdown`); 141 when stdout's reader went away (see `output`).

use crate::commands::{self, Failure};
use crate::config::LogFormat;
use crate::settings::{DEFAULT_LOG_FORMAT, or_default};
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "fga-relay",
    version = crate::build_info::VERSION_LINE,
    about = "Delivers a PostgreSQL outbox (fga_outbox) to OpenFGA's Write API, at least once, in order."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format: text, or json for one JSON object a line [possible values: text, json].
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
    // Each usage is written out: clap's own, in its errors, shows the flags the environment
    // gave (DATABASE_URL, FGA_STORE_ID) as if they were required.
    /// Create the outbox schema or upgrade it, keeping every row (idempotent).
    #[command(
        override_usage = "fga-relay migrate [OPTIONS]",
        after_help = "Examples:\n  fga-relay migrate\n  fga-relay migrate --check   # exit 1 when it would change something\n  DATABASE_URL=postgres://owner@db/app fga-relay migrate --table fga_outbox"
    )]
    Migrate(commands::Migrate),
    /// Check `run`'s settings (its flags and variables, as `run` checks them) and its endpoint's
    /// address, PostgreSQL (no transaction pooler, the schema, the role's grants) and OpenFGA
    /// (credentials, store, model) without starting: one line each; exit 0 all pass, 1 one
    /// fails, 2 bad settings.
    #[command(
        override_usage = "fga-relay check [OPTIONS]",
        after_help = "Examples:\n  fga-relay check\n  DATABASE_URL=postgres://relay@db/app FGA_STORE_ID=01J... fga-relay check"
    )]
    Check(commands::Check),
    /// Print the schema SQL, for your own migration tool.
    #[command(
        override_usage = "fga-relay sql [OPTIONS]",
        after_help = "Examples:\n  fga-relay sql > migrations/0042_fga_outbox.sql\n  fga-relay sql --roles"
    )]
    Sql(commands::Sql),
    /// Run the relay: LISTEN, deliver, sweep, serve /healthz and /metrics, until SIGTERM/SIGINT.
    #[command(
        override_usage = "fga-relay run [OPTIONS]",
        after_help = "Examples:\n  DATABASE_URL=postgres://relay@db/app FGA_API_URL=http://openfga:8080 FGA_STORE_ID=01J... fga-relay run\n  PGHOST=db PGUSER=relay PGDATABASE=app FGA_STORE_NAME=prod fga-relay run --http-addr 0.0.0.0:9464"
    )]
    Run(commands::Run),
    /// Deliver every row pending now, then say what became of them: exit 0 when all were
    /// delivered, 1 when some are still pending at the timeout, 3 when some were dead-lettered
    /// (0 with --allow-dead).
    #[command(
        override_usage = "fga-relay drain [OPTIONS]",
        after_help = "Examples:\n  fga-relay drain --timeout 5m\n  fga-relay drain --allow-dead   # a gate that lets dead rows through"
    )]
    Drain(commands::Drain),
    /// Pending, dead and delivered counts, and the age of the oldest pending row.
    #[command(
        after_help = "Examples:\n  fga-relay status\n  fga-relay status --json",
        override_usage = "fga-relay status [OPTIONS]"
    )]
    Status(commands::Status),
    /// Send dead rows back to pending: exit 1 when an id given was left as it is (each said,
    /// with why).
    #[command(after_help = "Examples:\n  fga-relay retry 1042 1043\n  fga-relay retry --dead")]
    Retry(commands::Retry),
    /// Delete delivered rows older than a duration, in small batches. Never touches pending or
    /// dead rows.
    #[command(
        after_help = "Examples:\n  fga-relay prune --older-than 90d",
        override_usage = "fga-relay prune [OPTIONS] --older-than <DURATION>"
    )]
    Prune(commands::Prune),
    /// Compare what the delivered rows say OpenFGA must hold with what it holds: exit 0 in
    /// step, 1 on drift, 2 on error. --repair enqueues the corrections.
    #[command(
        override_usage = "fga-relay reconcile [OPTIONS]",
        after_help = "Examples:\n  fga-relay reconcile --since 1h\n  fga-relay reconcile --json\n  fga-relay reconcile --repair"
    )]
    Reconcile(commands::Reconcile),
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
            crate::telemetry::error_line(&e.to_string());
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
            crate::telemetry::error_line(&format!("cannot start the runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(Failure::Config(msg)) => {
            crate::telemetry::error_line(&msg);
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            crate::telemetry::error_line(&format!("{e:#}"));
            ExitCode::from(1)
        }
        Err(Failure::LockWait(e, _)) => {
            crate::telemetry::error_line(&e);
            ExitCode::from(1)
        }
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, Failure> {
    match command {
        Command::Migrate(c) => c.execute().await,
        Command::Check(c) => c.execute().await,
        Command::Sql(c) => c.execute().await,
        Command::Run(c) => c.execute().await,
        Command::Drain(c) => c.execute().await,
        Command::Status(c) => c.execute().await,
        Command::Retry(c) => c.execute().await,
        Command::Prune(c) => c.execute().await,
        Command::Reconcile(c) => c.execute().await,
    }
}
