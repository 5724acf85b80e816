//! Scenario: an idle relay: the statements it runs and the CPU it takes.

use crate::args::Sizes;
use crate::cpu::CpuUse;
use crate::harness::Bench;
use anyhow::Result;
use std::time::Duration;

#[derive(Clone, Debug, Default)]
pub(crate) struct IdleResult {
    pub(crate) secs: f64,
    pub(crate) statements: Vec<(i64, String)>,
    pub(crate) commits: i64,
    pub(crate) cpu: CpuUse,
    pub(crate) writes: usize,
}

impl IdleResult {
    pub(crate) fn total_statements(&self) -> i64 {
        self.statements.iter().map(|(n, _)| n).sum()
    }
}

impl Bench {
    pub(crate) async fn idle(&self, sizes: &Sizes) -> Result<IdleResult> {
        self.truncate().await?;
        let fga = self.fga();
        let relay = self.start_relay(&fga, &[]).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.admin
            .batch_execute("SELECT pg_stat_statements_reset(); SELECT pg_stat_clear_snapshot()")
            .await?;
        let commits_sql =
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
        let c0 = self.count(commits_sql).await?;
        let cpu0 = self.cpu(Some(relay.pid())).await?;
        tokio::time::sleep(Duration::from_secs(sizes.idle_seconds)).await;
        let cpu1 = self.cpu(Some(relay.pid())).await?;
        // Statistics reach the shared counters within a second or so of the transaction.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        self.admin
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await?;
        let c1 = self.count(commits_sql).await?;
        let statements: Vec<(i64, String)> = self
            .admin
            .query(
                "SELECT calls, regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), \
                 '\\s+', ' ', 'g') FROM pg_stat_statements \
                 WHERE userid = 'fga_relay'::regrole ORDER BY calls DESC, query",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let writes = fga.write_count();
        self.stop_relay(relay, "idle", &[]).await;
        let r = IdleResult {
            secs: sizes.idle_seconds as f64,
            statements,
            commits: c1 - c0,
            cpu: cpu0.until(&cpu1),
            writes,
        };
        println!(
            "{} s of an idle relay (default settings: heartbeat 5 s, sweep 30 s)",
            sizes.idle_seconds
        );
        println!(
            "  statements the relay sent: {} ({:.2}/s); transactions committed in the database \
             (anyone's): {}; Writes: {}",
            r.total_statements(),
            r.total_statements() as f64 / r.secs,
            r.commits,
            r.writes
        );
        for (n, q) in &r.statements {
            let q: String = q.chars().take(110).collect();
            println!("    {n:>5}  {q}");
        }
        println!(
            "  relay CPU {:.3} s ({:.3}% of a core); its PostgreSQL sessions {:.3} s",
            r.cpu.relay,
            r.cpu.relay / r.cpu.wall * 100.0,
            r.cpu.relay_pg
        );
        Ok(r)
    }
}
