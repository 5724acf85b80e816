//! The bench's harness: its own PostgreSQL cluster (production durability, pg_stat_statements),
//! a role of the relay's own so that its statements and sessions can be told from the bench's,
//! and ways to run, watch and stop relays.

use crate::args::{Args, Sizes};
use crate::common;
use crate::common::fga::Fga;
use crate::common::pg::{PgOptions, TestDb};
use crate::common::relay::RelayProc;
use crate::cpu::{CpuSnap, loadavg, proc_stat};
use anyhow::{Context, Result, bail};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// The relay's claim, exactly as it runs it (the table name is the default one).
pub(crate) const CLAIM_SQL: &str = include_str!("../../sql/queries/claim.sql");
/// The relay's default `--batch-size`, for EXPLAINing its claim.
pub(crate) const BATCH: i64 = 500;

pub(crate) struct Bench {
    pub(crate) db: TestDb,
    /// OpenFGA's own database, as in production: a cluster apart from the outbox's, with the
    /// same durability. OpenFGA's memory datastore, which the tests use, is not made for
    /// production loads: Writes into a store of 100,000 tuples ran into its deadline.
    pub(crate) fga_db: TestDb,
    pub(crate) fga_postmaster: u32,
    /// The bench's own connection, as `postgres`.
    pub(crate) admin: Client,
    pub(crate) relay_bin: PathBuf,
    pub(crate) relay_env: Vec<(String, String)>,
    /// `DATABASE_URL` for relays: the `fga_relay` role, so that pg_stat_statements and
    /// pg_stat_activity tell the relay's statements and sessions from the bench's.
    pub(crate) relay_url: String,
    pub(crate) postmaster: u32,
    /// The bench's own session's pid ([`Bench::admin`]'s).
    pub(crate) admin_backend: u32,
    /// Where to write the profile of the next burn-down, if asked for.
    pub(crate) perf: std::sync::Mutex<Option<PathBuf>>,
}

/// The pid of the postmaster serving `client`: its session's parent.
async fn postmaster_of(client: &Client) -> Result<u32> {
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    proc_stat(backend as u32)
        .map(|s| s.ppid)
        .context("the postmaster's pid")
}

impl Bench {
    /// A store of its own on a real OpenFGA over [`Bench::fga_db`], behind the tests' proxy.
    pub(crate) fn fga(&self) -> Fga {
        Fga::builder().postgres(&self.fga_db.uri()).start()
    }

    pub(crate) async fn start(args: &Args) -> Result<Bench> {
        let db = TestDb::start_with(PgOptions {
            durable: true,
            settings: vec![(
                "shared_preload_libraries".into(),
                "pg_stat_statements".into(),
            )],
            ..PgOptions::default()
        });
        let admin = db.connect().await;
        admin
            .batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; \
                 CREATE ROLE fga_relay LOGIN SUPERUSER",
            )
            .await
            .context("set up the bench's database")?;
        let relay_url = db.url().replace("user=postgres", "user=fga_relay");
        let postmaster = postmaster_of(&admin).await?;
        let admin_backend: i32 = admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let fga_db = TestDb::start_with(PgOptions {
            durable: true,
            ..PgOptions::default()
        });
        let fga_postmaster = postmaster_of(&fga_db.connect().await).await?;
        let bench = Bench {
            db,
            fga_db,
            fga_postmaster,
            admin,
            relay_bin: args
                .relay_bin
                .clone()
                .unwrap_or_else(|| PathBuf::from(common::relay::BIN)),
            relay_env: args.relay_env.clone(),
            relay_url,
            postmaster,
            admin_backend: admin_backend as u32,
            perf: std::sync::Mutex::new(args.perf.clone()),
        };
        bench.migrate()?;
        Ok(bench)
    }

    /// `fga-relay migrate`: creates the schema, or puts the relay's trigger back.
    pub(crate) fn migrate(&self) -> Result<()> {
        let out = self
            .relay_command("migrate")
            .env("DATABASE_URL", self.db.url())
            .output()
            .context("run fga-relay migrate")?;
        if !out.status.success() {
            bail!(
                "fga-relay migrate failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub(crate) fn relay_command(&self, sub: &str) -> Command {
        common::relay::command(&self.relay_bin, &[sub])
    }

    /// Starts `fga-relay run` with production settings (the defaults: sweep 30 s, heartbeat
    /// 5 s, batch 500, info logs), `extra` and `--relay-env` on top, and waits until it leads
    /// and has settled into waiting for notifications.
    pub(crate) async fn start_relay(&self, fga: &Fga, extra: &[(&str, &str)]) -> Result<RelayProc> {
        let mut c = self.relay_command("run");
        c.env("DATABASE_URL", &self.relay_url)
            .env("FGA_API_URL", fga.url())
            .env("FGA_STORE_ID", fga.store_id())
            .env("FGA_RELAY_HTTP_ADDR", "off")
            .env("RUST_LOG", "info");
        for (k, v) in extra {
            c.env(k, v);
        }
        for (k, v) in &self.relay_env {
            c.env(k, v);
        }
        let relay = RelayProc::spawn(c);
        relay.wait_for_log("delivering (leader)").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(relay)
    }

    /// SIGTERM, wait for the exit, and say whether it logged warnings or errors (other than
    /// those that contain one of `expected`).
    pub(crate) async fn stop_relay(&self, mut relay: RelayProc, what: &str, expected: &[&str]) {
        relay.term();
        let status = relay.wait_exit(Duration::from_secs(20)).await;
        let logs = relay.logs();
        let bad: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .filter(|l| !expected.iter().any(|e| l.contains(e)))
            .collect();
        if !status.success() || !bad.is_empty() {
            println!(
                "  note: the relay ({what}) exited with {status} and logged {} warnings/errors; the first {}:",
                bad.len(),
                bad.len().min(5)
            );
            for line in bad.iter().take(5) {
                println!("    {line}");
            }
        }
    }

    pub(crate) async fn print_header(&self, args: &Args, sizes: &Sizes) -> Result<()> {
        let version: String = self.admin.query_one("SELECT version()", &[]).await?.get(0);
        let settings = self
            .admin
            .query(
                "SELECT name || '=' || setting FROM pg_settings WHERE name IN \
                 ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', \
                  'max_wal_size', 'wal_level') ORDER BY name",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join(" ");
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("?")
            .trim()
            .to_owned();
        let mem_gb = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0 / 1024.0)
            .unwrap_or(0.0);
        let commit = Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "?".into());
        println!(
            "fga-relay benchmark{}",
            if args.smoke { " (smoke)" } else { "" }
        );
        println!(
            "machine: {} CPUs ({cpu}), {mem_gb:.0} GB",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("server:  {version}");
        println!("         {settings}");
        println!("relay:   {} (tree at {commit})", self.relay_bin.display());
        if !self.relay_env.is_empty() {
            println!("         with {:?}", self.relay_env);
        }
        println!("sizes:   {sizes:?}");
        println!("load:    {}", loadavg());
        Ok(())
    }

    pub(crate) async fn truncate(&self) -> Result<()> {
        self.admin
            .batch_execute("TRUNCATE fga_outbox; CHECKPOINT")
            .await?;
        Ok(())
    }

    /// An empty table with fresh statistics, as the clean side of a comparison starts.
    pub(crate) async fn empty_vacuumed(&self) -> Result<()> {
        self.truncate().await?;
        self.admin
            .batch_execute("VACUUM ANALYZE fga_outbox")
            .await?;
        Ok(())
    }

    pub(crate) async fn pending_exists(&self) -> Result<bool> {
        Ok(self
            .admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM fga_outbox \
                 WHERE processed_at IS NULL AND failed_at IS NULL)",
                &[],
            )
            .await?
            .get(0))
    }

    /// Polls until no row is pending; returns when that was first seen.
    pub(crate) async fn wait_drained(&self, timeout: Duration, every: Duration) -> Result<Instant> {
        common::relay::poll_until(timeout, every, || async {
            matches!(self.pending_exists().await, Ok(false))
        })
        .await
        .with_context(|| format!("rows still pending after {timeout:?}"))
    }

    pub(crate) async fn count(&self, sql: &str) -> Result<i64> {
        Ok(self.admin.query_one(sql, &[]).await?.get(0))
    }

    /// The pids of the relay's PostgreSQL sessions.
    pub(crate) async fn relay_backends(&self) -> Result<Vec<u32>> {
        Ok(self
            .admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE usename = 'fga_relay'",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, i32>(0) as u32)
            .collect())
    }

    pub(crate) async fn cpu(&self, relay: Option<u32>) -> Result<CpuSnap> {
        self.cpu_with(relay, None).await
    }

    /// As [`Bench::cpu`], also counting a pgbench process.
    pub(crate) async fn cpu_with(
        &self,
        relay: Option<u32>,
        pgbench: Option<u32>,
    ) -> Result<CpuSnap> {
        let backends = self.relay_backends().await?;
        Ok(CpuSnap::take(
            relay,
            &backends,
            self.admin_backend,
            [self.postmaster, self.fga_postmaster],
            pgbench,
        ))
    }

    /// `BEGIN; EXPLAIN (ANALYZE, BUFFERS) <the claim>; ROLLBACK` with the relay's parameters
    /// (no rows in hand, no store left out, batch 500, no sequential scans), as a generic plan:
    /// the relay runs the claim as a prepared statement, and after five executions PostgreSQL
    /// settles on the generic plan when it is no dearer than the custom ones.
    pub(crate) async fn explain_claim(&self) -> Result<String> {
        let body: String = CLAIM_SQL
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        self.admin
            .batch_execute(&format!(
                "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
                 SET LOCAL enable_seqscan = off; PREPARE bench_claim(bigint[], text[], bigint) AS {body}"
            ))
            .await?;
        let rows = self
            .admin
            .simple_query(&format!(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE bench_claim('{{}}', '{{}}', {BATCH})"
            ))
            .await;
        let cleanup = self.admin.batch_execute("ROLLBACK; DEALLOCATE ALL").await;
        let mut out = String::new();
        for m in rows? {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                let _ = writeln!(out, "    {}", r.get(0).unwrap_or(""));
            }
        }
        cleanup?;
        Ok(out)
    }
}
