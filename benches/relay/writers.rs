//! Scenario: what the wake-up trigger costs inserting transactions, against no trigger and a
//! plain NOTIFY trigger, at 1 and 8 clients.

use crate::args::Sizes;
use crate::common;
use crate::cpu::CpuUse;
use crate::harness::Bench;
use crate::pgbench::{PGBENCH_SCRIPT, pgbench, pgbench_path, pgbench_tps};
use crate::stats::median;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TriggerKind {
    None,
    Relay,
    PlainNotify,
    /// A statement-level trigger whose function does nothing: what firing any trigger costs.
    Empty,
    /// No trigger, and without `fga_outbox_unnamed_idx` (the pending rows naming no store): what
    /// that index costs writers of such rows, against [`TriggerKind::None`].
    NoneWithoutUnnamedIndex,
}

impl TriggerKind {
    /// Without the relay's trigger, the relay says so at start and whenever a sweep finds rows.
    pub(crate) fn expected_warnings(self) -> &'static [&'static str] {
        match self {
            TriggerKind::Relay => &[],
            _ => &["wake-up trigger", "the sweep found rows"],
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            TriggerKind::None => "no trigger",
            TriggerKind::Relay => "relay's trigger",
            TriggerKind::PlainNotify => "plain NOTIFY trigger",
            TriggerKind::Empty => "empty trigger",
            TriggerKind::NoneWithoutUnnamedIndex => "no trigger, no unnamed idx",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct WriterRun {
    pub(crate) clients: u32,
    pub(crate) trigger: TriggerKind,
    pub(crate) tps: Vec<f64>,
    pub(crate) relay_cpu: Vec<f64>,
    /// Transactions run and notifications the relay received, over all runs.
    pub(crate) transactions: i64,
    pub(crate) notifications: f64,
    /// CPU share of processes other than the bench's, per run.
    pub(crate) others: Vec<f64>,
}

impl WriterRun {
    /// NOTIFYs per 1000 transactions: each notifying transaction took PostgreSQL's global
    /// NOTIFY lock at commit (notifications of different transactions are never folded).
    pub(crate) fn notify_rate(&self) -> f64 {
        self.notifications / self.transactions.max(1) as f64 * 1000.0
    }

    pub(crate) fn median(&self) -> f64 {
        median(self.tps.clone())
    }
}

/// The median over rounds of `kind`'s throughput relative to no trigger in the same round:
/// runs of one round are back to back, so they share the machine's load, whatever else runs.
pub(crate) fn round_ratio(runs: &[WriterRun], clients: u32, kind: TriggerKind) -> f64 {
    let find = |k: TriggerKind| runs.iter().find(|r| r.clients == clients && r.trigger == k);
    let (Some(a), Some(base)) = (find(kind), find(TriggerKind::None)) else {
        return f64::NAN;
    };
    median(a.tps.iter().zip(&base.tps).map(|(x, b)| x / b).collect())
}

impl Bench {
    pub(crate) async fn set_trigger(&self, kind: TriggerKind) -> Result<()> {
        match kind {
            TriggerKind::Relay => self.migrate()?,
            TriggerKind::None => {
                // The index a run without it dropped comes back.
                self.migrate()?;
                self.admin
                    .batch_execute("DROP TRIGGER IF EXISTS fga_outbox_notify ON fga_outbox")
                    .await?
            }
            TriggerKind::NoneWithoutUnnamedIndex => {
                self.admin
                    .batch_execute(
                        "DROP TRIGGER IF EXISTS fga_outbox_notify ON fga_outbox; \
                         DROP INDEX IF EXISTS fga_outbox_unnamed_idx",
                    )
                    .await?
            }
            TriggerKind::PlainNotify => {
                self.bench_trigger("PERFORM pg_notify('fga_outbox', '');")
                    .await?
            }
            TriggerKind::Empty => self.bench_trigger("").await?,
        }
        Ok(())
    }

    /// Installs a statement-level trigger on the outbox in place of the relay's, running `body`.
    async fn bench_trigger(&self, body: &str) -> Result<()> {
        self.admin
            .batch_execute(&format!(
                "CREATE OR REPLACE FUNCTION bench_trigger() RETURNS trigger \
                 LANGUAGE plpgsql AS $$ BEGIN {body} RETURN NULL; END $$; \
                 DROP TRIGGER IF EXISTS fga_outbox_notify ON fga_outbox; \
                 CREATE TRIGGER fga_outbox_notify AFTER INSERT ON fga_outbox \
                 FOR EACH STATEMENT EXECUTE FUNCTION bench_trigger()"
            ))
            .await?;
        Ok(())
    }

    /// pgbench and its script. Without pgbench the scenario fails, saying what to install: a
    /// scenario that did not run must never look measured.
    pub(crate) async fn pgbench_setup(&self) -> Result<Pgbench> {
        let Some(bin) = pgbench_path() else {
            anyhow::bail!(
                "pgbench not found: install PostgreSQL's server binaries (Debian: apt-get install \
                 postgresql; .ci/run installs them), or set PGBENCH to its path"
            );
        };
        let socket_dir = self
            .db
            .socket_dir()
            .context("the bench runs its own cluster")?
            .to_owned();
        let script =
            std::env::temp_dir().join(format!("fga-relay-bench-{}.sql", std::process::id()));
        std::fs::write(&script, PGBENCH_SCRIPT)?;
        Ok(Pgbench {
            bin,
            socket_dir,
            script,
        })
    }

    /// One pgbench run of `secs` with `clients`, `kind` installed, beside a relay sweeping every
    /// 100 ms (so that it delivers without a trigger too) with `relay` settings on top, or with
    /// no relay at all when `relay` is None. With a relay, returns once every row is delivered.
    pub(crate) async fn writer_run(
        &self,
        pg: &Pgbench,
        clients: u32,
        secs: u64,
        kind: TriggerKind,
        relay: Option<&[(&str, &str)]>,
    ) -> Result<OneRun> {
        self.truncate().await?;
        self.set_trigger(kind).await?;
        let fga = self.fga();
        let relay = match relay {
            Some(extra) => {
                let mut env = vec![
                    ("FGA_RELAY_SWEEP_INTERVAL", "100ms"),
                    ("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0"),
                ];
                env.extend_from_slice(extra);
                let relay = self.start_relay(&fga, &env).await?;
                let metrics = relay.endpoint().await;
                let notified0 = notifications(&metrics).await;
                Some((relay, metrics, notified0))
            }
            None => None,
        };
        let relay_pid = relay.as_ref().map(|(r, _, _)| r.pid());
        let child = pgbench(&pg.bin, &pg.socket_dir, &pg.script, clients, secs)?;
        let pgbench_pid = child.id();
        let finished = tokio::task::spawn_blocking(move || child.wait_with_output());
        // CPU is measured over the middle of the run, while every writer's session exists: a
        // process that has exited no longer shows its CPU time.
        let margin = if secs >= 3 { 1.0 } else { 0.2 };
        tokio::time::sleep(Duration::from_secs_f64(margin)).await;
        let cpu0 = self.cpu_with(relay_pid, Some(pgbench_pid)).await?;
        tokio::time::sleep(Duration::from_secs_f64(secs as f64 - 2.0 * margin)).await;
        let cpu1 = self.cpu_with(relay_pid, Some(pgbench_pid)).await?;
        let tps = pgbench_tps(finished.await??)?;
        let mut notified = 0.0;
        if let Some((relay, metrics, notified0)) = relay {
            notified = notifications(&metrics).await - notified0;
            self.wait_drained(Duration::from_secs(120), Duration::from_millis(20))
                .await?;
            self.stop_relay(relay, kind.label(), kind.expected_warnings())
                .await;
        }
        let rows = self.count("SELECT count(*) FROM fga_outbox").await?;
        Ok(OneRun {
            tps,
            rows,
            delivered: relay_pid.is_some(),
            notified,
            cpu: cpu0.until(&cpu1),
        })
    }

    pub(crate) async fn writers(&self, sizes: &Sizes) -> Result<Vec<WriterRun>> {
        let pg = self.pgbench_setup().await?;
        let kinds = [
            TriggerKind::None,
            TriggerKind::Relay,
            TriggerKind::PlainNotify,
            TriggerKind::NoneWithoutUnnamedIndex,
        ];
        let mut runs: Vec<WriterRun> = Vec::new();
        println!(
            "pgbench -M prepared, one single-row INSERT per transaction, {} s a run, {} round(s) \
             of the four configurations back to back; a relay runs throughout (sweep 100 ms, so \
             that it delivers without a trigger too)",
            sizes.pgbench_seconds, sizes.pgbench_runs
        );
        for &clients in &sizes.pgbench_clients {
            for kind in kinds {
                runs.push(WriterRun {
                    clients,
                    trigger: kind,
                    tps: Vec::new(),
                    relay_cpu: Vec::new(),
                    transactions: 0,
                    notifications: 0.0,
                    others: Vec::new(),
                });
            }
            for run in 0..sizes.pgbench_runs {
                // A different order each round, so that a drift in the machine's load does not
                // always fall on the same configuration.
                let mut order = kinds;
                order.rotate_left(run % kinds.len());
                for kind in order {
                    let one = self
                        .writer_run(&pg, clients, sizes.pgbench_seconds, kind, Some(&[]))
                        .await?;
                    println!("  {clients} client(s), {:<21} {}", kind.label(), one.line());
                    let run = runs
                        .iter_mut()
                        .find(|r| r.clients == clients && r.trigger == kind)
                        .expect("set up above");
                    run.tps.push(one.tps);
                    run.relay_cpu.push(one.cpu.relay / one.cpu.wall);
                    run.transactions += one.rows;
                    run.notifications += one.notified;
                    run.others.push(one.cpu.others() / one.cpu.wall);
                }
            }
        }
        self.set_trigger(TriggerKind::Relay).await?;
        for &clients in &sizes.pgbench_clients {
            for r in runs.iter().filter(|r| r.clients == clients) {
                println!(
                    "  median, {clients} client(s), {:<21} {:>7.0} tps ({:+.1}% vs. no trigger, \
                     median of the rounds); {:.2} NOTIFYs per 1000 transactions; relay CPU \
                     {:.0}%, other processes {:.0}%",
                    r.trigger.label(),
                    r.median(),
                    (round_ratio(&runs, clients, r.trigger) - 1.0) * 100.0,
                    r.notify_rate(),
                    median(r.relay_cpu.clone()) * 100.0,
                    median(r.others.clone()) * 100.0
                );
            }
        }
        Ok(runs)
    }
}

/// Where pgbench is and what it runs.
pub(crate) struct Pgbench {
    bin: PathBuf,
    socket_dir: PathBuf,
    script: PathBuf,
}

impl Drop for Pgbench {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.script);
    }
}

/// One pgbench run beside a relay.
pub(crate) struct OneRun {
    pub(crate) tps: f64,
    /// Rows written.
    pub(crate) rows: i64,
    /// Whether a relay ran and delivered them all.
    pub(crate) delivered: bool,
    /// Notifications that reached the relay.
    pub(crate) notified: f64,
    /// CPU per party over the middle of the run.
    pub(crate) cpu: CpuUse,
}

impl OneRun {
    pub(crate) fn line(&self) -> String {
        let pct = |x: f64| x / self.cpu.wall * 100.0;
        format!(
            "{:>7.0} tps; {} rows, {}; {:.0} notifications reached the relay; CPU: relay {:.0}%, \
             its sessions {:.0}%, writers' sessions and the rest of PostgreSQL {:.0}%, pgbench \
             {:.0}%, other processes {:.0}%",
            self.tps,
            self.rows,
            if self.delivered {
                "all delivered"
            } else {
                "no relay"
            },
            self.notified,
            pct(self.cpu.relay),
            pct(self.cpu.relay_pg),
            pct(self.cpu.pg_other),
            pct(self.cpu.pgbench),
            pct(self.cpu.others())
        )
    }
}

/// Notifications the relay has received, from its `/metrics`.
async fn notifications(base: &str) -> f64 {
    let metrics = common::metrics::scrape(base).await;
    metrics
        .get("fga_relay_notifications_total")
        .copied()
        .unwrap_or(0.0)
}
