//! Reading a relay's endpoint: `/metrics` (Prometheus text format, scraped and parsed) and the
//! probes.

use std::collections::{BTreeSet, HashMap};

/// `GET {base}/metrics` as text, which must answer 200 (once the relay has reached PostgreSQL:
/// until then it answers 503, `starting`).
pub async fn scrape_text(base: &str) -> String {
    let url = format!("{base}/metrics");
    let deadline = std::time::Instant::now() + super::pg::PROMPTLY;
    loop {
        let (status, text) = get(&url).await;
        if status == 503 && text.starts_with("starting") && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        }
        assert_eq!(status, 200, "{text}");
        return text;
    }
}

/// `GET {base}/metrics`, parsed (see [`parse`]).
pub async fn scrape(base: &str) -> HashMap<String, f64> {
    parse(&scrape_text(base).await)
}

/// Parses Prometheus text format into `name{labels}` → value, without the `table` label that
/// every `fga_relay_*` series carries (see [`tables`]): `fga_relay_pending_rows`,
/// `fga_relay_failed_attempts_total{class="transient"}`.
pub fn parse(text: &str) -> HashMap<String, f64> {
    samples(text)
        .map(|(series, value)| (without_table(series), value))
        .collect()
}

/// The values of the `table` label on the `fga_relay_*` series; panics if one has none.
pub fn tables(text: &str) -> BTreeSet<String> {
    samples(text)
        .filter(|(series, _)| series.starts_with("fga_relay_"))
        .map(|(series, _)| {
            labels(series)
                .find_map(|l| l.strip_prefix("table=\"")?.strip_suffix('"'))
                .unwrap_or_else(|| panic!("no table label: {series}"))
                .to_owned()
        })
        .collect()
}

/// Each sample line: `name{labels}` and its value.
fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .expect("a sample line is `name value`");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {line}"));
            (series, value)
        })
}

/// A series' labels, `key="value"` each (no value of the relay's holds a comma).
fn labels(series: &str) -> impl Iterator<Item = &str> {
    series
        .split_once('{')
        .map(|(_, l)| l.trim_end_matches('}'))
        .into_iter()
        .flat_map(|l| l.split(','))
        .filter(|l| !l.is_empty())
}

fn without_table(series: &str) -> String {
    let name = series.split('{').next().unwrap_or(series);
    let rest: Vec<&str> = labels(series)
        .filter(|l| !l.starts_with("table="))
        .collect();
    if rest.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{}}}", rest.join(","))
    }
}

/// `GET url`: the status and the body.
pub async fn get(url: &str) -> (u16, String) {
    match reqwest::get(url).await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
        Err(e) => panic!("GET {url}: {e}"),
    }
}
