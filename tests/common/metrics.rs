//! Reading a relay's `/metrics`: Prometheus text format, scraped and parsed.

use std::collections::HashMap;

/// `GET {base}/metrics`, which must answer 200, parsed.
pub async fn scrape(base: &str) -> HashMap<String, f64> {
    let url = format!("{base}/metrics");
    let resp = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{text}");
    parse(&text)
}

/// Parses Prometheus text format into `name{labels}` → value.
pub fn parse(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name, value) = line
            .rsplit_once(' ')
            .expect("a sample line is `name value`");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line}"));
        out.insert(name.to_owned(), value);
    }
    out
}
