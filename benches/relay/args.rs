//! The bench's command line: which scenarios, at which sizes, against which relay binary.

use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    about = "fga-relay's benchmark: the performance targets' scenarios against the real relay (see BENCHMARKS.md)"
)]
pub(crate) struct Args {
    /// Tiny sizes, a few seconds in all: checks that the benchmark still runs (CI).
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Scenarios to run, comma-separated (default: all of them).
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<Scenario>,
    /// Single-row commits measured in each latency run [1000; smoke 40].
    #[arg(long)]
    pub(crate) latency_commits: Option<usize>,
    /// Commits per second in the latency runs [200] (the real scenario's run at 200 and at
    /// 1,000/s).
    #[arg(long)]
    pub(crate) latency_rate: Option<u32>,
    /// Rows in the burn-down backlog, 2 tuples each [100000; smoke 2000].
    #[arg(long)]
    pub(crate) backlog: Option<usize>,
    /// Dead rows in front of the backlog in the dead-rows scenario [100000; smoke 2000].
    #[arg(long)]
    pub(crate) dead: Option<usize>,
    /// Burn-downs of the dead-rows scenario, clean and with the pile, one pair a round [3; smoke 1].
    #[arg(long)]
    pub(crate) dead_rounds: Option<usize>,
    /// Rows in each burn-down of the speed scenario [20000; smoke 500].
    #[arg(long)]
    pub(crate) speed_backlog: Option<usize>,
    /// Windows (--max-in-flight) the speed scenario compares, comma-separated [1,4,8,16,32].
    #[arg(long, value_delimiter = ',')]
    pub(crate) speed_windows: Vec<usize>,
    /// Delivered rows in the table for the history scenario [1000000; smoke 20000].
    #[arg(long)]
    pub(crate) history: Option<usize>,
    /// Rows in the baseline drainer's burn-down backlog [20000; smoke 300].
    #[arg(long)]
    pub(crate) baseline_backlog: Option<usize>,
    /// Seconds of each pgbench run [6; smoke 1].
    #[arg(long)]
    pub(crate) pgbench_seconds: Option<u64>,
    /// pgbench client counts, comma-separated [1,8].
    #[arg(long, value_delimiter = ',')]
    pub(crate) pgbench_clients: Vec<u32>,
    /// Rounds of pgbench runs, each round one run of each configuration back to back; the
    /// median of the rounds' ratios counts [5; smoke 1].
    #[arg(long)]
    pub(crate) pgbench_runs: Option<usize>,
    /// Lingers (--linger) the linger scenario compares, comma-separated [0,1ms,2ms,5ms; smoke
    /// 0,1ms].
    #[arg(long, value_delimiter = ',')]
    pub(crate) lingers: Vec<String>,
    /// Rounds of the linger scenario's pgbench runs [5; smoke 1].
    #[arg(long)]
    pub(crate) linger_rounds: Option<usize>,
    /// Rounds of the wait scenario [3; smoke 1].
    #[arg(long)]
    pub(crate) wait_rounds: Option<usize>,
    /// Sessions waiting at once in the wait scenario [50; smoke 5].
    #[arg(long)]
    pub(crate) waiters: Option<usize>,
    /// OpenFGA stores the stores scenario spreads its rows over [1000; smoke 20].
    #[arg(long)]
    pub(crate) stores: Option<usize>,
    /// Rows (2 tuples each) of each burn-down of the stores scenario [100000; smoke 2000].
    #[arg(long)]
    pub(crate) stores_backlog: Option<usize>,
    /// Relay burn-downs in each of the real scenario's two settings, each between two of the bare
    /// client's ceilings; the ratio is the median of theirs [5; smoke 1].
    #[arg(long)]
    pub(crate) real_rounds: Option<usize>,
    /// CPUs' worth of time per period OpenFGA and its PostgreSQL get in the real scenario's
    /// confined runs (a cgroup's CPU quota, over a period of 100 ms) [1.2].
    #[arg(long, value_parser = parse_cpus)]
    pub(crate) fga_cpus: Option<f64>,
    /// Pending rows (2 tuples each) of the failing store in the isolation scenario [100000;
    /// smoke 3000].
    #[arg(long)]
    pub(crate) isolation_backlog: Option<usize>,
    /// Seconds the isolation scenario commits the healthy store's rows, one every 0.5 s [600;
    /// smoke 10].
    #[arg(long)]
    pub(crate) isolation_seconds: Option<u64>,
    /// Cases of each property of the delivery stream's model test in the model scenario
    /// [100000; smoke 0: skipped, the test suite runs 256].
    #[arg(long)]
    pub(crate) model_cases: Option<u32>,
    /// Seconds the idle relay is watched [60; smoke 3].
    #[arg(long)]
    pub(crate) idle_seconds: Option<u64>,
    /// The relay binary to measure (default: this tree's, built in release by cargo bench).
    #[arg(long)]
    pub(crate) relay_bin: Option<PathBuf>,
    /// Extra environment for every relay, NAME=VALUE (e.g. FGA_RELAY_BATCH_SIZE=1000).
    #[arg(long = "relay-env", value_parser = parse_kv)]
    pub(crate) relay_env: Vec<(String, String)>,
    /// Profile the relay and its PostgreSQL sessions during the first burn-down with
    /// `perf record --call-graph dwarf` into this file (`perf report -i FILE` reads it).
    #[arg(long)]
    pub(crate) perf: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
    /// A name filter `cargo bench NAME` passes on; ignored.
    #[arg(hide = true)]
    pub(crate) filter: Vec<String>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))
}

fn parse_cpus(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(c) if c > 0.0 && c.is_finite() => Ok(c),
        _ => Err(format!("expected a number of CPUs above 0, got {s:?}")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    Latency,
    Burndown,
    History,
    Dead,
    Speed,
    Writers,
    Linger,
    Wait,
    Idle,
    Baseline,
    Real,
    Stores,
    Isolation,
    Model,
}

/// The sizes of one run, from the flags, `--smoke` and the defaults.
#[derive(Debug, Clone)]
pub(crate) struct Sizes {
    pub(crate) smoke: bool,
    pub(crate) latency_commits: usize,
    pub(crate) latency_warmup: usize,
    pub(crate) latency_rate: u32,
    pub(crate) backlog: usize,
    pub(crate) history: usize,
    pub(crate) dead: usize,
    pub(crate) dead_rounds: usize,
    pub(crate) speed_backlog: usize,
    pub(crate) speed_windows: Vec<usize>,
    pub(crate) baseline_backlog: usize,
    pub(crate) pgbench_seconds: u64,
    pub(crate) pgbench_runs: usize,
    pub(crate) pgbench_clients: Vec<u32>,
    pub(crate) lingers: Vec<String>,
    pub(crate) linger_rounds: usize,
    pub(crate) wait_rounds: usize,
    /// Writes waited for in each latency run of the wait scenario.
    pub(crate) wait_latency_writes: usize,
    /// Rows in the wait scenario's burn-downs.
    pub(crate) wait_backlog: usize,
    pub(crate) waiters: usize,
    pub(crate) wait_writer_seconds: u64,
    pub(crate) wait_timeout_seconds: u64,
    pub(crate) idle_seconds: u64,
    /// Rows (2 tuples each) of the real-OpenFGA scenario's burn-downs.
    pub(crate) real_backlog: usize,
    /// Relay burn-downs in each setting of the real scenario.
    pub(crate) real_rounds: usize,
    /// Stores the stores scenario spreads its rows over, and its rows.
    pub(crate) stores: usize,
    pub(crate) stores_backlog: usize,
    /// The CPU quota of OpenFGA and its PostgreSQL in the real scenario's confined runs.
    pub(crate) fga_cpus: f64,
    pub(crate) isolation_backlog: usize,
    pub(crate) isolation_seconds: u64,
    pub(crate) model_cases: u32,
}

impl Sizes {
    pub(crate) fn from(a: &Args) -> Sizes {
        let s = a.smoke;
        Sizes {
            smoke: s,
            latency_commits: a.latency_commits.unwrap_or(if s { 40 } else { 1000 }),
            latency_warmup: if s { 5 } else { 100 },
            latency_rate: a.latency_rate.unwrap_or(200).max(1),
            backlog: a.backlog.unwrap_or(if s { 2_000 } else { 100_000 }).max(1),
            history: a.history.unwrap_or(if s { 20_000 } else { 1_000_000 }),
            dead: a.dead.unwrap_or(if s { 2_000 } else { 100_000 }),
            dead_rounds: a.dead_rounds.unwrap_or(if s { 1 } else { 3 }).max(1),
            speed_backlog: a
                .speed_backlog
                .unwrap_or(if s { 500 } else { 20_000 })
                .max(1),
            speed_windows: if a.speed_windows.is_empty() {
                if s {
                    vec![1, 16]
                } else {
                    vec![1, 4, 8, 16, 32]
                }
            } else {
                a.speed_windows.clone()
            },
            baseline_backlog: a
                .baseline_backlog
                .unwrap_or(if s { 300 } else { 20_000 })
                .max(1),
            pgbench_seconds: a.pgbench_seconds.unwrap_or(if s { 1 } else { 6 }).max(1),
            pgbench_runs: a.pgbench_runs.unwrap_or(if s { 1 } else { 5 }).max(1),
            pgbench_clients: if a.pgbench_clients.is_empty() {
                vec![1, 8]
            } else {
                a.pgbench_clients.clone()
            },
            lingers: if !a.lingers.is_empty() {
                a.lingers.clone()
            } else if s {
                vec!["0".into(), "1ms".into()]
            } else {
                ["0", "1ms", "2ms", "5ms"].map(String::from).to_vec()
            },
            linger_rounds: a.linger_rounds.unwrap_or(if s { 1 } else { 5 }).max(1),
            wait_rounds: a.wait_rounds.unwrap_or(if s { 1 } else { 3 }).max(1),
            wait_latency_writes: if s { 10 } else { 100 },
            wait_backlog: if s { 1_000 } else { 50_000 },
            waiters: a.waiters.unwrap_or(if s { 5 } else { 50 }).max(1),
            wait_writer_seconds: if s { 1 } else { 5 },
            wait_timeout_seconds: if s { 1 } else { 5 },
            idle_seconds: a.idle_seconds.unwrap_or(if s { 3 } else { 60 }).max(1),
            real_backlog: if s { 500 } else { 20_000 },
            real_rounds: a.real_rounds.unwrap_or(if s { 1 } else { 5 }).max(1),
            stores: a.stores.unwrap_or(if s { 20 } else { 1_000 }).max(1),
            stores_backlog: a
                .stores_backlog
                .unwrap_or(if s { 2_000 } else { 100_000 })
                .max(1),
            fga_cpus: a.fga_cpus.unwrap_or(1.2),
            isolation_backlog: a
                .isolation_backlog
                .unwrap_or(if s { 3_000 } else { 100_000 }),
            isolation_seconds: a
                .isolation_seconds
                .unwrap_or(if s { 10 } else { 600 })
                .max(1),
            model_cases: a.model_cases.unwrap_or(if s { 0 } else { 100_000 }),
        }
    }
}
