//! Scenario: the delivery stream's model test (`src/delivery/model.rs`) at many more cases than
//! the test suite's 256: random interleavings of commits (late ones too), answers, crashes and
//! stores failing and healing, each checked against the reference model of the guarantees. It
//! runs the library's own test binary, built in release, with `FGA_RELAY_MODEL_CASES`.

use crate::args::Sizes;
use anyhow::{Context, Result, bail};
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(Clone, Debug)]
pub(crate) struct ModelResult {
    /// Cases of each of the model's properties.
    pub(crate) cases: u32,
    /// Seconds the cases took (the build excluded).
    pub(crate) secs: f64,
    /// The properties that passed, and the names of those that failed.
    pub(crate) passed: usize,
    pub(crate) failed: Vec<String>,
}

/// The test binary's run: `cargo test --release --lib` with the model's filter.
fn cargo_test(build_only: bool) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["test", "--release", "--lib"]);
    if build_only {
        cmd.arg("--no-run");
    } else {
        cmd.args(["delivery::model::", "--", "--test-threads", "2"]);
    }
    cmd
}

pub(crate) async fn model(sizes: &Sizes) -> Result<Option<ModelResult>> {
    let cases = sizes.model_cases;
    // Minutes of a child process: off the runtime's workers.
    tokio::task::spawn_blocking(move || run(cases)).await?
}

fn run(cases: u32) -> Result<Option<ModelResult>> {
    if cases == 0 {
        println!("skipped (the test suite runs the model at 256 cases; --model-cases sets more)");
        return Ok(None);
    }
    let built = cargo_test(true)
        .stdout(Stdio::null())
        .status()
        .context("build the library's tests in release")?;
    if !built.success() {
        bail!("building the library's tests in release failed ({built})");
    }
    let started = Instant::now();
    let out = cargo_test(false)
        .env("FGA_RELAY_MODEL_CASES", cases.to_string())
        .stderr(Stdio::null())
        .output()
        .context("run the model test")?;
    let secs = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut passed = 0;
    let mut failed = Vec::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("test delivery::model::") {
            match rest.split_once(" ... ") {
                Some((_, "ok")) => passed += 1,
                Some((name, _)) => failed.push(name.to_owned()),
                None => {}
            }
        }
    }
    if passed + failed.len() == 0 {
        bail!("the model test ran no property:\n{stdout}");
    }
    if !failed.is_empty() {
        // The counterexample proptest shrank to, for whoever reads the run.
        println!("{stdout}");
    }
    println!(
        "{} cases of each of {} properties in {secs:.0} s: {passed} passed, {} failed {:?}",
        cases,
        passed + failed.len(),
        failed.len(),
        failed
    );
    Ok(Some(ModelResult {
        cases,
        secs,
        passed,
        failed,
    }))
}
