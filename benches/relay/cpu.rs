//! CPU accounting from `/proc`: the relay's, its PostgreSQL sessions', pgbench's, and everything
//! else on a machine that may be shared.

use std::time::Instant;

/// The load averages over 1, 5 and 15 minutes, as `/proc/loadavg` gives them: printed beside
/// every measured figure, since the machine may be shared and what else runs shows in every
/// number.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) struct ProcStat {
    pub(crate) ppid: u32,
    /// utime + stime, in clock ticks.
    pub(crate) ticks: u64,
}

pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    Some(ProcStat {
        ppid: f.get(1)?.parse().ok()?,
        ticks: f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?,
    })
}

pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The time a process spent on a CPU, in seconds, from `/proc/<pid>/schedstat` (nanoseconds):
/// `/proc/<pid>/stat` counts whole clock ticks, and a session that waits uses less than one at
/// a time. 0 when the process is gone.
pub(crate) fn task_cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

pub(crate) fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// A PostgreSQL cluster's CPU: the postmaster and its children (backends, walwriter,
/// checkpointer, autovacuum).
fn cluster_ticks(postmaster: u32) -> u64 {
    let mut ticks = proc_stat(postmaster).map_or(0, |p| p.ticks);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(p) = proc_stat(pid).filter(|p| p.ppid == postmaster) {
                ticks += p.ticks;
            }
        }
    }
    ticks
}

/// CPU used so far by each party, in clock ticks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuSnap {
    pub(crate) at: Option<Instant>,
    pub(crate) relay: u64,
    pub(crate) relay_pg: u64,
    /// The bench's own session (it watches the table: not the relay's cost).
    pub(crate) bench_pg: u64,
    pub(crate) pg_all: u64,
    /// The OpenFGA servers the bench started (child processes named `openfga`).
    pub(crate) openfga: u64,
    /// The fault proxy's threads in front of them, in this process.
    pub(crate) proxy: u64,
    /// OpenFGA's own PostgreSQL cluster.
    pub(crate) openfga_pg: u64,
    pub(crate) bench_all: u64,
    pub(crate) pgbench: u64,
    pub(crate) machine_busy: u64,
}

impl CpuSnap {
    pub(crate) fn take(
        relay: Option<u32>,
        relay_backends: &[u32],
        bench_backend: u32,
        [postmaster, fga_postmaster]: [u32; 2],
        pgbench: Option<u32>,
    ) -> CpuSnap {
        let mut s = CpuSnap {
            at: Some(Instant::now()),
            ..CpuSnap::default()
        };
        if let Some(pid) = pgbench {
            s.pgbench = proc_stat(pid).map_or(0, |p| p.ticks);
        }
        if let Some(pid) = relay {
            s.relay = proc_stat(pid).map_or(0, |p| p.ticks);
        }
        s.relay_pg = relay_backends
            .iter()
            .filter_map(|&p| proc_stat(p))
            .map(|p| p.ticks)
            .sum();
        s.bench_pg = proc_stat(bench_backend).map_or(0, |p| p.ticks);
        s.pg_all = cluster_ticks(postmaster);
        s.openfga_pg = cluster_ticks(fga_postmaster);
        // The OpenFGA servers this process started, and the proxy's threads in this process.
        let me = std::process::id();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                if comm.trim() == "openfga" {
                    s.openfga += proc_stat(pid)
                        .filter(|p| p.ppid == me)
                        .map_or(0, |p| p.ticks);
                }
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for e in dir.flatten() {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                if comm.trim().starts_with("fga-proxy") {
                    let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    s.proxy += parse_stat(&stat).map_or(0, |p| p.ticks);
                }
            }
        }
        s.bench_all = proc_stat(std::process::id()).map_or(0, |p| p.ticks);
        if let Some(line) = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .next()
        {
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            let total: u64 = v.iter().take(8).sum();
            s.machine_busy = total - idle;
        }
        s
    }

    /// CPU-seconds used by each party between `self` and `later`.
    pub(crate) fn until(&self, later: &CpuSnap) -> CpuUse {
        let hz = clock_ticks_per_second();
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64 / hz;
        let wall = match (self.at, later.at) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let proxy = d(self.proxy, later.proxy);
        let bench_pg = d(self.bench_pg, later.bench_pg);
        CpuUse {
            wall,
            relay: d(self.relay, later.relay),
            relay_pg: d(self.relay_pg, later.relay_pg),
            bench_pg,
            pg_other: d(self.pg_all, later.pg_all) - d(self.relay_pg, later.relay_pg) - bench_pg,
            openfga: d(self.openfga, later.openfga),
            openfga_pg: d(self.openfga_pg, later.openfga_pg),
            proxy,
            bench: d(self.bench_all, later.bench_all) - proxy,
            pgbench: d(self.pgbench, later.pgbench),
            machine: d(self.machine_busy, later.machine_busy),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuUse {
    pub(crate) wall: f64,
    pub(crate) relay: f64,
    pub(crate) relay_pg: f64,
    /// The bench's own session, watching the table.
    pub(crate) bench_pg: f64,
    /// The rest of the outbox's PostgreSQL: its other sessions (writers, pgbench's) and its
    /// own processes (walwriter, checkpointer, autovacuum...).
    pub(crate) pg_other: f64,
    pub(crate) openfga: f64,
    pub(crate) openfga_pg: f64,
    pub(crate) proxy: f64,
    pub(crate) bench: f64,
    /// pgbench, when it ran.
    pub(crate) pgbench: f64,
    pub(crate) machine: f64,
}

impl CpuUse {
    /// CPU the machine spent on processes other than the bench's: on a shared machine, the
    /// noise in every number here.
    pub(crate) fn others(&self) -> f64 {
        (self.machine
            - self.relay
            - self.relay_pg
            - self.bench_pg
            - self.pg_other
            - self.openfga
            - self.openfga_pg
            - self.proxy
            - self.bench
            - self.pgbench)
            .max(0.0)
    }

    pub(crate) fn line(&self) -> String {
        let pct = |s: f64| {
            if self.wall > 0.0 {
                s / self.wall * 100.0
            } else {
                0.0
            }
        };
        format!(
            "CPU over {:.2} s (100% = one core): relay {:.0}%, its PostgreSQL sessions {:.0}%, \
             rest of PostgreSQL {:.0}%, OpenFGA {:.0}% and its PostgreSQL {:.0}%, its proxy \
             {:.0}%, bench {:.0}% and its session {:.0}%, other processes \
             {:.0}%; machine busy {:.0}% of {}%",
            self.wall,
            pct(self.relay),
            pct(self.relay_pg),
            pct(self.pg_other.max(0.0)),
            pct(self.openfga),
            pct(self.openfga_pg),
            pct(self.proxy),
            pct(self.bench.max(0.0)),
            pct(self.bench_pg),
            pct(self.others()),
            pct(self.machine),
            100 * std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    }
}

/// A process's resident memory, in KiB (`VmRSS` in `/proc/<pid>/status`); `None` when it is
/// gone.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
