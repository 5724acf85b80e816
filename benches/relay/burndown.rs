//! Scenario: a backlog burnt down by a warm relay (optionally profiled with `perf`).

use crate::args::Sizes;
use crate::common::fga::Fga;
use crate::cpu::CpuUse;
use crate::harness::Bench;
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default)]
pub(crate) struct BurnDown {
    pub(crate) rows: usize,
    pub(crate) tuples: usize,
    /// SIGCONT to the relay → no row pending.
    pub(crate) secs: f64,
    /// SIGCONT → the proxy received the last Write; `None` when the relay wrote to OpenFGA
    /// directly (its Writes are then not counted either).
    pub(crate) last_write_secs: Option<f64>,
    pub(crate) writes: usize,
    pub(crate) cpu: CpuUse,
    pub(crate) insert_secs: f64,
    pub(crate) explain: String,
    /// The relay's statements during the burn-down: (calls, total ms, rows, query).
    pub(crate) statements: Vec<(i64, f64, i64, String)>,
}

impl BurnDown {
    pub(crate) fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.secs
    }
    pub(crate) fn tuples_per_s(&self) -> f64 {
        self.tuples as f64 / self.secs
    }
    /// The relay's own cost: milliseconds of CPU of the relay, its PostgreSQL sessions and the
    /// rest of the outbox's PostgreSQL (not the bench's own session), per 1,000 tuples.
    pub(crate) fn cost_ms_per_1000(&self) -> f64 {
        (self.cpu.relay + self.cpu.relay_pg + self.cpu.pg_other.max(0.0)) * 1e6
            / self.tuples.max(1) as f64
    }
    pub(crate) fn print(&self, label: &str) {
        let writes = match self.last_write_secs {
            Some(last) => format!(
                "{} Writes ({:.1} tuples each); last Write received at {last:.3} s",
                self.writes,
                self.tuples as f64 / self.writes.max(1) as f64
            ),
            None => "Writes straight to OpenFGA, not counted".to_owned(),
        };
        println!(
            "  {label}: {} rows ({} tuples) in {:.3} s: {:.0} rows/s, {:.0} tuples/s, {writes}",
            self.rows,
            self.tuples,
            self.secs,
            self.rows_per_s(),
            self.tuples_per_s(),
        );
        println!("    {}", self.cpu.line());
        if self.writes > 0 {
            println!(
                "    OpenFGA's CPU: {:.0} µs per Write; the proxy's: {:.0} µs per Write",
                self.cpu.openfga / self.writes as f64 * 1e6,
                self.cpu.proxy / self.writes as f64 * 1e6
            );
        }
        let total: f64 = self.statements.iter().map(|s| s.1).sum();
        println!(
            "    the relay's statements, {:.0} ms of execution in PostgreSQL ({:.0}% of the wall \
             time):",
            total,
            total / 1e3 / self.secs * 100.0
        );
        for (calls, ms_total, rows, q) in self.statements.iter().take(6) {
            let q: String = q.chars().take(80).collect();
            println!(
                "    {calls:>7} calls {ms_total:>8.1} ms ({:>6.3} ms each, {rows:>7} rows)  {q}",
                ms_total / (*calls).max(1) as f64
            );
        }
    }
}

/// The state rows are inserted in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowState {
    Pending,
    /// As a relay leaves them behind.
    Delivered,
    /// Dead-lettered, as OpenFGA's rejections leave them (e.g. after a model change).
    Dead,
}

/// `INSERT ... SELECT generate_series`: `n` rows of 2 tuples each (the README's example shape),
/// unique per row through `tag`, in `state`.
pub(crate) fn rows_sql(tag: &str, n: usize, state: RowState) -> String {
    rows_sql_in(tag, n, state, &[])
}

/// [`rows_sql`], the rows naming `stores` in turn (row `g` names `stores[g % len]`; none named
/// when empty).
pub(crate) fn rows_sql_in(tag: &str, n: usize, state: RowState, stores: &[String]) -> String {
    let store = if stores.is_empty() {
        String::new()
    } else {
        // Store ids are OpenFGA's (letters and digits): no quoting to escape.
        let list: Vec<String> = stores.iter().map(|s| format!("'{s}'")).collect();
        format!(
            ", 'store_id', (ARRAY[{}])[1 + (g % {})]",
            list.join(","),
            stores.len()
        )
    };
    let (cols, vals) = match state {
        RowState::Pending => ("", ""),
        RowState::Delivered => (", created_at, processed_at", ", now(), now()"),
        RowState::Dead => (
            ", created_at, failed_at, attempts, last_error",
            ", now(), now(), 1, 'Invalid tuple ''capture_job:x#parent@archive:x''. Reason: type ''archive'' not found'",
        ),
    };
    format!(
        "INSERT INTO fga_outbox (payload{cols}) \
         SELECT jsonb_build_object('writes', jsonb_build_array( \
           jsonb_build_object('user', 'capture_job:{tag}' || g, 'relation', 'parent', \
                              'object', 'archive:{tag}' || g), \
           jsonb_build_object('user', 'organization:acme', 'relation', 'parent', \
                              'object', 'capture_job:{tag}' || g)){store}){vals} \
         FROM generate_series(1, {n}) g"
    )
}

/// The relay's heartbeat and lease in a burn-down. It stays stopped (SIGSTOP) while the backlog
/// is inserted, analysed and checkpointed, which on a busy machine took longer than the default
/// heartbeat (5 s): it then found its session dead at SIGCONT and reconnected inside the measured
/// time. Longer ones change nothing else a burn-down measures (a renewal every 30 s, not 5).
pub(crate) const PAUSED: [(&str, &str); 2] = [
    ("FGA_RELAY_HEARTBEAT_INTERVAL", "30s"),
    ("FGA_RELAY_LEADER_LEASE", "90s"),
];

impl Bench {
    /// Empties the table and fills it with `n` rows in `state` as a long-running table would
    /// hold them (vacuumed, analyzed, checkpointed); returns the seconds that took.
    pub(crate) async fn fill(&self, tag: &str, n: usize, state: RowState) -> Result<f64> {
        self.truncate().await?;
        let t = Instant::now();
        self.admin.batch_execute(&rows_sql(tag, n, state)).await?;
        self.admin
            .batch_execute("VACUUM ANALYZE fga_outbox")
            .await?;
        self.admin.batch_execute("CHECKPOINT").await?;
        Ok(t.elapsed().as_secs_f64())
    }
}

/// `perf record` of these processes, all threads, with DWARF call graphs.
pub(crate) async fn start_perf(path: &Path, pids: &[u32]) -> Result<std::process::Child> {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let child = Command::new("perf")
        .args([
            "record",
            "-q",
            "-F",
            "997",
            "--call-graph",
            "dwarf,16384",
            "-o",
        ])
        .arg(path)
        .args(["-p", &pids.join(",")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("run perf record (is perf installed?)")?;
    // perf needs a moment to attach.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(child)
}

pub(crate) fn stop_perf(mut child: std::process::Child) -> Result<()> {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    child.wait()?;
    Ok(())
}

impl Bench {
    /// A backlog of `n` rows burnt down by a warm relay. The relay is paused (SIGSTOP) while
    /// the backlog is inserted, analysed and EXPLAINed, and the clock starts at SIGCONT: the
    /// notification of the backlog's commit is waiting for it then.
    pub(crate) async fn burn(&self, n: usize, tag: &str) -> Result<BurnDown> {
        self.burn_with(n, tag, &self.fga(), &[]).await
    }

    /// As [`Bench::burn`], against this OpenFGA, with `extra` environment for the relay.
    pub(crate) async fn burn_with(
        &self,
        n: usize,
        tag: &str,
        fga: &Fga,
        extra: &[(&str, &str)],
    ) -> Result<BurnDown> {
        self.burn_in(n, tag, fga, extra, &[]).await
    }

    /// As [`Bench::burn_with`], the rows naming `stores` in turn (none named when empty).
    pub(crate) async fn burn_in(
        &self,
        n: usize,
        tag: &str,
        fga: &Fga,
        extra: &[(&str, &str)],
        stores: &[String],
    ) -> Result<BurnDown> {
        let extra: Vec<(&str, &str)> = PAUSED.iter().chain(extra).copied().collect();
        let relay = self.start_relay(fga, &extra).await?;
        relay.signal(libc::SIGSTOP);
        // The stores may hold other scenarios' tuples.
        let held = || -> usize {
            if stores.is_empty() {
                fga.tuples().len()
            } else {
                stores.iter().map(|s| fga.tuples_in(s).len()).sum()
            }
        };
        let stored_before = held();
        let writes_before = fga.write_count();
        let t = Instant::now();
        self.admin
            .batch_execute(&rows_sql_in(tag, n, RowState::Pending, stores))
            .await?;
        let insert_secs = t.elapsed().as_secs_f64();
        self.admin
            .batch_execute("ANALYZE fga_outbox; CHECKPOINT")
            .await?;
        let explain = self.explain_claim().await?;
        let perf = self.perf.lock().expect("not poisoned").take();
        let perf = match perf {
            Some(path) => {
                let mut pids = self.relay_backends().await?;
                pids.push(relay.pid());
                Some(start_perf(&path, &pids).await?)
            }
            None => None,
        };
        self.admin
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await?;
        let cpu0 = self.cpu(Some(relay.pid())).await?;
        let t0 = Instant::now();
        relay.signal(libc::SIGCONT);
        // Done when no row is pending: the relay marks a row only once OpenFGA accepted its
        // Write. Watched in PostgreSQL, not by asking OpenFGA, whose answers to a poll would
        // take its CPU from the Writes being measured.
        let patience = Duration::from_secs(60 + n as u64 / 1000);
        let done = match self.wait_drained(patience, Duration::from_millis(2)).await {
            Ok(done) => done,
            Err(e) => {
                self.stop_relay(relay, "burn-down", &[]).await;
                bail!("burn-down of {n} rows did not finish: {e:#}");
            }
        };
        let cpu1 = self.cpu(Some(relay.pid())).await?;
        if let Some(child) = perf {
            stop_perf(child)?;
        }
        let statements = self.relay_statements().await?;
        let records = fga.writes();
        let records = records.get(writes_before..).unwrap_or_default();
        let last_write = records
            .iter()
            .map(|w| w.received_at)
            .max()
            .filter(|&at| at > t0)
            .map(|at| (at - t0).as_secs_f64());
        let stored = held();
        self.stop_relay(relay, "burn-down", &[]).await;
        if stored != stored_before + 2 * n {
            bail!(
                "OpenFGA holds {stored} tuples, expected {}",
                stored_before + 2 * n
            );
        }
        Ok(BurnDown {
            rows: n,
            tuples: 2 * n,
            secs: (done - t0).as_secs_f64(),
            last_write_secs: last_write,
            writes: records.len(),
            cpu: cpu0.until(&cpu1),
            insert_secs,
            explain,
            statements,
        })
    }

    /// What the relay's statements cost PostgreSQL since the last pg_stat_statements_reset():
    /// (calls, total ms, rows, query), dearest first.
    pub(crate) async fn relay_statements(&self) -> Result<Vec<(i64, f64, i64, String)>> {
        Ok(self
            .admin
            .query(
                "SELECT calls, total_exec_time, rows, \
                 regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g') \
                 FROM pg_stat_statements WHERE userid = 'fga_relay'::regrole \
                 ORDER BY total_exec_time DESC, calls DESC",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    pub(crate) async fn burndown(&self, sizes: &Sizes) -> Result<BurnDown> {
        self.truncate().await?;
        let r = self.burn(sizes.backlog, "bd").await?;
        println!(
            "backlog of {} rows (inserted in {:.1} s), relay with default settings (batch 500)",
            sizes.backlog, r.insert_secs
        );
        r.print("burn-down");
        Ok(r)
    }
}
