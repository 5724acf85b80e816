//! Reading a relay's endpoint: `/metrics` (Prometheus text format, scraped and parsed) and the
//! probes.

use std::collections::HashMap;

/// `GET {base}/metrics`, which must answer 200 (once the relay has reached PostgreSQL: until
/// then it answers 503, `starting`), parsed.
pub async fn scrape(base: &str) -> HashMap<String, f64> {
    parse(&scrape_text(base).await)
}

/// `GET {base}/metrics` as text (see [`scrape`]).
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
