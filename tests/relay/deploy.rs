//! The deployment files against a running relay: every metric the Grafana dashboard
//! (`deploy/grafana/`) and the alerting rules (`deploy/prometheus/`) name is one the relay serves
//! on `/metrics`, so that no panel stays empty and no alert waits on a series that never comes.
//! (`.ci/check-deploy` checks the same names against `src/` without running anything; this test
//! also covers the `process_*` metrics, whose names `src/` does not spell.)

use crate::common::relay::{Env, tk, writes};
use std::collections::BTreeSet;
use std::path::Path;

/// The files whose metric names must be served.
const FILES: [&str; 2] = [
    "deploy/grafana/fga-relay.json",
    "deploy/prometheus/fga-relay.rules.yml",
];

/// Every metric name a file mentions (in a query, a legend or a description): the words made of
/// `[A-Za-z0-9_:]` that begin with `fga_relay_` or `process_`.
fn named_metrics(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            ["fga_relay_", "process_"]
                .iter()
                .any(|p| w.len() > p.len() && w.starts_with(p))
        })
        .map(str::to_owned)
        .collect()
}

/// The names of the samples of a Prometheus text exposition (labels left out).
fn served_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Whether `name` is served: as a sample name, or as a histogram's base name (whose samples
/// are `_bucket`, `_count` and `_sum`).
fn is_served(name: &str, served: &BTreeSet<String>) -> bool {
    served.contains(name)
        || ["_bucket", "_count", "_sum"]
            .iter()
            .all(|s| served.contains(&format!("{name}{s}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_name_is_served() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0")]);
    let base = relay.endpoint().await;
    relay.wait_for_log("delivering (leader)").await;
    // A relay that has delivered something, as the dashboard sees it in production.
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;

    let url = format!("{base}/metrics");
    let exposition = match reqwest::get(&url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => panic!("GET {url}: {e}"),
    };
    let served = served_names(&exposition);
    assert!(
        served.contains("fga_relay_rows_delivered_total"),
        "{exposition}"
    );

    let mut missing = Vec::new();
    for file in FILES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let named = named_metrics(&text);
        assert!(
            named.iter().any(|n| n.starts_with("fga_relay_")),
            "{file} names no fga_relay_ metric: has it moved?"
        );
        missing.extend(
            named
                .into_iter()
                .filter(|n| !is_served(n, &served))
                .map(|n| format!("{n} (named by {file})")),
        );
    }
    assert!(
        missing.is_empty(),
        "named by the deployment files but not served on /metrics:\n  {}\n\n/metrics:\n{exposition}",
        missing.join("\n  ")
    );
}

#[test]
fn metric_names_are_found_as_whole_words() {
    let text = r#"rate(fga_relay_rows_delivered_total{table=~"$table"}[5m]) / my_process_x
        process_open_fds "fga_relay_*" every fga_relay_ series, process_"#;
    assert_eq!(
        named_metrics(text).into_iter().collect::<Vec<_>>(),
        ["fga_relay_rows_delivered_total", "process_open_fds"]
    );
    let served = served_names(
        "# HELP x y\nfga_relay_a_bucket{le=\"1\"} 0\nfga_relay_a_count 0\nfga_relay_a_sum 0\nprocess_open_fds 9\n",
    );
    assert!(is_served("fga_relay_a", &served));
    assert!(is_served("fga_relay_a_bucket", &served));
    assert!(is_served("process_open_fds", &served));
    assert!(!is_served("fga_relay_b", &served));
}
