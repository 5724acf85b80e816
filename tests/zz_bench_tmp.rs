mod common;
use common::fga::*;
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_tmp() {
    let fga = FakeFga::start();
    let client = reqwest::Client::new();
    let url = format!("{}/stores/{STORE_ID}/write", fga.url());
    let n = 4000;
    let bodies: Vec<String> = (0..n).map(|r| {
        let keys: Vec<serde_json::Value> = (0..100).map(|i| serde_json::json!({"user": format!("user:{r}-{i}"), "relation": "viewer", "object": format!("document:{r}")})).collect();
        serde_json::json!({"writes": {"tuple_keys": keys, "on_duplicate": "ignore"}}).to_string()
    }).collect();
    let bodies = std::sync::Arc::new(bodies);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let client = client.clone();
        let url = url.clone();
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < n {
                let r = client
                    .post(&url)
                    .body(bodies[i].clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                let _ = r.bytes().await;
                i += 8;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let e = started.elapsed();
    println!("{n} writes in {e:?}: {:.0}/s", n as f64 / e.as_secs_f64());
}
