//! What an operator sees: `/healthz`, `/metrics` (scraped and parsed), the sweep metric that
//! tells notifications are being lost, the JSON log format, and log priorities under journald.

use crate::common::metrics::{get, scrape, scrape_text, tables};
use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, tk, wait_until, writes};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_in_prometheus_text_and_count_what_happened() {
    let env = Env::start().await;
    let (relay, base) = env.spawn_relay_with_endpoint(&[]).await;
    relay.wait_for_log("delivering (leader)").await;
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);

    let m = scrape(&base).await;
    let store_info = format!("fga_relay_store_info{{store=\"{}\"}}", env.fga.store_id());
    for name in [
        "fga_relay_rows_delivered_total",
        "fga_relay_tuples_delivered_total",
        "fga_relay_writes_total",
        "fga_relay_rows_dead_lettered_total",
        "fga_relay_pending_rows",
        "fga_relay_oldest_pending_age_seconds",
        "fga_relay_listen_connected",
        "fga_relay_leader",
        "fga_relay_listen_reconnects_total",
        "fga_relay_sweep_found_rows_total",
        "fga_relay_delivery_latency_seconds_count",
        "fga_relay_openfga_request_duration_seconds_count{outcome=\"ok\"}",
        "fga_relay_openfga_request_duration_seconds_count{outcome=\"transient\"}",
        "fga_relay_dead_rows",
        "fga_relay_failed_attempts_total{class=\"transient\"}",
        "fga_relay_failed_attempts_total{class=\"permanent\"}",
        "fga_relay_failed_attempts_total{class=\"configuration\"}",
        "fga_relay_table_count_ok",
        store_info.as_str(),
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(m.contains_key(name), "{name} missing from /metrics");
    }
    assert_eq!(m["fga_relay_table_count_ok"], 1.0);
    // Every fga_relay series names the table, schema first.
    let text = scrape_text(&base).await;
    assert_eq!(tables(&text), ["public.fga_outbox".to_owned()].into());
    // The process metrics are this relay's.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = m["process_start_time_seconds"];
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "{started} vs {now}"
    );
    assert!(m["process_resident_memory_bytes"] > 1e6);
    assert!(m["process_open_fds"] >= 3.0);
    assert!(m["process_cpu_seconds_total"] > 0.0);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", relay.pid()))
        .unwrap()
        .count() as f64;
    assert!(
        (m["process_open_fds"] - fds).abs() <= 3.0,
        "{} open fds said, {fds} in /proc",
        m["process_open_fds"]
    );
    assert_eq!(m["fga_relay_listen_connected"], 1.0);
    assert_eq!(m["fga_relay_leader"], 1.0);
    let version = format!(
        "fga_relay_build_info{{version=\"{}\",revision=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        crate::version::expected_revision()
    );
    assert_eq!(
        m.get(&version),
        Some(&1.0),
        "{version} missing from /metrics"
    );

    env.insert(writes(&[
        tk("user:a", "viewer", "document:1"),
        tk("user:b", "viewer", "document:1"),
    ]))
    .await;
    env.insert(serde_json::json!({"writes": 5})).await;
    wait_until(PROMPTLY, "one row delivered and one dead", || async {
        let m = scrape(&base).await;
        m["fga_relay_rows_delivered_total"] == 1.0 && m["fga_relay_rows_dead_lettered_total"] == 1.0
    })
    .await;
    let m = scrape(&base).await;
    assert_eq!(m["fga_relay_tuples_delivered_total"], 2.0);
    assert_eq!(m["fga_relay_delivery_latency_seconds_count"], 1.0);
    assert!(m["fga_relay_notifications_total"] >= 1.0);
    assert_eq!(m["fga_relay_sweep_found_rows_total"], 0.0);
    assert_eq!(m["fga_relay_pending_rows"], 0.0);
    assert_eq!(m["fga_relay_dead_rows"], 1.0);
    assert_eq!(
        m["fga_relay_openfga_request_duration_seconds_count{outcome=\"ok\"}"],
        1.0
    );

    // Pending rows and their age, while OpenFGA is away.
    env.fga.set_refusing(true);
    env.insert(writes(&[tk("user:c", "viewer", "document:1")]))
        .await;
    wait_until(PROMPTLY, "a transient failure is counted", || async {
        scrape(&base).await["fga_relay_failed_attempts_total{class=\"transient\"}"] >= 1.0
    })
    .await;
    let m = scrape(&base).await;
    assert_eq!(m["fga_relay_pending_rows"], 1.0);
    assert!(m["fga_relay_oldest_pending_age_seconds"] > 0.0);
    assert!(m["fga_relay_openfga_request_duration_seconds_count{outcome=\"transient\"}"] >= 1.0);
    env.fga.set_refusing(false);

    // The dead-row gauge is the table's count, not this process's: a restarted relay (or
    // another one) still shows the rows dead-lettered before it.
    drop(relay);
    let (_relay, base) = env.spawn_relay_with_endpoint(&[]).await;
    let m = scrape(&base).await;
    assert_eq!(m["fga_relay_rows_dead_lettered_total"], 0.0);
    assert_eq!(m["fga_relay_dead_rows"], 1.0);
}

/// /healthz is 503 while the LISTEN connection is down, 200 again once it is back. Meanwhile the
/// table cannot be counted: `fga_relay_table_count_ok` says so, while the pending, oldest and dead
/// gauges show the last values counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_follows_the_listen_connection() {
    let env = Env::start().await;
    let (relay, base) = env.spawn_relay_with_endpoint(&[]).await;
    relay.wait_for_log("delivering (leader)").await;
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    env.fga.set_refusing(true);
    env.insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    let m = scrape(&base).await;
    assert_eq!(
        (m["fga_relay_pending_rows"], m["fga_relay_table_count_ok"]),
        (1.0, 1.0)
    );
    env.db.stop_immediately();
    wait_until(PROMPTLY, "healthz says 503", || async {
        get(&format!("{base}/healthz")).await.0 == 503
    })
    .await;
    let m = scrape(&base).await;
    assert_eq!(
        (m["fga_relay_pending_rows"], m["fga_relay_table_count_ok"]),
        (1.0, 0.0)
    );
    relay.wait_for_log("cannot count the table's rows").await;
    env.db.restart_after_stop();
    env.fga.set_refusing(false);
    wait_until(PROMPTLY, "healthz says 200 again", || async {
        get(&format!("{base}/healthz")).await.0 == 200
    })
    .await;
    // The relay first waits out the fence of its session the outage ended (7 s here).
    wait_until(PROMPTLY * 3, "the row delivered and counted", || async {
        let m = scrape(&base).await;
        m["fga_relay_pending_rows"] == 0.0 && m["fga_relay_table_count_ok"] == 1.0
    })
    .await;
    let m = scrape(&base).await;
    assert!(m["fga_relay_listen_reconnects_total"] >= 1.0);
}

/// With the trigger disabled, rows are found only by the sweep: the sweep metric and a warning
/// say that notifications are being lost, and the startup check says the trigger is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_found_by_the_sweep_show_that_notifications_are_lost() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    client
        .batch_execute("ALTER TABLE fga_outbox DISABLE TRIGGER fga_outbox_notify")
        .await
        .unwrap();
    let (relay, base) = env
        .spawn_relay_with_endpoint(&[("FGA_RELAY_SWEEP_INTERVAL", "1s")])
        .await;
    relay.wait_for_log("delivering (leader)").await;
    assert!(
        relay
            .logs()
            .contains("wake-up trigger is missing or disabled"),
        "{}",
        relay.logs()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    // The relay counts the pass once it has ended, just after the row's mark has committed.
    wait_until(PROMPTLY, "the sweep's row is counted", || async {
        scrape(&base).await["fga_relay_sweep_found_rows_total"] >= 1.0
    })
    .await;
    let m = scrape(&base).await;
    assert_eq!(m["fga_relay_sweep_found_rows_total"], 1.0);
    assert_eq!(m["fga_relay_notifications_total"], 0.0);
    relay.wait_for_log("notifications are being lost").await;
}

/// `--log-format json`: one JSON object a line, with the message and fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[("FGA_RELAY_LOG_FORMAT", "json")]);
    relay.wait_for_log("delivering (leader)").await;
    let bad = env.insert(serde_json::json!({"deletes": "x"})).await;
    wait_until(PROMPTLY, "the bad row is dead", || async {
        env.row(bad).await.dead
    })
    .await;
    relay.wait_for_log("row dead-lettered").await;
    let mut saw_dead = false;
    for line in relay.logs().lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        if v["message"] == "row dead-lettered" {
            assert_eq!(v["id"], bad);
            assert!(
                v["reason"]
                    .as_str()
                    .unwrap()
                    .contains("\"deletes\" must be an array")
            );
            saw_dead = true;
        }
    }
    assert!(saw_dead);
}

/// The leader record names the host as gethostname(2) does, so operators can find the relay
/// that delivers (under the shipped unit, /proc/sys/kernel/hostname is hidden: it is not read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_record_names_the_host() {
    let env = Env::start().await;
    let relay = env.start_relay().await;
    let client = env.db.connect().await;
    let holder: String = client
        .query_one("SELECT holder FROM fga_outbox_leader", &[])
        .await
        .unwrap()
        .get(0);
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    assert!(
        holder.starts_with(&format!("{host} pid {}", relay.pid())),
        "{holder}"
    );
}

/// Where a `drain`'s stderr goes, as far as `JOURNAL_STREAM` says.
enum Journal {
    /// Not set (not under systemd).
    Unset,
    /// Set to the device and inode of the file stderr goes to, as systemd sets it.
    ThisFile,
    /// Set, to another stream (a program a service started, its stderr sent elsewhere).
    Elsewhere,
}

/// Runs `drain` with a key OpenFGA refuses (an ERROR line), at debug, its stderr to a file;
/// returns that file's lines.
fn drain_log_lines(env: &Env, format: &str, journal: Journal) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::temp_dir().join(format!(
        "fga-relay-journal-{}-{format}-{}.log",
        std::process::id(),
        match journal {
            Journal::Unset => "unset",
            Journal::ThisFile => "this",
            Journal::Elsewhere => "elsewhere",
        }
    ));
    let file = std::fs::File::create(&path).unwrap();
    let meta = file.metadata().unwrap();
    let mut c = env.command(&["drain", "--timeout", "2s"]);
    c.env("FGA_API_TOKEN", "wrong-key")
        .env("FGA_RELAY_LOG_FORMAT", format)
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::null())
        .stderr(file);
    match journal {
        Journal::Unset => {}
        Journal::ThisFile => {
            c.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        }
        Journal::Elsewhere => {
            c.env(
                "JOURNAL_STREAM",
                format!("{}:{}", meta.dev(), meta.ino() + 1),
            );
        }
    }
    let status = c.status().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(status.code(), Some(1), "{text}");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// The level a line says it has: the text format's second word, or the JSON object's `level`;
/// the line a failed command ends with (`fga-relay: …`) is an error. None for a later line of a
/// text message of several lines.
fn level_of(line: &str, format: &str) -> Option<String> {
    if line.starts_with("fga-relay: ") {
        return Some("ERROR".into());
    }
    if format == "json" {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        return v["level"].as_str().map(str::to_owned);
    }
    line.split_whitespace()
        .nth(1)
        .filter(|w| ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(w))
        .map(str::to_owned)
}

/// With stderr connected to the journal (`JOURNAL_STREAM` names it), every line starts with the
/// syslog priority of its level, in both formats, so that `journalctl -p warning` finds the
/// warnings and errors; elsewhere (not set, or set for another stream) no line does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_carry_their_syslog_priority_when_stderr_is_the_journal() {
    let fga = crate::common::fga::Fga::builder()
        .preshared_key("right-key")
        .start();
    let env = Env::with_fga(fga).await;
    env.insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    for format in ["text", "json"] {
        let mut seen = std::collections::BTreeSet::new();
        // A message of several lines has its priority on each.
        let mut previous = None;
        for line in drain_log_lines(&env, format, Journal::ThisFile) {
            let (priority, rest) = line
                .strip_prefix('<')
                .and_then(|l| l.split_once('>'))
                .unwrap_or_else(|| panic!("no priority ({format}): {line}"));
            let expected = match level_of(rest, format).as_deref() {
                Some("ERROR") => "3",
                Some("WARN") => "4",
                Some("INFO") => "6",
                Some("DEBUG" | "TRACE") => "7",
                Some(other) => panic!("level {other:?} ({format}): {line}"),
                None => previous.unwrap_or_else(|| panic!("{format}: {line}")),
            };
            assert_eq!(priority, expected, "{format}: {line}");
            previous = Some(expected);
            seen.insert(priority.to_owned());
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["3", "4", "6", "7"],
            "{format}: every level, each with its priority"
        );
        for journal in [Journal::Unset, Journal::Elsewhere] {
            for line in drain_log_lines(&env, format, journal) {
                assert!(!line.starts_with('<'), "{format}: {line}");
            }
        }
    }
}
