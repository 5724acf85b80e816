//! The relay of 0.2.0 as it delivered in passes (commit 4524e41), which the upgrade tests
//! (`tests/relay/upgrade.rs`) run beside this version. Built on first need, once per machine,
//! from this repository's own history (no download), into `~/.cache/fga-relay/v0.2.0/fga-relay`
//! (`FGA_RELAY_V020_BIN` names another place), as OpenFGA is built once with `go install`.
//!
//! One build at a time: the test threads of a binary wait on one another in-process, and test
//! processes on a file lock (`~/.cache/fga-relay/v0.2.0.lock`); whoever comes after the build
//! finds the binary in place. The build uses a target directory of its own, so that it never
//! replaces `target/debug/fga-relay` (the binary of this version the tests are running) nor waits
//! for a build in the repository's `target`; that directory is removed once the binary is in
//! place (the binary is all the tests need). Cargo's output goes to stderr as it comes, past the
//! tests' capture, once.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::LazyLock;
use std::time::Instant;

/// The commit 0.2.0 is built from (its `--version` names the first 12 digits).
const REVISION: &str = "4524e41341af5e2799e9deee24325befc61e4c14";

/// What a message names the commit by.
const SHORT: &str = "4524e41";

/// The binary, or why there is none and what to do: found, checked and built at most once per
/// test binary; every caller gets the same answer.
static BINARY: LazyLock<Result<PathBuf, String>> = LazyLock::new(find_or_build);

/// The 0.2.0 relay, built first when it is not there yet. `Err` says what is wrong and what to
/// do, for the test to fail with.
pub fn binary() -> Result<PathBuf, String> {
    BINARY.clone()
}

/// `FGA_RELAY_V020_BIN`, else `~/.cache/fga-relay/v0.2.0/fga-relay`.
fn path() -> (PathBuf, bool) {
    if let Some(bin) = std::env::var_os("FGA_RELAY_V020_BIN").filter(|b| !b.is_empty()) {
        return (PathBuf::from(bin), true);
    }
    (cache_root().join("v0.2.0/fga-relay"), false)
}

fn cache_root() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    Path::new(&home).join(".cache/fga-relay")
}

fn find_or_build() -> Result<PathBuf, String> {
    let (bin, named) = path();
    if !bin.is_file() {
        build(&bin)?;
    }
    check(&bin, named)?;
    Ok(bin)
}

/// A binary of another revision in its place would make the upgrade tests prove nothing.
fn check(bin: &Path, named: bool) -> Result<(), String> {
    let fix = if named {
        format!("point FGA_RELAY_V020_BIN at a relay built from {SHORT}, or unset it")
    } else {
        "remove it: the tests build it again".to_owned()
    };
    let out = Command::new(bin).arg("--version").output().map_err(|e| {
        format!(
            "{} (the relay of 0.2.0) does not run: {e}; {fix}",
            bin.display()
        )
    })?;
    let version = String::from_utf8_lossy(&out.stdout);
    if !(version.contains(" 0.2.0 ") && version.contains(&REVISION[..12])) {
        return Err(format!(
            "{} is not the relay of 0.2.0 built from {SHORT}: it says {version:?}; {fix}",
            bin.display()
        ));
    }
    Ok(())
}

/// Writes to the test binary's own stderr, past the test harness's capture: a build of minutes
/// shows what it does whether the test passes or fails.
fn say(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "fga-relay 0.2.0: {line}");
}

/// Builds the binary into `bin` unless another process has meanwhile, holding
/// `~/.cache/fga-relay/v0.2.0.lock` so that one process builds while the others wait.
fn build(bin: &Path) -> Result<(), String> {
    std::fs::create_dir_all(cache_root())
        .map_err(|e| format!("create {}: {e}", cache_root().display()))?;
    // One lock per machine (per home), whichever binary is built: the builds share a target
    // directory.
    let lock_path = cache_root().join("v0.2.0.lock");
    let mut lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| format!("open {}: {e}", lock_path.display()))?;
    // Released when the file is closed, also when this process dies mid-build.
    if !flock(&lock, libc::LOCK_EX | libc::LOCK_NB)? {
        let mut holder = String::new();
        let _ = lock.read_to_string(&mut holder);
        say(&format!(
            "waiting for {} to finish building it (lock {})",
            match holder.trim() {
                "" => "another process".to_owned(),
                pid => format!("process {pid}"),
            },
            lock_path.display()
        ));
        flock(&lock, libc::LOCK_EX)?;
    }
    if bin.is_file() {
        say(&format!(
            "built meanwhile by another process: {}",
            bin.display()
        ));
        return Ok(());
    }
    let _ = lock.set_len(0);
    let _ = lock.rewind();
    let _ = write!(lock, "{}", std::process::id());

    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    has_commit(repo)?;
    let src =
        TempDir(std::env::temp_dir().join(format!("fga-relay-v0.2.0-src-{}", std::process::id())));
    unpack(repo, &src.0)?;

    let target = cache_root().join("v0.2.0-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--locked", "--bin", "fga-relay", "--manifest-path"])
        .arg(src.0.join("Cargo.toml"))
        // An archive has no .git: the build script takes the revision from here instead, so
        // that `--version` names 4524e41 as a build from the commit itself would.
        .env("FGA_RELAY_GIT_REVISION", &REVISION[..12])
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Below the tests that run meanwhile, some of which judge timings; and ended with this
    // thread should the test binary die.
    // SAFETY: setpriority is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
            Ok(())
        });
    }
    super::procs::ends_with_its_thread(&mut command);
    let shown = format!(
        "FGA_RELAY_GIT_REVISION={} CARGO_TARGET_DIR={} cargo build --locked --bin fga-relay \
         --manifest-path {}",
        &REVISION[..12],
        target.display(),
        src.0.join("Cargo.toml").display()
    );
    say(&format!(
        "building it once from commit {SHORT} of this repository into {} (a few CPU-minutes; the \
         upgrade tests wait for it): {shown}",
        bin.display()
    ));
    let start = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("the relay of 0.2.0 could not be built: {shown}: {e}"))?;
    // Cargo's output, shown as it comes and kept for the failure message.
    let mut tail = std::collections::VecDeque::new();
    for line in BufReader::new(child.stderr.take().expect("piped stderr"))
        .lines()
        .map_while(Result::ok)
    {
        say(&line);
        if tail.len() == 40 {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let status = child.wait().map_err(|e| format!("wait for {shown}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "the relay of 0.2.0 (commit {SHORT}) failed to build ({status}): {shown}\n{}",
            Vec::from(tail).join("\n")
        ));
    }
    say(&format!("built in {} s", start.elapsed().as_secs()));

    // Copied beside, then renamed into place: a copy cut short never looks finished.
    let dir = bin.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let partial = PathBuf::from(format!("{}.partial-{}", bin.display(), std::process::id()));
    let built = target.join("debug/fga-relay");
    std::fs::copy(&built, &partial)
        .map_err(|e| format!("copy {} to {}: {e}", built.display(), partial.display()))?;
    std::fs::rename(&partial, bin).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        format!("move {} into place: {e}", partial.display())
    })?;
    let _ = std::fs::remove_dir_all(&target);
    say(&format!("installed {}", bin.display()));
    Ok(())
}

/// `flock(2)`: false when `LOCK_NB` is asked and another holds the lock.
fn flock(file: &File, op: i32) -> Result<bool, String> {
    loop {
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(format!("lock the 0.2.0 build: {e}")),
        }
    }
}

fn git(repo: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("git").arg("-C").arg(repo).args(args).output()
}

/// The commit is in this clone's objects, or the test fails saying how to get it.
fn has_commit(repo: &Path) -> Result<(), String> {
    let alternative = format!(
        "or build fga-relay at commit {REVISION} elsewhere (`cargo build`) and point \
         FGA_RELAY_V020_BIN at the binary"
    );
    let out = git(repo, &["cat-file", "-e", &format!("{REVISION}^{{commit}}")]).map_err(|e| {
        format!(
            "the upgrade tests build the relay of 0.2.0 from commit {SHORT} of this repository, \
             with git, which does not run ({e}): install git, {alternative}"
        )
    })?;
    if out.status.success() {
        return Ok(());
    }
    let shallow = git(repo, &["rev-parse", "--is-shallow-repository"]);
    let why = match &shallow {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "true" => {
            "this clone is shallow and lacks it: run `git fetch --unshallow`".to_owned()
        }
        Ok(o) if o.status.success() => format!(
            "this clone lacks it: fetch it (`git fetch origin {REVISION}`, or `git fetch \
             --unshallow` in a shallow clone)"
        ),
        _ => format!(
            "{} is not a git clone: run the tests in a clone of the repository",
            repo.display()
        ),
    };
    Err(format!(
        "the upgrade tests run the relay of 0.2.0, built once per machine from commit {SHORT} \
         of this repository, and {why}, {alternative}"
    ))
}

/// `git archive REVISION | tar -x -C src`.
fn unpack(repo: &Path, src: &Path) -> Result<(), String> {
    std::fs::create_dir_all(src).map_err(|e| format!("create {}: {e}", src.display()))?;
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["archive", "--format=tar", REVISION])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("git archive {REVISION}: {e}"))?;
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(src)
        .stdin(archive.stdout.take().expect("piped stdout"))
        .output()
        .map_err(|e| format!("tar -x: {e}"))?;
    let archived = archive
        .wait_with_output()
        .map_err(|e| format!("git archive {REVISION}: {e}"))?;
    if !archived.status.success() || !tar.status.success() {
        return Err(format!(
            "git archive {REVISION} | tar -x -C {}: {}; {}",
            src.display(),
            String::from_utf8_lossy(&archived.stderr).trim(),
            String::from_utf8_lossy(&tar.stderr).trim()
        ));
    }
    Ok(())
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
