//! pgbench: the writers' load, one single-row transaction a time, and its throughput.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pgbench script: one single-row transaction inserting an outbox row with a unique tuple.
pub(crate) const PGBENCH_SCRIPT: &str = "\\set n random(1, 2000000000)
INSERT INTO fga_outbox (payload) VALUES (jsonb_build_object('writes', jsonb_build_array(jsonb_build_object('user', 'user:' || :client_id || '-' || :n, 'relation', 'viewer', 'object', 'document:' || :client_id))));
";

pub(crate) fn pgbench_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PGBENCH") {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/pgbench"]
        .into_iter()
        .map(PathBuf::from)
        .chain(
            std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("bin/pgbench")),
        )
        .find(|c| c.exists())
}

pub(crate) fn pgbench(
    bin: &Path,
    socket_dir: &Path,
    script: &Path,
    clients: u32,
    secs: u64,
) -> Result<std::process::Child> {
    Command::new(bin)
        .args(["-n", "-M", "prepared", "-h"])
        .arg(socket_dir)
        .args(["-p", "5432", "-U", "postgres", "-f"])
        .arg(script)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
            "-T",
            &secs.to_string(),
            "postgres",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("run pgbench")
}

/// pgbench's throughput, once it has finished.
pub(crate) fn pgbench_tps(out: std::process::Output) -> Result<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")
                .filter(|r| r.contains("without initial connection time"))
                .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        })
        .with_context(|| format!("no tps in pgbench's output: {text}"))
}
