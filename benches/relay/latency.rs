//! Scenario: commit → OpenFGA latency of single-row commits at a steady rate, beside the floor
//! (commit → a plain LISTENer).

use crate::args::Sizes;
use crate::common::fga::{Fga, WriteRecord};
use crate::common::pg::TestDb;
use crate::harness::Bench;
use crate::stats::Dist;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// One single-row commit of a latency run.
pub(crate) struct Commit {
    pub(crate) user: String,
    pub(crate) sent: Instant,
    pub(crate) committed: Instant,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct LatencyResult {
    /// Commit returned → the proxy received the Write with the row's tuple.
    pub(crate) relay: Dist,
    /// INSERT sent → the proxy received the Write: an upper bound of the above, which
    /// does not depend on when the writer's task saw its commit return.
    pub(crate) from_send: Dist,
    /// The writer's INSERT (autocommit) round trip: the cost of the commit itself.
    pub(crate) commit: Dist,
    /// Commit returned → a plain LISTENer received a NOTIFY sent by that commit.
    pub(crate) notify_floor: Dist,
    /// Deliveries seen before the writer's commit returned (counted as 0 ms).
    pub(crate) early: usize,
    pub(crate) writes: usize,
}

/// Commits `n` single-row transactions, one every 1/rate s, each writing the unique tuple
/// `user:{tag}{i} viewer document:{tag}`; returns when each commit returned.
pub(crate) async fn commit_steadily(
    client: &Client,
    tag: &str,
    n: usize,
    rate: u32,
) -> Result<Vec<Commit>> {
    let stmt = client
        .prepare("INSERT INTO fga_outbox (payload) VALUES ($1)")
        .await?;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + period.mul_f64(i as f64)).await;
        let user = format!("user:{tag}{i}");
        let payload = json!({"writes": [
            {"user": user, "relation": "viewer", "object": format!("document:{tag}")}
        ]});
        let sent = Instant::now();
        client.execute(&stmt, &[&payload]).await?;
        let committed = Instant::now();
        out.push(Commit {
            user,
            sent,
            committed,
        });
    }
    Ok(out)
}

/// When the proxy first received each user's tuple in a Write OpenFGA accepted.
pub(crate) fn receipts(fga: &Fga) -> HashMap<String, Instant> {
    first_seen(fga, |w| Some(w.received_at))
}

/// For each user written by a Write OpenFGA accepted, the earliest `at` of such a Write.
pub(crate) fn first_seen(
    fga: &Fga,
    at: impl Fn(&WriteRecord) -> Option<Instant>,
) -> HashMap<String, Instant> {
    let mut m: HashMap<String, Instant> = HashMap::new();
    for w in fga.writes() {
        let Some(when) = at(&w).filter(|_| w.status == 200) else {
            continue;
        };
        let Some(keys) = w
            .body
            .pointer("/writes/tuple_keys")
            .and_then(Value::as_array)
        else {
            continue;
        };
        for k in keys {
            if let Some(u) = k.get("user").and_then(Value::as_str) {
                let first = m.entry(u.to_owned()).or_insert(when);
                *first = (*first).min(when);
            }
        }
    }
    m
}

/// Runs a latency measurement against whatever delivers (relay or baseline drainer).
pub(crate) async fn measure_latency(
    db: &TestDb,
    fga: &Fga,
    tag: &str,
    sizes: &Sizes,
    patience: Duration,
) -> Result<LatencyResult> {
    let writer = db.connect().await;
    // Warm-up, not counted: prepared statements, connections, caches.
    let warm = commit_steadily(
        &writer,
        &format!("{tag}w"),
        sizes.latency_warmup,
        sizes.latency_rate,
    )
    .await?;
    if let Some(last) = warm.last() {
        wait_for_tuple(fga, &last.user, &format!("document:{tag}w"), patience).await?;
    }
    let commits = commit_steadily(&writer, tag, sizes.latency_commits, sizes.latency_rate).await?;
    let last = commits.last().expect("at least one commit");
    wait_for_tuple(fga, &last.user, &format!("document:{tag}"), patience).await?;
    // OpenFGA holds the tuple a moment before the proxy has recorded its answer.
    let deadline = Instant::now() + patience;
    let got = loop {
        let got = receipts(fga);
        if commits.iter().all(|c| got.contains_key(&c.user)) || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let mut lat = Vec::with_capacity(commits.len());
    let mut from_send = Vec::with_capacity(commits.len());
    let mut early = 0;
    for c in &commits {
        let at = got
            .get(&c.user)
            .with_context(|| format!("{} was never delivered", c.user))?;
        if *at < c.committed {
            early += 1;
        }
        lat.push(at.saturating_duration_since(c.committed).as_secs_f64() * 1e3);
        from_send.push(at.saturating_duration_since(c.sent).as_secs_f64() * 1e3);
    }
    let first = commits[0].sent;
    let writes = fga
        .writes()
        .iter()
        .filter(|w| w.received_at >= first)
        .count();
    Ok(LatencyResult {
        relay: Dist::of(lat),
        from_send: Dist::of(from_send),
        commit: Dist::of(
            commits
                .iter()
                .map(|c| (c.committed - c.sent).as_secs_f64() * 1e3)
                .collect(),
        ),
        notify_floor: Dist::default(),
        early,
        writes,
    })
}

/// Waits until OpenFGA holds `user viewer object`.
pub(crate) async fn wait_for_tuple(
    fga: &Fga,
    user: &str,
    object: &str,
    patience: Duration,
) -> Result<()> {
    let deadline = Instant::now() + patience;
    while !fga.has(user, "viewer", object) {
        if Instant::now() > deadline {
            bail!("{user} not delivered within {patience:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The floor under any LISTEN/NOTIFY relay: a writer inserts a row and NOTIFYs in one
/// transaction; how long after its commit returns does a plain LISTENer hear it?
pub(crate) async fn notify_floor(db: &TestDb, n: usize, rate: u32) -> Result<Dist> {
    let (listener, mut conn) = tokio_postgres::connect(db.url(), NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let driver = tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notification(_)) => {
                    let _ = tx.send(Instant::now());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    listener
        .batch_execute("CREATE TABLE IF NOT EXISTS bench_floor (x int); LISTEN bench_floor")
        .await?;
    let writer = db.connect().await;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        tokio::time::sleep(period).await;
        writer
            .batch_execute(
                "INSERT INTO bench_floor VALUES (1); SELECT pg_notify('bench_floor', '')",
            )
            .await?;
        let committed = Instant::now();
        let heard = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .context("no notification")?
            .context("listener gone")?;
        if i >= 10 {
            lat.push(heard.saturating_duration_since(committed).as_secs_f64() * 1e3);
        }
    }
    listener.batch_execute("DROP TABLE bench_floor").await?;
    drop(listener);
    driver.abort();
    Ok(Dist::of(lat))
}

impl Bench {
    pub(crate) async fn latency(&self, sizes: &Sizes) -> Result<LatencyResult> {
        self.truncate().await?;
        let floor =
            notify_floor(&self.db, sizes.latency_commits.min(500), sizes.latency_rate).await?;
        let fga = self.fga();
        let relay = self.start_relay(&fga, &[]).await?;
        let cpu0 = self.cpu(Some(relay.pid())).await?;
        let mut r = measure_latency(&self.db, &fga, "lat", sizes, Duration::from_secs(10)).await?;
        let cpu = cpu0.until(&self.cpu(Some(relay.pid())).await?);
        self.stop_relay(relay, "latency", &[]).await;
        r.notify_floor = floor;
        println!(
            "{} single-row commits at {}/s, relay running with default settings",
            sizes.latency_commits, sizes.latency_rate
        );
        println!("  commit → OpenFGA Write:      {}", r.relay.line());
        println!("  INSERT sent → OpenFGA Write: {}", r.from_send.line());
        println!("  insert+commit (writer):      {}", r.commit.line());
        println!("  commit → plain LISTENer:     {}", r.notify_floor.line());
        println!(
            "  Writes sent: {} ({} deliveries seen before the writer saw its commit return)",
            r.writes, r.early
        );
        println!("  {}", cpu.line());
        Ok(r)
    }
}
