//! fga-relay's benchmark: the performance targets' figures, measured with the real relay
//! binary, a PostgreSQL cluster of its own with production settings (fsync on), and a real
//! OpenFGA on a PostgreSQL cluster of its own, behind the tests' proxy. Everything talks over
//! loopback or Unix sockets and stops by itself.
//!
//! ```sh
//! cargo bench --bench relay                 # everything (burn-downs are bound by OpenFGA)
//! cargo bench --bench relay -- --smoke      # tiny sizes, minutes: does it still run?
//! cargo bench --bench relay -- --only latency,burndown --backlog 50000
//! cargo bench --bench relay -- --help
//! ```
//!
//! BENCHMARKS.md has the results, where the time goes, and what each scenario means. This is a
//! program, not a test: nothing here asserts a timing; it prints a table and whether each of
//! the performance targets is met.
//!
//! Here: the order of the scenarios; `args.rs` is the command line. `harness.rs` is the bench
//! (its cluster and how it runs relays, over the tests' own helpers in `tests/common/`); one file
//! a scenario (`latency`, `burndown`, `history`, `dead`, `speed`, `writers`, `linger`, `wait`,
//! `idle`, `baseline`, `real` with its latency runs in `real_latency.rs`, `stores`,
//! `isolation`); `cpu.rs` (`/proc`), `cgroup.rs` (a CPU quota), `pgbench.rs`, `explain.rs`,
//! `stats.rs` are what they measure with; `summary.rs` prints the table.

// The tests' helpers the bench runs on (TLS and the freezing proxy serve only the tests). The
// bench uses a part of each; what no test uses either is reported by the test targets.
#[path = "../../tests/common"]
#[allow(dead_code)]
mod common {
    pub mod fga;
    pub mod metrics;
    pub mod pg;
    pub mod procs;
    pub mod relay;
}

mod args;
mod baseline;
mod burndown;
mod cgroup;
mod cpu;
mod dead;
mod explain;
mod harness;
mod history;
mod idle;
mod isolation;
mod latency;
mod linger;
mod model;
mod pgbench;
mod real;
mod real_latency;
mod speed;
mod stats;
mod stores;
mod summary;
mod wait;
mod writers;

use anyhow::Result;
use args::{Args, Scenario, Sizes};
use clap::Parser;
use cpu::loadavg;
use harness::Bench;
use std::time::Instant;
use summary::Results;

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let sizes = Sizes::from(&args);
    let all = [
        Scenario::Latency,
        Scenario::Burndown,
        Scenario::History,
        Scenario::Dead,
        Scenario::Speed,
        Scenario::Writers,
        Scenario::Linger,
        Scenario::Wait,
        Scenario::Idle,
        Scenario::Baseline,
        Scenario::Real,
        Scenario::Stores,
        Scenario::Isolation,
        Scenario::Model,
    ];
    let chosen: Vec<Scenario> = if args.only.is_empty() {
        all.to_vec()
    } else {
        all.into_iter().filter(|s| args.only.contains(s)).collect()
    };
    let started = Instant::now();
    let bench = Bench::start(&args).await?;
    bench.print_header(&args, &sizes).await?;
    let mut results = Results::default();
    for scenario in chosen {
        let t = Instant::now();
        println!("\n=== {scenario:?} === (load average {})", loadavg());
        match scenario {
            Scenario::Latency => results.latency = Some(bench.latency(&sizes).await?),
            Scenario::Burndown => results.burndown = Some(bench.burndown(&sizes).await?),
            Scenario::History => results.history = Some(bench.history(&sizes).await?),
            Scenario::Dead => results.dead = Some(bench.dead(&sizes).await?),
            Scenario::Speed => results.speed = Some(bench.speed(&sizes).await?),
            Scenario::Writers => results.writers = bench.writers(&sizes).await?,
            Scenario::Linger => results.linger = bench.linger(&sizes).await?,
            Scenario::Wait => results.wait = Some(bench.wait(&sizes).await?),
            Scenario::Idle => results.idle = Some(bench.idle(&sizes).await?),
            Scenario::Baseline => results.baseline = Some(bench.baseline(&sizes).await?),
            Scenario::Real => results.real = Some(bench.real(&sizes).await?),
            Scenario::Stores => results.stores = Some(bench.stores(&sizes).await?),
            Scenario::Isolation => results.isolation = Some(bench.isolation(&sizes).await?),
            Scenario::Model => results.model = model::model(&sizes).await?,
        }
        println!(
            "({scenario:?}: {:.1} s; load average {})",
            t.elapsed().as_secs_f64(),
            loadavg()
        );
    }
    results.print_summary(&sizes);
    println!(
        "\nbenchmark done in {:.0} s; load average now {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    Ok(())
}
