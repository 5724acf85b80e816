//! A CPU quota for some of the bench's processes: a cgroup of the bench's own, with a fixed
//! share of the CPUs (cgroup v1's `cpu` controller, else cgroup v2's `cpu.max`). The real
//! scenario runs OpenFGA and OpenFGA's PostgreSQL in it, so that what the relay's side takes
//! from the machine (the relay, the outbox's PostgreSQL, on the same CPUs) cannot slow OpenFGA
//! down: the burn-down then measures the relay against a server of fixed capacity.
//!
//! The cgroup is removed when the [`CpuQuota`] is dropped, on error too: its processes go back
//! to the bench's own cgroup, then the directory is removed.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The scheduler's period: the quota is `cpus` times this per period.
const PERIOD_US: u64 = 100_000;

pub(crate) struct CpuQuota {
    /// The cgroup's directory.
    dir: PathBuf,
    /// The bench's own cgroup, where the processes go back to (the hierarchy's root when the
    /// bench's path is not found under the mount, as in a container without a namespace).
    home: PathBuf,
    /// Its path in the hierarchy, as `/proc/PID/cgroup` shows it.
    name: String,
    /// The hierarchy: v1's `cpu` controller (`Some("cpu")`) or v2's unified one (`None`).
    controller: Option<&'static str>,
    pub(crate) cpus: f64,
    /// `cgroup v1` or `cgroup v2`, for the report.
    pub(crate) kind: &'static str,
}

/// Where a cgroup v2 hierarchy is mounted, if any.
fn cgroup2_mount() -> Option<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .ok()?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .and_then(|f| f.get(1).map(PathBuf::from))
}

/// The path of `pid`'s cgroup in a hierarchy: the `cpu` controller's for v1 (`Some("cpu")`),
/// the unified one's for v2 (`None`).
fn cgroup_of(pid: &str, controller: Option<&str>) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let wanted = match controller {
                Some(c) => controllers.split(',').any(|x| x == c),
                None => controllers.is_empty(),
            };
            wanted.then(|| path.to_owned())
        })
}

fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).with_context(|| format!("write {value:?} to {}", path.display()))
}

/// Makes the cgroup `name` under `root` (a hierarchy, of `controller` under v1), and finds the
/// one this process is in there (`root` itself when it cannot tell), to move back to.
fn new_group(
    root: &Path,
    controller: Option<&str>,
    name: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let home = cgroup_of("self", controller).unwrap_or_else(|| "/".into());
    let home = Some(root.join(home.trim_start_matches('/')))
        .filter(|h| h.exists())
        .unwrap_or_else(|| root.to_owned());
    let dir = root.join(name);
    std::fs::create_dir(&dir).with_context(|| format!("create the cgroup {}", dir.display()))?;
    Ok((dir, home))
}

impl CpuQuota {
    /// A cgroup named for this process with `cpus` CPUs' worth of time per period.
    pub(crate) fn create(cpus: f64) -> Result<CpuQuota> {
        if cpus.is_nan() || cpus <= 0.0 {
            bail!("a CPU quota must be above 0, not {cpus}");
        }
        let quota_us = (cpus * PERIOD_US as f64).round() as u64;
        let name = format!("fga-relay-bench-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        if v1.join("cpu.cfs_quota_us").exists() {
            let (dir, home) = new_group(v1, Some("cpu"), &name)?;
            let quota = CpuQuota {
                dir,
                home,
                name: format!("/{name}"),
                controller: Some("cpu"),
                cpus,
                kind: "cgroup v1",
            };
            write(&quota.dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
            write(&quota.dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            return Ok(quota);
        }
        let Some(root) = cgroup2_mount() else {
            bail!("neither cgroup v1's cpu controller nor a cgroup v2 hierarchy is mounted");
        };
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
            .context("read the cgroup v2 root's controllers")?;
        if !controllers.split_whitespace().any(|c| c == "cpu") {
            bail!(
                "the cgroup v2 hierarchy at {} has no cpu controller (it may be bound to v1)",
                root.display()
            );
        }
        write(&root.join("cgroup.subtree_control"), "+cpu")?;
        let (dir, home) = new_group(&root, None, &name)?;
        let quota = CpuQuota {
            dir,
            home,
            name: format!("/{name}"),
            controller: None,
            cpus,
            kind: "cgroup v2",
        };
        write(
            &quota.dir.join("cpu.max"),
            &format!("{quota_us} {PERIOD_US}"),
        )?;
        Ok(quota)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves a process (all its threads) into the cgroup; the children it forks later are born
    /// in it.
    pub(crate) fn add(&self, pid: u32) -> Result<()> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Moves a PostgreSQL cluster into the cgroup: its postmaster, and the processes it has
    /// forked so far (sessions, walwriter, checkpointer...); those it forks later are born in it.
    pub(crate) fn add_cluster(&self, postmaster: u32) -> Result<()> {
        self.add(postmaster)?;
        for pid in children(postmaster) {
            // A session may end meanwhile.
            if let Err(e) = self.add(pid)
                && Path::new(&format!("/proc/{pid}")).exists()
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The processes in the cgroup.
    pub(crate) fn members(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Whether `pid` is in the cgroup, as its `/proc/PID/cgroup` says.
    pub(crate) fn holds(&self, pid: u32) -> bool {
        cgroup_of(&pid.to_string(), self.controller).is_some_and(|c| c == self.name)
    }

    /// Of `pids`, those still running outside the cgroup.
    pub(crate) fn outside(&self, pids: &[u32]) -> Vec<u32> {
        pids.iter()
            .copied()
            .filter(|&p| !self.holds(p) && Path::new(&format!("/proc/{p}")).exists())
            .collect()
    }

    /// (periods, periods throttled, seconds throttled) so far, from `cpu.stat`.
    pub(crate) fn throttling(&self) -> (u64, u64, f64) {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let secs = if self.kind == "cgroup v1" {
            field("throttled_time ") as f64 / 1e9
        } else {
            field("throttled_usec ") as f64 / 1e6
        };
        (field("nr_periods "), field("nr_throttled "), secs)
    }
}

/// The processes whose parent is `pid`.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| crate::cpu::proc_stat(p).is_some_and(|s| s.ppid == pid))
        .collect()
}

impl Drop for CpuQuota {
    /// Every process back to the bench's own cgroup, then the cgroup removed. A cgroup with a
    /// process still leaving cannot be removed at once: tried for a second.
    fn drop(&mut self) {
        for _ in 0..20 {
            for pid in self.members() {
                let _ = std::fs::write(self.home.join("cgroup.procs"), pid.to_string());
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "could not remove the cgroup {} (processes left: {:?}); remove it with rmdir",
            self.dir.display(),
            self.members()
        );
    }
}
