//! Wake-ups: notifications, reconnects, the sweep.

use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, tk, wait_until, writes};

/// With the sweep an hour away, only the notification can explain a prompt delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_insert_reaches_openfga_without_waiting_for_the_sweep() {
    let env = Env::start().await;
    let relay = env.start_relay().await;
    // Let the relay go to sleep (wake lock taken) before inserting.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
    assert!(!relay.logs().contains("sweep found"), "{}", relay.logs());
}

/// A rolled-back insert never reaches OpenFGA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_insert_never_reaches_openfga() {
    let env = Env::start().await;
    let _relay = env.start_relay().await;
    let mut client = env.db.connect().await;
    let tx = client.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO fga_outbox (payload) VALUES ($1)",
        &[&writes(&[tk("user:ghost", "viewer", "document:1")])],
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    assert!(!env.fga.has("user:ghost", "viewer", "document:1"));
    assert!(
        env.fga
            .writes()
            .iter()
            .all(|w| !w.body.to_string().contains("user:ghost"))
    );
}

/// Rows inserted while no relay runs are delivered when one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_inserted_while_the_relay_was_down_are_delivered_when_it_starts() {
    let env = Env::start().await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(
            env.insert(writes(&[tk(&format!("user:u{i}"), "viewer", "document:1")]))
                .await,
        );
    }
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    assert_eq!(env.fga.tuples().len(), 20);
}

/// When the LISTEN backend is terminated, the relay reconnects, LISTENs again and drains at once:
/// rows inserted meanwhile arrive long before the (hour-long) sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_inserted_while_the_listen_backend_was_terminated_are_delivered_promptly() {
    let env = Env::start().await;
    let relay = env.start_relay().await;
    let admin = env.db.connect().await;
    let killed: i64 = admin
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'fga-relay run listener') t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "exactly one LISTEN backend");
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            env.insert(writes(&[tk(&format!("user:u{i}"), "viewer", "document:1")]))
                .await,
        );
    }
    relay.wait_for_log("LISTEN connection reconnected").await;
    wait_until(
        PROMPTLY,
        "rows inserted during the outage are delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    for i in 0..5 {
        assert!(env.fga.has(&format!("user:u{i}"), "viewer", "document:1"));
    }
    // And it is listening again: a new row is delivered without the sweep too.
    let id = env
        .insert(writes(&[tk("user:after", "viewer", "document:1")]))
        .await;
    wait_until(
        PROMPTLY,
        "a row after the reconnect is delivered",
        || async { env.row(id).await.delivered },
    )
    .await;
}

/// SIGTERM: the relay stops claiming, finishes, lets go of leadership cleanly and exits 0; the
/// next relay need not wait out the failover fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_relay_cleanly() {
    let env = Env::start().await;
    let mut relay = env.start_relay().await;
    relay.term();
    let status = relay.wait_exit(PROMPTLY).await;
    assert!(status.success(), "exit status {status}: {}", relay.logs());
    let next = env.start_relay().await;
    assert!(
        !next.logs().contains("did not let go cleanly"),
        "{}",
        next.logs()
    );
}
