//! Many stores in trouble at once (dozens answering 500, or never answering), each with rows
//! pending ahead of a healthy store's: the healthy store's rows still reach OpenFGA promptly and
//! in order, and the failing stores together do not flood OpenFGA while nothing succeeds. One
//! store's trouble is covered by `lanes.rs` and `stores.rs`; these are about their number.

use crate::common::fga::{Fault, FaultRule};
use crate::common::procs::cpu_time;
use crate::common::relay::{
    Env, RelayProc, deletes, insert_with, poll_until, tk, wait_until, writes,
};
use crate::stores::in_store;
use std::time::{Duration, Instant};

/// Makes `n` stores whose every Write meets `fault`, and commits `rows` pending rows for each,
/// ahead of anything the test commits later: on tuples of their own, or, `chained`, all on one
/// tuple of the store (granted and revoked in turn: each row waits for the one before it).
/// Returns the stores.
async fn troubled_stores(
    env: &Env,
    n: usize,
    rows: usize,
    fault: Fault,
    chained: bool,
) -> Vec<String> {
    let mut stores = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n * rows);
    for i in 0..n {
        let s = env.fga.add_store();
        env.fga
            .push_fault(FaultRule::times(fault.clone(), usize::MAX).when_store(&s));
        for j in 0..rows {
            let row = match chained {
                true if j % 2 == 1 => deletes(&[tk(&format!("user:t{i}"), "viewer", "document:t")]),
                true => writes(&[tk(&format!("user:t{i}"), "viewer", "document:t")]),
                false => writes(&[tk(&format!("user:t{i}x{j}"), "viewer", "document:t")]),
            };
            payloads.push(in_store(row, &s));
        }
        stores.push(s);
    }
    let admin = env.db.connect().await;
    admin
        .execute(
            "INSERT INTO fga_outbox (payload) SELECT unnest($1::jsonb[])",
            &[&payloads],
        )
        .await
        .unwrap();
    stores
}

/// Commits `pairs` pairs of rows of the configured store, one pair after the other: the grant
/// of a tuple, then its revoke, each in a transaction of its own. Returns how long each pair
/// took from the grant's commit until both were delivered (`None`: not within 30 s, and
/// then no more pairs are committed).
async fn healthy_pairs(env: &Env, pairs: usize) -> Vec<Option<Duration>> {
    let client = env.db.connect().await;
    let mut waited = Vec::with_capacity(pairs);
    for k in 0..pairs {
        let t = tk(&format!("user:h{k}"), "viewer", "document:h");
        let from = Instant::now();
        let grant = insert_with(&client, writes(std::slice::from_ref(&t))).await;
        let revoke = insert_with(&client, deletes(std::slice::from_ref(&t))).await;
        let at = poll_until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            || async { env.row(grant).await.delivered && env.row(revoke).await.delivered },
        )
        .await;
        waited.push(at.map(|at| at.duration_since(from)));
        if at.is_none() {
            // The rest would wait as long: said already.
            break;
        }
    }
    waited
}

/// OpenFGA applied each pair of [`healthy_pairs`] in order: the grant, then the revoke, and
/// nothing else on its tuple.
fn assert_pairs_in_order(env: &Env, pairs: usize, relay: &RelayProc) {
    let changes = env.fga.changelog();
    for k in 0..pairs {
        let user = format!("user:h{k}");
        let ops: Vec<_> = changes
            .iter()
            .filter(|c| c.user == user && c.object == "document:h")
            .map(|c| c.op)
            .collect();
        assert_eq!(
            ops,
            vec![
                crate::common::fga::Op::Write,
                crate::common::fga::Op::Delete
            ],
            "pair {k} was not applied as a grant, then its revoke; relay log:\n{}",
            relay.logs()
        );
    }
}

/// `n` stores meet `fault` on every Write, each with rows pending ahead of the configured
/// store's; once their Writes have started, the configured store's rows, committed a pair at a
/// time, each reach OpenFGA within 2 s, in order.
async fn a_healthy_store_is_served_beside(n: usize, fault: Fault, extra: &[(&str, &str)]) {
    let env = Env::start().await;
    let relay = env.spawn_relay(extra);
    relay.wait_for_log("delivering (leader)").await;
    // The configured store works, as a store that flows does: a store not tried yet takes its
    // turn among the others not tried yet, which may all hang.
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:h")]))
        .await;
    env.wait_delivered(first).await;
    troubled_stores(&env, n, 3, fault, false).await;
    // Half of them tried at least once (those that hang hold their Writes for the request
    // timeout, 2 s): the others' turns come while the configured store's rows are committed.
    wait_until(
        Duration::from_secs(60),
        "the troubled stores are tried",
        || async { env.fga.write_count() >= n / 2 },
    )
    .await;
    let waited = healthy_pairs(&env, 8).await;
    println!("each pair beside {n} troubled stores: {waited:?}");
    assert!(
        waited
            .iter()
            .all(|w| w.is_some_and(|w| w < Duration::from_secs(2))),
        "the configured store's rows waited behind {n} troubled stores: {waited:?}; relay \
         log:\n{}",
        relay.logs()
    );
    assert_pairs_in_order(&env, 8, &relay);
}

/// 60 stores whose Writes are never answered (each times out after the harness's 2 s request
/// timeout, then is held and tried again), each with rows pending ahead: the configured
/// store's rows still go at once. Planned in id order, with no share of the window kept from
/// the stores that never answer, the window was always refilled with their Writes as theirs
/// timed out, and the configured store's rows waited for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_hanging_stores_do_not_hold_up_a_healthy_stores_rows() {
    a_healthy_store_is_served_beside(60, Fault::Hang, &[]).await;
}

/// 60 stores whose Writes all fail (500), each with rows pending ahead: the configured
/// store's rows still go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_failing_stores_do_not_hold_up_a_healthy_stores_rows() {
    a_healthy_store_is_served_beside(60, Fault::internal(), &[]).await;
}

/// 120 stores whose Writes all fail (500), and nothing else pending: while nothing at all
/// succeeds, the failing stores together send at most about one Write each 100 ms, rather than
/// each its own every 2 s (60 a second); a store not tried yet is not held to that pace, and
/// once OpenFGA answers again every row is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_failing_stores_are_paced_while_nothing_succeeds() {
    let env = Env::start().await;
    troubled_stores(&env, 120, 1, Fault::internal(), false).await;
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("delivering (leader)").await;
    crate::common::relay::wait_for_writes(&env.fga, 120, "every failing store is tried").await;
    // Measured once nothing has succeeded for 5 s: from 6 s after the first Write.
    let first_write = env.fga.writes().first().map(|w| w.received_at);
    let settled = first_write.unwrap_or_else(Instant::now) + Duration::from_secs(6);
    tokio::time::sleep_until(settled.into()).await;
    let (count_from, cpu_from) = (env.fga.write_count(), cpu_time(relay.pid()));
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent = env.fga.write_count() - count_from;
    let rate = sent as f64 / from.elapsed().as_secs_f64();
    let cpu = (cpu_time(relay.pid()) - cpu_from).as_secs_f64() / from.elapsed().as_secs_f64();
    println!("{sent} Writes in 5 s ({rate:.1} a second), the relay at {cpu:.3} of a CPU");
    // About ten a second: well below what each store's own backoff alone lets through.
    assert!(
        rate < 20.0,
        "the failing stores sent {rate:.1} Writes a second while nothing succeeded; relay \
         log:\n{}",
        relay.logs()
    );
    // A store not tried yet goes at once, whatever the pace of the failing ones.
    let fresh = env.fga.add_store();
    let committed = Instant::now();
    let first = env
        .insert(in_store(
            writes(&[tk("user:f", "viewer", "document:f")]),
            &fresh,
        ))
        .await;
    let at = poll_until(
        Duration::from_secs(30),
        Duration::from_millis(10),
        || async { env.row(first).await.delivered },
    )
    .await;
    let waited = at.map(|at| at.duration_since(committed));
    assert!(
        at.is_some(),
        "a store not tried yet was not delivered; relay log:\n{}",
        relay.logs()
    );
    println!("the fresh store's row: {waited:?}");
    env.fga.clear_faults();
    env.wait_drained_within(Duration::from_secs(60)).await;
}

/// The queue held at its bound by the rows of stores whose Writes never answer (reads of 2
/// rows: the bound is 16 rows; 40 such stores, 5 rows each on one tuple ahead, so that each has
/// a Write in flight and rows waiting behind it, none held): a burst of 30 rows of the
/// configured store, a store that works, committed at once, is read and delivered within
/// seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_at_its_bound_with_hanging_stores_rows_still_reads_a_healthy_stores_rows() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[("FGA_RELAY_BATCH_SIZE", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:h")]))
        .await;
    env.wait_delivered(first).await;
    troubled_stores(&env, 40, 5, Fault::Hang, true).await;
    wait_until(
        Duration::from_secs(60),
        "the hanging stores are tried",
        || async { env.fga.write_count() >= 8 },
    )
    .await;
    let rows: Vec<serde_json::Value> = (0..30)
        .map(|k| writes(&[tk(&format!("user:b{k}"), "viewer", "document:burst")]))
        .collect();
    let admin = env.db.connect().await;
    let from = Instant::now();
    let ids: Vec<i64> = admin
        .query(
            "INSERT INTO fga_outbox (payload) SELECT unnest($1::jsonb[]) RETURNING id",
            &[&rows],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let delivered = env
        .all_delivered_within(&ids, Duration::from_secs(30))
        .await;
    let took = from.elapsed();
    println!("the burst of 30 rows: {took:?} (all delivered: {delivered})");
    assert!(
        delivered && took < Duration::from_secs(5),
        "the configured store's burst took {took:?} beside 40 hanging stores (all delivered: \
         {delivered}); relay log:\n{}",
        relay.logs()
    );
}
