//! A store whose Writes are slow, hang, go down or fail now and then touches only its own rows:
//! another store's rows go at once, and none of its own good rows is dead-lettered for it.
//! Each of these failed on the relay before the window kept a Write for a store with none in
//! flight, before a strike needed a success that left after the row's failure, and before a
//! row's failures were weighed against how often the Writes beside it fail.

use crate::common::fga::{Fault, FaultRule, RandomFaults};
use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, insert_with, poll_until, tk, wait_until, writes};
use crate::stores::in_store;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A row of `n` distinct tuples: a full Write at the relay's default of 100.
fn wide_row(tag: &str, j: usize, n: usize) -> Value {
    let ts: Vec<Value> = (0..n)
        .map(|i| tk(&format!("user:{tag}{j}x{i}"), "viewer", "document:wide"))
        .collect();
    writes(&ts)
}

/// Store B, with a backlog of full Writes, answers each only after `fault` (slow, or never);
/// the configured store's rows, committed one at a time meanwhile, each go at once: none waits
/// for a slot of the window B's Writes take, nor for B's rows in hand to go before it reads.
async fn another_stores_rows_go_while(fault: Fault, b_rows: usize, a_rows: usize) {
    let env = Env::start().await;
    let b = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::times(fault, usize::MAX).when_store(&b));
    let admin = env.db.connect().await;
    for j in 0..b_rows {
        insert_with(&admin, in_store(wide_row("b", j, 100), &b)).await;
    }
    // Writes that outlast the harness's short request timeout and lease. Reads of 20 rows:
    // more of B's rows than a read's worth wait in hand behind its Writes.
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_REQUEST_TIMEOUT", "6s"),
        ("FGA_RELAY_LEADER_LEASE", "20s"),
        ("FGA_RELAY_BATCH_SIZE", "20"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    // A store whose Writes never answered has half the window (8 of 16) at most.
    wait_until(
        PROMPTLY,
        "B's Writes take their share of the window",
        || async { env.fga.write_count() >= 8 },
    )
    .await;
    let mut waited = Vec::new();
    for n in 0..a_rows {
        let from = Instant::now();
        let id = env
            .insert(writes(&[tk(&format!("user:a{n}"), "viewer", "document:a")]))
            .await;
        let at = poll_until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            || async { env.row(id).await.delivered },
        )
        .await;
        waited.push(at.map(|at| at.duration_since(from)));
    }
    // Without the Write kept for them, the first waits for B's first answers (5 s, or the
    // request timeout), and later ones as long again whenever B's Writes land together.
    assert!(
        waited
            .iter()
            .all(|w| w.is_some_and(|w| w < Duration::from_secs(2))),
        "the configured store's rows waited for store B's Writes: {waited:?}; relay log:\n{}",
        relay.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stores_backlog_does_not_hold_up_another_stores_rows() {
    another_stores_rows_go_while(Fault::Delay(Duration::from_secs(5)), 64, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_store_does_not_hold_up_another_stores_rows() {
    another_stores_rows_go_while(Fault::Hang, 40, 6).await;
}

/// Store B has a backlog of thousands of rows, read in id order ahead of everything committed
/// after it; its Writes succeed, each after 50 ms, one row each. The configured store's rows,
/// committed one at a time meanwhile, each go within 2 s, while B still has rows pending: reads
/// take the lowest pending ids, and without reading the other stores' rows anyway while B's fill
/// the hand, the first waited for B's whole backlog to be read (22 s behind 40,000 rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stores_long_backlog_does_not_hold_up_another_stores_rows() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    env.fga.push_fault(
        FaultRule::times(Fault::Delay(Duration::from_millis(50)), usize::MAX).when_store(&b),
    );
    let admin = env.db.connect().await;
    admin
        .execute(
            "INSERT INTO fga_outbox (payload) SELECT jsonb_build_object('store_id', $1::text, \
             'writes', jsonb_build_array(jsonb_build_object('user', 'user:b' || g, \
             'relation', 'viewer', 'object', 'document:b'))) \
             FROM generate_series(1, 5000) g",
            &[&b],
        )
        .await
        .unwrap();
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "20"),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(PROMPTLY, "B's Writes fill the window", || async {
        env.fga.write_count() >= 16
    })
    .await;
    let mut waited = Vec::new();
    for n in 0..4 {
        let from = Instant::now();
        let id = env
            .insert(writes(&[tk(&format!("user:a{n}"), "viewer", "document:a")]))
            .await;
        let at = poll_until(
            Duration::from_secs(60),
            Duration::from_millis(10),
            || async { env.row(id).await.delivered },
        )
        .await;
        waited.push(at.map(|at| at.duration_since(from)));
    }
    let left = crate::common::pg::count(
        &admin,
        "SELECT count(*) FROM fga_outbox WHERE processed_at IS NULL",
        &[],
    )
    .await;
    assert!(
        waited
            .iter()
            .all(|w| w.is_some_and(|w| w < Duration::from_secs(2))),
        "the configured store's rows waited behind store B's backlog: {waited:?} ({left} of \
         B's rows left); relay log:\n{}",
        relay.logs()
    );
    assert!(left > 0, "B's backlog was gone before the test could tell");
}

/// Store B worked, then goes down: every Write to it answers 500 from then on, while two Writes
/// already on their way succeed a little later, as a server going down still answers the
/// requests it holds. `--max-attempts 2`. Those late successes left before the row's failure:
/// they show nothing about it, and the outage is no strike against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_already_on_their_way_when_a_store_goes_down_strike_no_row() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_ATTEMPTS", "2"),
        ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "1"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let client = env.db.connect().await;
    for n in 0..8 {
        let row = writes(&[tk(&format!("user:w{n}"), "viewer", "document:w")]);
        let id = insert_with(&client, in_store(row, &b)).await;
        env.wait_delivered(id).await;
    }
    for (user, ms) in [("user:slow1", 1000), ("user:slow2", 1900)] {
        env.fga.push_fault(
            FaultRule::once(Fault::Delay(Duration::from_millis(ms)))
                .when_store(&b)
                .when_tuple(user, "viewer", "document:s"),
        );
    }
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), usize::MAX).when_store(&b));
    client.batch_execute("BEGIN").await.unwrap();
    let one = |user: &str, object: &str| in_store(writes(&[tk(user, "viewer", object)]), &b);
    let s1 = insert_with(&client, one("user:slow1", "document:s")).await;
    let r = insert_with(&client, one("user:r", "document:r")).await;
    let s2 = insert_with(&client, one("user:slow2", "document:s")).await;
    client.batch_execute("COMMIT").await.unwrap();
    env.wait_delivered(s1).await;
    env.wait_delivered(s2).await;
    // Counted against it, the two late successes would strike it twice: dead by its sixth
    // failure (its store's backoff doubles from 100 ms, the second success lands after the
    // fourth).
    wait_until(
        Duration::from_secs(30),
        "the row fails seven times",
        || async {
            let row = env.row(r).await;
            row.attempts >= 7 || row.dead
        },
    )
    .await;
    let row = env.row(r).await;
    env.fga.clear_faults();
    assert!(
        !row.dead,
        "a good row was dead-lettered in store B's outage: {row:?}; relay log:\n{}",
        relay.logs()
    );
    env.wait_delivered(r).await;
}

/// Store B answers a fifth of its Writes 500, at random (one bad replica of five behind a load
/// balancer), `--max-attempts 2`, each row its own Write: a row that fails three times in a row
/// by chance (one in 125) passed for one that always fails, and was dead-lettered. Now it takes
/// as many failures as chance alone would explain less than once in a billion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_store_dead_letters_no_good_row() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    env.fga.set_random_faults(Some(RandomFaults {
        internal: 0.2,
        ..RandomFaults::default()
    }));
    let admin = env.db.connect().await;
    let b_rows: Vec<Value> = (0..600)
        .map(|j| {
            in_store(
                writes(&[tk(&format!("user:f{j}"), "viewer", "document:f")]),
                &b,
            )
        })
        .collect();
    admin
        .execute(
            "INSERT INTO fga_outbox (payload) SELECT unnest($1::jsonb[])",
            &[&b_rows],
        )
        .await
        .unwrap();
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_ATTEMPTS", "2"),
        ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "1"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(Duration::from_secs(120), "no row is pending", || async {
        env.pending().await == 0
    })
    .await;
    let failed = env.fga.writes().iter().filter(|w| w.status == 500).count();
    assert!(
        failed > 60,
        "the store failed {failed} Writes: not flaky enough to tell"
    );
    let dead = env.dead().await;
    assert_eq!(
        dead,
        0,
        "good rows dead-lettered by a flaky store ({failed} Writes failed); relay log:\n{}",
        relay.logs()
    );
}
