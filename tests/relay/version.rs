//! What a binary says it is: the version the CHANGELOG names, and the git revision it was built
//! from (`build.rs`), in `--version` (here) and `fga_relay_build_info` (`observability.rs`).

use crate::common::relay::BIN;
use crate::common::tls::TempDir;
use std::path::Path;
use std::process::Command;

/// What `build.rs` finds for this checkout: the override given to this build, else the
/// revision `git rev-parse` gives, else `unknown`.
pub fn expected_revision() -> String {
    if let Some(given) = option_env!("FGA_RELAY_GIT_REVISION").filter(|v| !v.trim().is_empty()) {
        return given.trim().to_owned();
    }
    git(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &["rev-parse", "--short=12", "HEAD"],
    )
    .unwrap_or_else(|| "unknown".to_owned())
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn version_names_the_changelogs_version_and_the_git_revision() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        line.trim(),
        format!(
            "fga-relay {} (revision {})",
            env!("CARGO_PKG_VERSION"),
            expected_revision()
        )
    );
    // The version the CHANGELOG's newest section names is the crate's.
    let changelog =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("CHANGELOG.md"))
            .unwrap();
    let newest = changelog
        .lines()
        .find(|l| l.starts_with("## "))
        .expect("a version section");
    assert!(
        newest.contains(env!("CARGO_PKG_VERSION")),
        "CHANGELOG's newest section {newest:?} is not Cargo.toml's version {}",
        env!("CARGO_PKG_VERSION")
    );
}

/// The build script compiled alone and run as cargo runs it, in the places a build happens:
/// a git checkout, a crate unpacked inside another repository, a copy without git (a Docker
/// context, a tarball), a machine without git, and with the override a Docker build passes.
#[test]
fn the_build_script_takes_the_override_else_git_else_says_unknown() {
    let tmp = TempDir::new();
    let script = tmp.path().join("build-script");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(rustc)
        .args(["--edition", "2024", "-o"])
        .arg(&script)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("build.rs"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = |dir: &Path, vars: &[(&str, &str)]| -> (String, String) {
        let mut c = Command::new(&script);
        c.env_remove("FGA_RELAY_GIT_REVISION")
            .env("CARGO_MANIFEST_DIR", dir)
            .envs(vars.iter().copied());
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "the build script failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let revision = stdout
            .lines()
            .find_map(|l| l.strip_prefix("cargo:rustc-env=FGA_RELAY_BUILD_REVISION="))
            .expect("the script always sets the revision")
            .to_owned();
        (revision, stdout)
    };

    // A copy without git (and outside any repository).
    let plain = tmp.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    assert_eq!(run(&plain, &[]).0, "unknown");
    // The override, trimmed, and kept to the characters a revision or tag has.
    assert_eq!(
        run(&plain, &[("FGA_RELAY_GIT_REVISION", " 0123abcd\n")]).0,
        "0123abcd"
    );
    assert_eq!(
        run(&plain, &[("FGA_RELAY_GIT_REVISION", "v0.2.0-rc.1 \"x\"")]).0,
        "v0.2.0-rc.1x"
    );
    assert_eq!(run(&plain, &[("FGA_RELAY_GIT_REVISION", "")]).0, "unknown");

    assert!(
        git(tmp.path(), &["--version"]).is_some(),
        "git is not on this machine, and this test needs it for its checkout cases: \
         apt-get install git"
    );
    // A git checkout: its HEAD, and the files that move with it are watched.
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(repo.join("vendored")).unwrap();
    std::fs::write(repo.join("vendored/Cargo.toml"), "").unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "."],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "x",
        ],
    ] {
        git(&repo, args).expect("git in the scratch repository");
    }
    let head = git(&repo, &["rev-parse", "--short=12", "HEAD"]).unwrap();
    let (revision, stdout) = run(&repo, &[]);
    assert_eq!(revision, head);
    assert!(stdout.contains("cargo:rerun-if-changed="), "{stdout}");
    assert!(stdout.contains("HEAD"), "HEAD is watched: {stdout}");
    // The override wins over git.
    assert_eq!(run(&repo, &[("FGA_RELAY_GIT_REVISION", "abc")]).0, "abc");
    // A crate inside another repository does not take that repository's revision.
    assert_eq!(run(&repo.join("vendored"), &[]).0, "unknown");
    // No git on PATH: unknown, and the build goes on.
    assert_eq!(run(&repo, &[("PATH", "/nonexistent")]).0, "unknown");
}
