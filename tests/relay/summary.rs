//! What a relay says at info while it works: a summary line every interval in which anything
//! happened (counts of this interval, the table's pending and dead rows, latency percentiles),
//! an idle line every ten quiet intervals, and a warning when the oldest pending row waits past
//! `FGA_RELAY_PENDING_AGE_WARN`, and again once it no longer does. (The interval is a minute;
//! here half a second, so the test sees the lines without waiting.)

use crate::common::relay::{Env, accepted_writes, tk, wait_until, writes};
use std::time::Duration;

/// `key=value` of a log line, as tracing's text format writes it.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split_whitespace().next()
}

fn lines<'a>(logs: &'a str, message: &str) -> Vec<&'a str> {
    logs.lines().filter(|l| l.contains(message)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_lines_while_working_idle_lines_and_a_warning_when_rows_wait() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_SUMMARY_INTERVAL", "500ms"),
        ("FGA_RELAY_PENDING_AGE_WARN", "2s"),
        ("RUST_LOG", "info"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let tuples: Vec<_> = (0..=i)
            .map(|j| tk(&format!("user:{i}-{j}"), "viewer", "document:1"))
            .collect();
        ids.push(env.insert(writes(&tuples)).await);
    }
    for id in &ids {
        env.wait_delivered(*id).await;
    }
    // The summary lines of the intervals that saw the deliveries add up to them.
    let summed = |logs: &str, key: &str| -> u64 {
        lines(logs, " summary ")
            .iter()
            .filter_map(|l| field(l, key)?.parse::<u64>().ok())
            .sum()
    };
    wait_until(
        Duration::from_secs(10),
        "summary lines for 3 rows",
        || async { summed(&relay.logs(), "delivered") == 3 },
    )
    .await;
    let logs = relay.logs();
    assert_eq!(summed(&logs, "tuples"), 6, "{logs}");
    assert_eq!(
        summed(&logs, "writes") as usize,
        accepted_writes(&env.fga).len()
    );
    let line = lines(&logs, " summary ")
        .into_iter()
        .find(|l| field(l, "delivered") != Some("0"))
        .unwrap();
    assert!(line.contains(" INFO "), "{line}");
    for key in [
        "failed_transient",
        "failed_permanent",
        "failed_configuration",
        "dead_lettered",
        "pending",
        "oldest_pending_age",
        "dead",
    ] {
        assert!(field(line, key).is_some(), "{key} in {line}");
    }
    assert!(
        field(line, "latency_p50").is_some_and(|v| v != "-"),
        "{line}"
    );
    assert!(
        field(line, "latency_p99").is_some_and(|v| v != "-"),
        "{line}"
    );

    // Quiet: an idle line after ten intervals, and no summary line meanwhile.
    let summaries = lines(&logs, " summary ").len();
    relay.wait_for_log("idle: nothing delivered").await;
    let logs = relay.logs();
    assert_eq!(lines(&logs, " summary ").len(), summaries, "{logs}");
    let idle = lines(&logs, "idle: nothing delivered")[0];
    assert_eq!(field(idle, "pending"), Some("0"), "{idle}");

    // OpenFGA down: the row waits, and past 2 s the relay warns; once it is delivered it says so.
    env.fga.set_refusing(true);
    let id = env
        .insert(writes(&[tk("user:late", "viewer", "document:1")]))
        .await;
    relay
        .wait_for_log("pending rows are waiting too long")
        .await;
    let logs = relay.logs();
    let warning = lines(&logs, "pending rows are waiting too long")[0];
    assert!(warning.contains(" WARN "), "{warning}");
    assert_eq!(field(warning, "pending"), Some("1"), "{warning}");
    let failures = lines(&logs, " summary ")
        .iter()
        .filter_map(|l| field(l, "failed_transient")?.parse::<u64>().ok())
        .sum::<u64>();
    assert!(
        failures > 0,
        "the summary counts the failed Writes:\n{logs}"
    );
    assert!(!env.row(id).await.delivered);
    env.fga.set_refusing(false);
    env.wait_delivered(id).await;
    relay
        .wait_for_log("pending rows no longer wait too long")
        .await;
    assert_eq!(
        relay
            .logs()
            .matches("pending rows are waiting too long")
            .count(),
        1,
        "warned once"
    );
}

/// At the default level, the first delivery after start is said at once (not a minute later in
/// the first summary line), and only the first; log fields are words and ids, not Rust's names
/// for its types (`Notification`, `Id("01HZ...")`, `Some(3600s)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_delivery_is_said_at_info_in_plain_words() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[("RUST_LOG", "info")]);
    relay.wait_for_log("delivering (leader)").await;
    let first = env
        .insert(writes(&[
            tk("user:a", "viewer", "document:1"),
            tk("user:b", "viewer", "document:1"),
        ]))
        .await;
    env.wait_delivered(first).await;
    relay.wait_for_log("first rows delivered").await;
    let second = env
        .insert(writes(&[tk("user:c", "viewer", "document:2")]))
        .await;
    env.wait_delivered(second).await;
    // The second row is delivered after the first was said; the line said it once (the summary
    // line, a minute away, says the rest).
    relay.wait_for_log("delivering (leader)").await;
    let logs = relay.logs();
    let said = lines(&logs, "first rows delivered");
    assert_eq!(said.len(), 1, "{logs}");
    assert_eq!(field(said[0], "rows"), Some("1"), "{logs}");
    // Which pass found the row depends on when the insert landed; it is said in a word.
    let trigger = field(said[0], "trigger").unwrap_or_default();
    assert!(
        ["leadership", "notification", "sweep", "again"].contains(&trigger),
        "{logs}"
    );
    assert!(said[0].contains(" INFO "), "{logs}");
    let start = lines(&logs, "fga-relay starting");
    assert_eq!(field(start[0], "store"), Some(env.fga.store_id()), "{logs}");
    for debug_name in ["Id(", "Name(", "Some(", "Notification", "Sweep", "Connect"] {
        assert!(!logs.contains(debug_name), "{debug_name} in {logs}");
    }

    // reconcile's start line too.
    let out = env
        .command(&["reconcile", "--since", "1h"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = lines(&err, "fga-relay reconcile starting");
    assert_eq!(line.len(), 1, "{err}");
    assert_eq!(field(line[0], "since"), Some("1h"), "{err}");
    assert_eq!(field(line[0], "read_by"), Some("tuple"), "{err}");
    assert_eq!(field(line[0], "store"), Some(env.fga.store_id()), "{err}");
}
