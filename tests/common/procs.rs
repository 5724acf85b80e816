//! Processes a test leaves behind. A test ends what it starts; the harness checks, by what each
//! process was started with, that nothing it started outlives the test, whatever it was run
//! through (an intermediate such as `runuser` that dies of SIGKILL leaves its child running,
//! orphaned, for as long as the machine runs).

use std::process::Command;
use std::time::{Duration, Instant};

/// Has the kernel kill the program `command` starts (SIGKILL, `PR_SET_PDEATHSIG`) when the thread
/// that starts it ends: also when the test binary is killed, or interrupted with a process
/// group of its own out of the terminal's reach. Set last before exec, after any change of uid,
/// which would clear it.
pub fn ends_with_its_thread(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The processes (pid and command line) whose arguments contain `needle`, zombies left out
/// (they hold nothing but their pid until reaped).
pub fn running_with(needle: &str) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // A process gone between the listing and the reads is simply not running.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses and may hold any
            // character: read it after the last ')'.
            stat.rsplit(')')
                .next()
                .map(str::trim_start)
                .is_some_and(|s| s.starts_with('Z'))
        });
        if !zombie && cmdline.contains(needle) {
            found.push((pid, cmdline.trim_end().to_owned()));
        }
    }
    found
}

/// Fails the test when a process started with `needle` among its arguments is still running a
/// few seconds after it was ended (a SIGKILL is delivered at once, but an orphan is reaped by
/// init in its own time); the survivors are killed first, so that one failure leaves nothing
/// behind either. While the test is already failing, it only kills them.
pub fn assert_none_left(needle: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = running_with(needle);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = running_with(needle);
    }
    for (pid, _) in &left {
        // SAFETY: kill(2) on a pid just read from /proc; one that exited meanwhile makes it
        // fail harmlessly.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    if !left.is_empty() && !std::thread::panicking() {
        panic!("{what} left running after the test ended it: {left:?}");
    }
}

/// CPU time (user + system) the process has used so far, from /proc/<pid>/stat.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // state is f[0]; utime is field 14 of the whole line, f[11] here; stime f[12].
    let ticks: u64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// The most memory process `pid` has held at once (`VmHWM`, kB), from /proc/<pid>/status; 0
/// when it cannot be read.
pub fn peak_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
