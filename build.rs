//! Records the git revision the binary is built from, for `--version` and
//! `fga_relay_build_info{revision}`.
//!
//! `FGA_RELAY_GIT_REVISION` set at build time wins (a Docker build has no `.git` in its context:
//! pass `--build-arg FGA_RELAY_GIT_REVISION=$(git rev-parse HEAD)`); otherwise `git rev-parse`
//! in this package's own repository; otherwise `unknown`. The build never fails for lack of git.

use std::path::{Path, PathBuf};
use std::process::Command;

const OVERRIDE: &str = "FGA_RELAY_GIT_REVISION";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed={OVERRIDE}");
    let revision = std::env::var(OVERRIDE)
        .ok()
        .map(|v| clean(&v))
        .filter(|v| !v.is_empty())
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FGA_RELAY_BUILD_REVISION={revision}");
}

/// Keeps what a revision or a tag can hold, so that the label and `--version` stay one plain word
/// whatever the build argument carried (quotes, spaces, a newline).
fn clean(v: &str) -> String {
    v.trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '+'))
        .take(64)
        .collect()
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn from_git() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    // Only this package's own repository: a crate unpacked inside some other repository (a
    // vendored copy, a monorepo without this history) must not take that repository's revision.
    let top = PathBuf::from(git(&dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let revision = git(&dir, &["rev-parse", "--short=12", "HEAD"])?;
    // Build again when HEAD moves: HEAD itself (a checkout), the branch it points to (a commit),
    // and packed-refs (where a branch's ref may live). Only files that exist: cargo reruns a
    // script on every build for a path that does not.
    let git_dir = git(&dir, &["rev-parse", "--absolute-git-dir"]).map(PathBuf::from);
    let common = git(
        &dir,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .map(PathBuf::from)
    .or_else(|| git_dir.clone());
    let mut watch = Vec::new();
    if let Some(g) = &git_dir {
        watch.push(g.join("HEAD"));
    }
    if let Some(c) = &common {
        watch.push(c.join("packed-refs"));
        if let Some(head_ref) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watch.push(c.join(head_ref));
        }
    }
    for path in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(revision)
}
