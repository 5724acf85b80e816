//! The writer examples (`examples/writers/`, shown in docs/writing.md), run for real against the
//! test database: each inserts a business row and its outbox row in one transaction, and the
//! relay delivers the row. Node and Python install their driver (npm `pg`, PyPI
//! `psycopg[binary]`) into the target directory once; a language whose toolchain is not on the
//! machine fails its test, naming what to install (`.ci/run` installs each where missing).
//! docs/writing.md shows each example's marked part; a test checks it still does.

use crate::common::relay::{Env, README_TUPLES};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn example(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/writers").join(name)
}

/// A scratch folder under the target directory that survives between runs (installs are kept).
fn cache(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("writer-examples")
        .join(name);
    std::fs::create_dir_all(&dir).expect("create the example's folder");
    dir
}

fn on_path(tool: &str) -> bool {
    // `go` knows only `go version`.
    ["--version", "version"].into_iter().any(|arg| {
        Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Fails the test, saying what to install, when `tool` is missing: a writer example that was
/// not run must never pass.
fn require(tool: &str, install: &str) {
    assert!(
        on_path(tool),
        "{tool} is not on this machine, and the writer examples' tests need it: {install} \
         (.ci/run installs it where it is missing)"
    );
}

fn run(c: &mut Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The database's connection string as a URL, which every driver takes (node-postgres takes no
/// `key=value` form). A socket directory goes in the `host` query parameter.
fn as_url(conninfo: &str) -> String {
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        return conninfo.to_owned();
    }
    let field = |k: &str| {
        conninfo
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_default()
            .to_owned()
    };
    format!(
        "postgresql://{}@/{}?host={}&port={}",
        field("user"),
        field("dbname"),
        field("host"),
        field("port")
    )
}

/// A migrated database with the examples' business table, a relay delivering, and a writer
/// program run with the database's URL: its outbox row is delivered and OpenFGA has both tuples.
async fn writer_delivers(program: &str, mut command: Command) {
    let env = Env::start().await;
    env.db
        .connect()
        .await
        .batch_execute("CREATE TABLE archives (id text PRIMARY KEY, name text)")
        .await
        .expect("create archives");
    let _relay = env.start_relay().await;
    let out = run(
        command.args([&as_url(env.db.url()), "3a4cb75c", "7f170ae4", "acme"]),
        program,
    );
    let id: i64 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{program} printed {out:?}, not an outbox id"));
    env.wait_delivered(id).await;
    env.assert_fga_has(&README_TUPLES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_writer_example_is_delivered() {
    // Cargo builds the examples for `cargo test`, next to the test binaries' folder.
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .join("examples/writer");
    writer_delivers("the Rust example", Command::new(bin)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_writer_example_is_delivered() {
    require("node", "apt-get install nodejs npm");
    require("npm", "apt-get install npm");
    let dir = cache("node");
    if !dir.join("node_modules/pg").exists() {
        run(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
                .arg(&dir)
                .arg("pg@8"),
            "npm install pg",
        );
    }
    // ES modules resolve packages next to the importing file.
    std::fs::copy(example("writer.mjs"), dir.join("writer.mjs")).expect("copy writer.mjs");
    let mut c = Command::new("node");
    c.arg(dir.join("writer.mjs"));
    writer_delivers("the Node example", c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_writer_example_is_delivered() {
    require("python3", "apt-get install python3 python3-venv");
    let dir = cache("python");
    let python = dir.join("venv/bin/python");
    if !python.exists() {
        run(
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(dir.join("venv")),
            "python3 -m venv (Debian: apt-get install python3-venv)",
        );
    }
    let has_psycopg = Command::new(&python)
        .args(["-c", "import psycopg"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_psycopg {
        run(
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "psycopg[binary]==3.*",
            ]),
            "pip install psycopg",
        );
    }
    let mut c = Command::new(python);
    c.arg(example("writer.py"));
    writer_delivers("the Python example", c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_writer_example_is_delivered() {
    require(
        "go",
        "apt-get install golang-go, or https://go.dev/doc/install",
    );
    let dir = cache("go");
    std::fs::copy(example("writer.go"), dir.join("main.go")).expect("copy writer.go");
    if !dir.join("go.mod").exists() {
        run(
            Command::new("go")
                .args(["mod", "init", "writer"])
                .current_dir(&dir),
            "go mod init",
        );
    }
    run(
        Command::new("go")
            .args(["get", "github.com/jackc/pgx/v5"])
            .current_dir(&dir),
        "go get github.com/jackc/pgx/v5 (needs the Go module proxy, or GOPROXY set to one)",
    );
    let mut c = Command::new("go");
    c.args(["run", "."]).current_dir(&dir);
    writer_delivers("the Go example", c).await;
}

/// docs/writing.md shows each example's marked part as it is in the file.
#[test]
fn the_docs_show_the_examples_as_they_are() {
    let readme =
        std::fs::read_to_string(Path::new(ROOT).join("docs/writing.md")).expect("docs/writing.md");
    let readme: Vec<&str> = readme.lines().map(str::trim).collect();
    for name in ["writer.mjs", "writer.py", "writer.go", "writer.rs"] {
        let text = std::fs::read_to_string(example(name)).expect("example");
        let shown: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains("--- shown in docs/writing.md ---"))
            .skip(1)
            .take_while(|l| !l.contains("--- end ---"))
            .map(str::trim)
            .collect();
        assert!(shown.len() > 3, "{name}: no marked part");
        let found = readme.windows(shown.len()).any(|w| w == shown.as_slice());
        assert!(
            found,
            "docs/writing.md does not show examples/writers/{name}'s marked part as it is"
        );
    }
}
