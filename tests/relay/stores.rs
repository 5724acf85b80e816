//! One relay for many OpenFGA stores: rows that name their store (and model) land there, order
//! holds per (store, tuple), a store or model that does not exist dead-letters its rows while the
//! others flow, and one store failing holds only its own rows. Every store is a real store on
//! the test's OpenFGA, reached through the test's fault proxy. Each test fails with its
//! mechanism taken out.

use crate::common::fga::{Fault, FaultRule, Fga};
use crate::common::metrics::scrape;
use crate::common::pg::{PROMPTLY, count};
use crate::common::procs::{cpu_time, peak_kb};
use crate::common::relay::{
    Env, RelayProc, accepted_writes, assert_success, deletes, insert_text, insert_with, poll_until,
    tk, wait_until, writes,
};
use crate::delivery::mixed_payload;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

/// A store id of the right shape that no OpenFGA has.
const NO_SUCH_ID: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

/// `payload`, naming `store`.
pub(crate) fn in_store(mut payload: Value, store: &str) -> Value {
    payload["store_id"] = json!(store);
    payload
}

/// The row numbers of the marker users (`user:m{j}`) a Write body carries.
fn markers(body: &Value) -> Vec<usize> {
    let mut found = Vec::new();
    for side in ["writes", "deletes"] {
        for key in body[side]["tuple_keys"].as_array().into_iter().flatten() {
            if let Some(j) = key["user"]
                .as_str()
                .and_then(|u| u.strip_prefix("user:m"))
                .and_then(|j| j.parse().ok())
            {
                found.push(j);
            }
        }
    }
    found
}

/// Rows name their store (one names the configured store, one none): each tuple lands in its
/// row's store and no other, every Write carries rows of one store only, and Writes to
/// different stores are in flight together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_land_in_the_stores_they_name_one_store_a_write() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let (b, c) = (env.fga.add_store(), env.fga.add_store());
    // Slow Writes: those of different stores overlap.
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(300)),
        1_000_000,
    ));
    let named = [None, Some(&b), Some(&c), Some(&a)];
    let client = env.db.connect().await;
    let mut store_of = Vec::new();
    for (j, name) in named.iter().cycle().take(40).enumerate() {
        let row = writes(&[tk(&format!("user:m{j}"), "viewer", "document:1")]);
        insert_with(&client, name.map_or(row.clone(), |s| in_store(row, s))).await;
        store_of.push(name.map_or(a.clone(), |s| s.clone()));
    }
    let relay = env.start_relay().await;
    env.wait_drained().await;
    for (j, store) in store_of.iter().enumerate() {
        for other in [&a, &b, &c] {
            assert_eq!(
                env.fga
                    .has_in(other, &format!("user:m{j}"), "viewer", "document:1"),
                other == store,
                "row {j} (for store {store}) in store {other}; relay log:\n{}",
                relay.logs()
            );
        }
    }
    let accepted = accepted_writes(&env.fga);
    for w in &accepted {
        for j in markers(&w.body) {
            assert_eq!(
                w.store, store_of[j],
                "row {j} went in a Write to another store"
            );
        }
    }
    let overlap = accepted.iter().any(|w1| {
        accepted.iter().any(|w2| {
            w1.store != w2.store
                && w1.received_at <= w2.received_at
                && w1.answered_at.is_some_and(|t| w2.received_at < t)
        })
    });
    assert!(
        overlap,
        "no two Writes to different stores were in flight together"
    );
}

/// The same tuple in two stores is two tuples: a row on it in one store goes while the row on
/// it in another store keeps failing; each store ends with its own last operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tuple_in_two_stores_is_two_tuples() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let b = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).when_store(&a));
    let relay = env.start_relay().await;
    let t = tk("user:anne", "viewer", "document:1");
    let first = env.insert(writes(std::slice::from_ref(&t))).await;
    let revoked = env.insert(deletes(std::slice::from_ref(&t))).await;
    let in_b = env
        .insert(in_store(writes(std::slice::from_ref(&t)), &b))
        .await;
    wait_until(PROMPTLY, "the row of store B is delivered", || async {
        env.row(in_b).await.delivered
    })
    .await;
    assert!(
        !env.row(first).await.delivered && !env.row(revoked).await.delivered,
        "store A's rows were delivered through the fault"
    );
    env.fga.clear_faults();
    env.wait_delivered(revoked).await;
    assert!(env.row(first).await.delivered);
    assert!(env.fga.has_in(&b, "user:anne", "viewer", "document:1"));
    assert!(
        !env.fga.has_in(&a, "user:anne", "viewer", "document:1"),
        "store A does not hold its last operation; relay log:\n{}",
        relay.logs()
    );
}

/// Grants and revokes: `n` rows, row `j` on (store, tuple) `key(j)`, each a write when that
/// tuple's operation before was a delete (or none). With each (store, tuple)'s last state.
type Plan = Vec<(usize, usize, bool)>;
fn alternating(
    n: usize,
    key: impl Fn(usize) -> (usize, usize),
) -> (Plan, HashMap<(usize, usize), bool>) {
    let mut last = HashMap::new();
    let plan = (0..n)
        .map(|j| {
            let (s, k) = key(j);
            let write = !last.get(&(s, k)).copied().unwrap_or(false);
            last.insert((s, k), write);
            (s, k, write)
        })
        .collect();
    (plan, last)
}

/// Every row's operations went in Writes to its store and, a (store, tuple) taken as one tuple,
/// OpenFGA applied each one's in id order, none missing.
fn assert_applied_in_order_per_store(fga: &Fga, plan: &[(usize, usize, bool)], stores: &[String]) {
    for w in accepted_writes(fga) {
        for j in markers(&w.body) {
            assert_eq!(w.store, stores[plan[j].0], "row {j} went to another store");
        }
    }
    let tuples = plan.iter().map(|p| p.1 + 1).max().unwrap_or(1);
    let flat: Vec<(usize, bool)> = plan.iter().map(|(s, k, w)| (s * tuples + k, *w)).collect();
    crate::faults::assert_applied_in_id_order(fga, &flat);
}

/// Each store holds the last operation's state of each of its tuples.
fn assert_last_states(fga: &Fga, last: &HashMap<(usize, usize), bool>, stores: &[String]) {
    for ((s, k), present) in last {
        assert_eq!(
            fga.has_in(&stores[*s], &format!("user:t{k}"), "viewer", "document:mix"),
            *present,
            "store {s} tuple {k}: OpenFGA does not hold the last operation's state"
        );
    }
}

/// Grants and revokes of the same tuples in two stores, through faults and a leader killed
/// mid-way (a standby takes over): per (store, tuple), OpenFGA applies them in id order, and
/// each store ends holding its own last operation of each tuple.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_holds_per_store_and_tuple_under_two_relays() {
    let env = Env::start().await;
    let stores = vec![env.fga.store_id().to_owned(), env.fga.add_store()];
    let (plan, last) = alternating(300, |j| ((j / 3) % 2, (j * 7 + j / 11) % 4));
    let client = env.db.connect().await;
    let mut a = env.spawn_relay(&[]);
    a.wait_for_log("delivering (leader)").await;
    let b = env.spawn_relay(&[]);
    b.wait_for_log("standing by").await;
    for (j, (s, k, write)) in plan.iter().enumerate() {
        let p = mixed_payload(j, *k, *write);
        // Store 0 is the configured one: its rows name no store, or name it.
        let p = match (*s, j % 2) {
            (0, 0) => p,
            _ => in_store(p, &stores[*s]),
        };
        insert_with(&client, p).await;
        if j % 40 == 0 {
            for f in [
                Fault::internal(),
                Fault::aborted(),
                Fault::Delay(Duration::from_millis(30)),
            ] {
                env.fga.push_fault(FaultRule::once(f));
            }
        }
        if j == 150 {
            a.kill9();
        }
        if j % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    b.wait_for_log("delivering (leader)").await;
    env.wait_drained_within(Duration::from_secs(60)).await;
    env.fga.clear_faults();
    assert_eq!(env.dead().await, 0, "relay log:\n{}", b.logs());
    assert_applied_in_order_per_store(&env.fga, &plan, &stores);
    assert_last_states(&env.fga, &last, &stores);
}

/// Row `id`'s `last_error`, once it is dead (it must be, promptly).
async fn dead_error(env: &Env, id: i64, relay: &RelayProc) -> String {
    let dead = poll_until(PROMPTLY, Duration::from_millis(50), || async {
        env.row(id).await.dead
    })
    .await;
    let r = env.row(id).await;
    assert!(
        dead.is_some(),
        "row {id} ended {r:?}; relay log:\n{}",
        relay.logs()
    );
    r.last_error.unwrap_or_default()
}

/// A row naming a store OpenFGA does not have, or a model its store does not have, is
/// dead-lettered with OpenFGA's answer; a malformed id at once. The rows after them, in the
/// configured store and in another, are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_naming_an_unknown_store_or_model_is_dead_lettered_and_the_others_flow() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    let relay = env.start_relay().await;
    let t = tk("user:anne", "viewer", "document:1");
    let unknown_store = env
        .insert(in_store(writes(std::slice::from_ref(&t)), NO_SUCH_ID))
        .await;
    let mut row = writes(std::slice::from_ref(&t));
    row["authorization_model_id"] = json!(NO_SUCH_ID);
    let unknown_model = env.insert(row).await;
    let malformed = env
        .insert(in_store(writes(std::slice::from_ref(&t)), "store-b"))
        .await;
    let fine = env.insert(writes(std::slice::from_ref(&t))).await;
    let fine_b = env.insert(in_store(writes(&[t]), &b)).await;
    env.wait_delivered(fine).await;
    env.wait_delivered(fine_b).await;
    let e = dead_error(&env, unknown_store, &relay).await;
    assert!(
        e.contains(&format!("OpenFGA has no store {NO_SUCH_ID}")) && e.contains("404"),
        "{e}"
    );
    let e = dead_error(&env, unknown_model, &relay).await;
    assert!(
        e.contains(&format!("has no model {NO_SUCH_ID}"))
            && e.contains("authorization_model_not_found"),
        "{e}"
    );
    let e = dead_error(&env, malformed, &relay).await;
    assert!(
        e.contains("\"store_id\" \"store-b\" is not an OpenFGA id"),
        "{e}"
    );
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
    assert!(env.fga.has_in(&b, "user:anne", "viewer", "document:1"));
    // Nothing was written with the unknown model, or to the unknown store.
    assert!(
        env.fga.writes().iter().all(|w| w.store != NO_SUCH_ID),
        "a Write went to a store that does not exist"
    );
}

/// One store's Writes all fail (500) while the configured store's flow: that store's rows are
/// held, never struck (each tried more often than `--max-attempts` 2 allows strikes), the other
/// rows keep flowing with the window of Writes in flight never narrowed, and once the store
/// answers again its rows are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_failing_holds_only_its_rows_and_the_others_keep_their_speed() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0"),
        ("FGA_RELAY_MAX_ATTEMPTS", "2"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "8"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let endpoint = relay.endpoint().await;
    let row_a = |n: usize| writes(&[tk(&format!("user:a{n}"), "viewer", "document:a")]);
    let first = env.insert(row_a(0)).await;
    env.wait_delivered(first).await;
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).when_store(&b));
    let mut held = Vec::new();
    for n in 0..3 {
        let row = writes(&[tk(&format!("user:b{n}"), "viewer", "document:b")]);
        held.push(env.insert(in_store(row, &b)).await);
    }
    let mut lowest_window = f64::MAX;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for n in 1.. {
        let id = env.insert(row_a(n)).await;
        env.wait_delivered(id).await;
        lowest_window = lowest_window.min(scrape(&endpoint).await["fga_relay_write_window"]);
        let mut tried = true;
        for id in &held {
            tried &= env.row(*id).await.attempts >= 4;
        }
        if tried {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "store B's rows were not tried 4 times each in a minute; relay log:\n{}",
            relay.logs()
        );
    }
    for id in &held {
        let r = env.row(*id).await;
        assert!(
            !r.dead && !r.delivered,
            "a row of the failing store ended {r:?}; relay log:\n{}",
            relay.logs()
        );
    }
    assert_eq!(
        lowest_window, 8.0,
        "the window narrowed for one store's failures"
    );
    env.fga.clear_faults();
    for id in &held {
        env.wait_delivered(*id).await;
    }
}

/// A held store's backlog is not walked at each read: 50,000 pending rows of the configured
/// store, whose every Write fails (500), sit at the head of the table; another store's rows,
/// committed one at a time, are each delivered, and the relay's reads of pending rows touch on
/// average fewer buffers than a walk past the backlog would (about a thousand: 50,000 rows at
/// about 47 a page), counted by pg_stat_statements. Reading in id order, leaving the held
/// store's rows out one by one, every read walked them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_stores_backlog_is_not_walked_at_each_read() {
    const BACKLOG: i64 = 50_000;
    let (env, admin) = Env::with_statement_stats().await;
    let failing = env.fga.store_id().to_owned();
    let b = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), usize::MAX).when_store(&failing));
    admin
        .execute(
            "INSERT INTO fga_outbox (payload) \
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                 'user', 'user:h' || g, 'relation', 'viewer', 'object', 'document:held'))) \
             FROM generate_series(1, $1::bigint) g",
            &[&BACKLOG],
        )
        .await
        .unwrap();
    admin.batch_execute("ANALYZE fga_outbox").await.unwrap();
    // Small reads and Writes: the failing store's own tries, when its hold ends, read and lock
    // little.
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "20"),
        ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "20"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(
        Duration::from_secs(30),
        "the relay tried the failing store",
        || async { env.fga.write_count() > 0 },
    )
    .await;
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    for n in 0..10 {
        let row = writes(&[tk(&format!("user:b{n}"), "viewer", "document:b")]);
        let id = env.insert(in_store(row, &b)).await;
        env.wait_delivered(id).await;
    }
    let (calls, buffers): (i64, i64) = {
        let r = admin
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint, \
                        coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint \
                 FROM pg_stat_statements \
                 WHERE query LIKE '%unnest($1::bigint[])%' \
                   AND query NOT LIKE '%pg_stat_statements%'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(calls >= 10, "{calls} reads for 10 rows delivered");
    let per_read = buffers / calls;
    let lane = admin
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint, \
                    coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint \
             FROM pg_stat_statements \
             WHERE query LIKE '%WITH RECURSIVE walk%' AND query NOT LIKE '%pg_stat_statements%'",
            &[],
        )
        .await
        .unwrap();
    let (by_lane, lane_buffers): (i64, i64) = (lane.get(0), lane.get(1));
    println!(
        "{calls} reads, {per_read} buffers each on average; {by_lane} of them while the store \
         was held, {} buffers each",
        lane_buffers / by_lane.max(1)
    );
    assert!(
        per_read < 200,
        "the relay's reads touched {per_read} buffers each on average ({calls} reads): the held \
         store's backlog was walked; relay log:\n{}",
        relay.logs()
    );
    assert_eq!(
        count(
            &admin,
            "SELECT count(*) FROM fga_outbox WHERE failed_at IS NOT NULL",
            &[]
        )
        .await,
        0,
        "no row of the failing store was dead-lettered"
    );
}

/// While a store is held and its backlog fills the head of the table, the rows are read lane by
/// lane, and the configured store's lane is one: its rows naming none and its rows naming its
/// id, on one tuple, go in id order. Store B (failing, 500) has 1,000 rows at the head; after
/// them, 30 rows on one tuple of the configured store alternate grant and revoke, every third
/// naming the configured store's id, each behind 30 rows naming none on tuples of their own.
/// OpenFGA applies the 30 in id order. Read as two lanes, each with its share of a read, the
/// rows naming the id ran ahead of the rows naming none below them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_naming_the_configured_id_are_read_with_the_rows_naming_none_while_a_store_is_held() {
    let env = Env::start().await;
    let configured = env.fga.store_id().to_owned();
    let b = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), usize::MAX).when_store(&b));
    let client = env.db.connect().await;
    // More than the relay holds at most (eight reads and eight Writes of 20), so that reads in
    // id order cannot reach past them before the store is held.
    client
        .execute(
            "INSERT INTO fga_outbox (payload) \
             SELECT jsonb_build_object('store_id', $1::text, 'writes', jsonb_build_array( \
                 jsonb_build_object('user', 'user:b' || g, 'relation', 'viewer', \
                                    'object', 'document:b'))) \
             FROM generate_series(1, 1000) g",
            &[&b],
        )
        .await
        .unwrap();
    // Row 31i + 30 is the i-th on the tuple: a grant for even i, a revoke for odd, naming the
    // configured store's id for every third; the 30 before it name none, each a tuple of its own.
    client
        .execute(
            "INSERT INTO fga_outbox (payload) \
             SELECT CASE WHEN g % 31 < 30 THEN \
                 jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                     'user', 'user:f' || g, 'relation', 'viewer', 'object', 'document:f'))) \
             ELSE \
                 jsonb_build_object(CASE WHEN (g / 31) % 2 = 0 THEN 'writes' ELSE 'deletes' END, \
                     jsonb_build_array(jsonb_build_object( \
                         'user', 'user:t', 'relation', 'viewer', 'object', 'document:1'))) \
                 || CASE WHEN (g / 31) % 3 = 2 THEN jsonb_build_object('store_id', $1::text) \
                         ELSE '{}'::jsonb END \
             END \
             FROM generate_series(0, 30 * 31 - 1) g ORDER BY g",
            &[&configured],
        )
        .await
        .unwrap();
    let expected: Vec<bool> = (0..30).map(|i| i % 2 == 0).collect();
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "20"),
        ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "20"),
    ]);
    wait_until(
        Duration::from_secs(60),
        "the configured store's rows are delivered",
        || async {
            count(
                &client,
                "SELECT count(*) FROM fga_outbox WHERE processed_at IS NULL \
                 AND coalesce(payload->>'store_id', '') <> $1",
                &[&b],
            )
            .await
                == 0
        },
    )
    .await;
    assert_eq!(
        applied_in(&env.fga, &configured, "user:t"),
        expected,
        "the configured store's tuple was not applied in id order; relay log:\n{}",
        relay.logs()
    );
}

/// Deleted stores hold their own rows only: the configured store deleted while rows naming
/// another store flow, and a store a row names that was deleted (OpenFGA keeps answering its
/// Writes) or that has no model yet. None of those rows is delivered or dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_stores_and_a_store_without_a_model_hold_only_their_rows() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let (b, deleted) = (env.fga.add_store(), env.fga.add_store());
    let no_model = Fga::builder().no_model().start();
    let relay = env.start_relay().await;
    let row_b = |n: usize| {
        in_store(
            writes(&[tk(&format!("user:b{n}"), "viewer", "document:b")]),
            &b,
        )
    };
    let first = env.insert(row_b(0)).await;
    env.wait_delivered(first).await;
    env.fga.delete_store_id(&a);
    env.fga.delete_store_id(&deleted);
    let t = tk("user:anne", "viewer", "document:1");
    let held = [
        env.insert(writes(std::slice::from_ref(&t))).await,
        env.insert(in_store(writes(std::slice::from_ref(&t)), &deleted))
            .await,
        env.insert(in_store(
            writes(std::slice::from_ref(&t)),
            no_model.store_id(),
        ))
        .await,
    ];
    for n in 1..20 {
        let id = env.insert(row_b(n)).await;
        env.wait_delivered(id).await;
    }
    wait_until(PROMPTLY, "every held row was tried (or ended)", || async {
        let mut tried = true;
        for id in &held {
            let r = env.row(*id).await;
            tried &= r.attempts >= 1 || r.delivered || r.dead;
        }
        tried
    })
    .await;
    for id in held {
        let r = env.row(id).await;
        assert!(
            !r.dead && !r.delivered,
            "row {id} ended {r:?}; relay log:\n{}",
            relay.logs()
        );
    }
    assert!(
        env.fga
            .writes()
            .iter()
            .all(|w| w.store != deleted && w.store != a),
        "a Write went to a deleted store; relay log:\n{}",
        relay.logs()
    );
}

/// Rows dead-lettered or corrected by hand while their store is missing (what the relay's
/// message tells an operator to do) are seen as the operator left them: the relay's next try of
/// that store locks its rows, finds one gone and the other changed, records no failure on the
/// first and delivers the second where it now says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_dead_lettered_or_corrected_by_hand_while_their_store_is_missing_are_seen() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    let deleted = env.fga.add_store();
    let relay = env.start_relay().await;
    env.fga.delete_store_id(&deleted);
    let row =
        |user: &str, store: &str| in_store(writes(&[tk(user, "viewer", "document:1")]), store);
    let by_hand = env.insert(row("user:anne", &deleted)).await;
    let corrected = env.insert(row("user:carl", &deleted)).await;
    wait_until(PROMPTLY, "the rows were tried", || async {
        env.row(by_hand).await.attempts >= 1 && env.row(corrected).await.attempts >= 1
    })
    .await;
    let admin = env.db.connect().await;
    admin
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'dead-lettered by hand'
             WHERE id = $1",
            &[&by_hand],
        )
        .await
        .unwrap();
    admin
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&corrected, &row("user:carl", &b)],
        )
        .await
        .unwrap();
    let before = env.row(by_hand).await;
    env.wait_delivered(corrected).await;
    assert!(env.fga.has_in(&b, "user:carl", "viewer", "document:1"));
    // The store is tried again with the row dead-lettered by hand in hand: a row failing
    // alone is held just past its store's wait, so that the store's other rows go first. Once
    // a later row has failed three times, the store was tried after that row's wait.
    let later = env.insert(row("user:bob", &deleted)).await;
    wait_until(
        Duration::from_secs(60),
        "the store was tried again",
        || async { env.row(later).await.attempts >= 3 },
    )
    .await;
    let after = env.row(by_hand).await;
    assert_eq!(
        (after.attempts, after.last_error.as_deref()),
        (before.attempts, Some("dead-lettered by hand")),
        "the relay recorded a failure on a row dead-lettered by hand; relay log:\n{}",
        relay.logs()
    );
}

/// A row changed, after it was read, onto a tuple of the configured store while that store
/// waits out a `Retry-After` with a read's worth of rows queued, with a row of that store below
/// it on that tuple not read yet (reads leave out a store that waits, and one with a read's
/// worth queued; the configured store's rows are not read ahead as a named store's are): once
/// the store may go again, the row below is applied first. (A sweep every second finds the row
/// below soon whatever happens, so that a relay that overtakes it fails on the order, not on a
/// deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_changed_onto_a_waiting_stores_tuple_goes_after_that_stores_row_below_it() {
    let env = Env::start().await;
    let configured = env.fga.store_id().to_owned();
    let other = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::once(Fault::rate_limited(15)).when_store(&configured));
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "2"),
        ("FGA_RELAY_SWEEP_INTERVAL", "1s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let t = tk("user:t", "viewer", "document:1");
    // A read's worth, read and refused together.
    let admin = env.db.connect().await;
    let queued: Vec<i64> = admin
        .query(
            "INSERT INTO fga_outbox (payload) VALUES ($1), ($2) RETURNING id",
            &[
                &writes(&[tk("user:f", "viewer", "document:f")]),
                &writes(&[tk("user:g", "viewer", "document:g")]),
            ],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    wait_until(PROMPTLY, "the store was told to wait", || async {
        env.row(queued[0]).await.attempts >= 1
    })
    .await;
    let below = env.insert(writes(std::slice::from_ref(&t))).await;
    // Read as another store's row, behind a slow Write on its tuple there.
    let a = tk("user:a", "viewer", "document:a");
    env.fga.push_fault(
        FaultRule::once(Fault::Delay(Duration::from_millis(1500))).when_tuple(
            "user:a",
            "viewer",
            "document:a",
        ),
    );
    let slow = env
        .insert(in_store(writes(std::slice::from_ref(&a)), &other))
        .await;
    let changed = env
        .insert(in_store(deletes(std::slice::from_ref(&a)), &other))
        .await;
    wait_until(PROMPTLY, "the slow Write is at OpenFGA", || async {
        env.fga
            .writes()
            .iter()
            .any(|w| w.body.to_string().contains("user:a"))
    })
    .await;
    admin
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&changed, &deletes(std::slice::from_ref(&t))],
        )
        .await
        .unwrap();
    // The store waits out its 15 s first.
    wait_until(
        Duration::from_secs(40),
        "every row is delivered",
        || async {
            let mut all = true;
            for id in [slow, queued[0], queued[1], below, changed] {
                all &= env.row(id).await.delivered;
            }
            all
        },
    )
    .await;
    assert_eq!(
        applied_in(&env.fga, &configured, "user:t"),
        [true, false],
        "the changed row's delete went before the write below it; relay log:\n{}",
        relay.logs()
    );
    assert!(!env.fga.has("user:t", "viewer", "document:1"));
}

/// `reconcile` compares each store's tuples against that store's own Read: a tuple removed
/// behind the relay's back in one store is drift there, and not hidden by the same tuple in
/// another store; `--store` checks one store; `--repair` enqueues corrections that name their
/// store, and once they are delivered every store is in step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_checks_each_store_against_its_own_read() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let b = env.fga.add_store();
    let t = tk("user:anne", "viewer", "document:1");
    env.insert(writes(std::slice::from_ref(&t))).await;
    env.insert(in_store(writes(std::slice::from_ref(&t)), &b))
        .await;
    env.insert(in_store(
        writes(&[tk("user:bob", "viewer", "document:1")]),
        &b,
    ))
    .await;
    let drained = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    assert_success(&drained, "drain");
    env.fga.write_direct_in(&b, vec![], vec![t]).unwrap();
    let check = |args: &[&str]| {
        let mut all = vec!["reconcile", "--json"];
        all.extend_from_slice(args);
        let out = env.command(&all).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), doc)
    };
    let (code, doc) = check(&[]);
    assert_eq!(code, Some(1), "{doc}");
    let findings = doc["findings"].as_array().cloned().unwrap_or_default();
    assert_eq!(findings.len(), 1, "{doc}");
    assert_eq!(findings[0]["status"], "missing");
    assert_eq!(findings[0]["store_id"], json!(b));
    assert_eq!(findings[0]["user"], "user:anne");
    assert_eq!(doc["tuples"], 3, "{doc}");
    let (code, doc) = check(&["--store", &a]);
    assert_eq!((code, &doc["tuples"]), (Some(0), &json!(1)), "{doc}");
    let (code, doc) = check(&["--store", &b]);
    assert_eq!((code, &doc["missing"]), (Some(1), &json!(1)), "{doc}");
    let (code, doc) = check(&["--repair"]);
    assert_eq!(code, Some(1), "{doc}");
    let drained = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    assert_success(&drained, "drain the corrections");
    assert!(env.fga.has_in(&b, "user:anne", "viewer", "document:1"));
    let (code, doc) = check(&[]);
    assert_eq!(code, Some(0), "{doc}");
}

/// `status --json` counts pending and dead rows per store; `retry --store` and `prune --store`
/// touch that store's rows only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_retry_and_prune_work_per_store() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    let admin = env.db.connect().await;
    // Dead rows of three stores (the configured, B, and one that does not exist), and rows of B
    // delivered long ago: the relay is not running.
    for (store, n) in [(None, 1), (Some(b.as_str()), 2), (Some(NO_SUCH_ID), 3)] {
        for i in 0..n {
            let row = writes(&[tk(&format!("user:d{i}"), "viewer", "document:d")]);
            let row = store.map_or(row.clone(), |s| in_store(row, s));
            admin
                .execute(
                    "INSERT INTO fga_outbox (payload, failed_at, last_error) \
                     VALUES ($1, now(), 'test')",
                    &[&row],
                )
                .await
                .unwrap();
        }
    }
    let old = in_store(writes(&[tk("user:o", "viewer", "document:o")]), &b);
    admin
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) VALUES ($1, now() - interval '2 days'), \
             ($2, now() - interval '2 days')",
            &[&old, &writes(&[tk("user:o", "viewer", "document:o")])],
        )
        .await
        .unwrap();
    let status = env.command(&["status", "--json"]).output().unwrap();
    assert_success(&status, "status");
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    let stores = doc["stores"].as_array().cloned().unwrap_or_default();
    let dead_of = |id: Value| {
        stores
            .iter()
            .find(|s| s["store_id"] == id)
            .map(|s| (s["pending"].clone(), s["dead"].clone()))
    };
    assert_eq!(
        dead_of(json!(NO_SUCH_ID)),
        Some((json!(0), json!(3))),
        "{doc}"
    );
    assert_eq!(dead_of(json!(b)), Some((json!(0), json!(2))), "{doc}");
    assert_eq!(dead_of(Value::Null), Some((json!(0), json!(1))), "{doc}");
    let retry = env
        .command(&["retry", "--dead", "--store", &b])
        .output()
        .unwrap();
    assert_success(&retry, "retry --store");
    assert_eq!(env.pending().await, 2, "only store B's dead rows came back");
    let prune = env
        .command(&["prune", "--older-than", "1d", "--store", "none"])
        .output()
        .unwrap();
    assert_success(&prune, "prune --store none");
    let left = count(
        &admin,
        "SELECT count(*) FROM fga_outbox WHERE processed_at IS NOT NULL",
        &[],
    )
    .await;
    assert_eq!(
        left, 1,
        "prune --store none deleted store B's delivered row"
    );
    let refused = env
        .command(&["retry", "--dead", "--store", "tenant-b"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

/// A backlog spread over many stores (a page holds a row of each) is sent in full Writes: each
/// store's next rows are read ahead for its Write, and order per (store, tuple) holds through
/// it; the pages read after pass over the rows read ahead (none is sent twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_spread_over_stores_is_read_ahead_in_order() {
    let env = Env::start().await;
    let stores: Vec<String> = (0..16).map(|_| env.fga.add_store()).collect();
    let (plan, last) = alternating(320, |j| (j % 16, (j / 16) % 8));
    let client = env.db.connect().await;
    for (j, (s, k, write)) in plan.iter().enumerate() {
        insert_with(&client, in_store(mixed_payload(j, *k, *write), &stores[*s])).await;
    }
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "16"),
        ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "10"),
    ]);
    env.wait_drained_within(Duration::from_secs(60)).await;
    assert_eq!(env.dead().await, 0, "relay log:\n{}", relay.logs());
    assert_applied_in_order_per_store(&env.fga, &plan, &stores);
    let widest = accepted_writes(&env.fga)
        .iter()
        .map(|w| markers(&w.body).len())
        .max()
        .unwrap_or(0);
    assert_eq!(
        widest, 5,
        "no Write carried a full Write's rows of one store (5 of 2 tuples)"
    );
    let sent: usize = accepted_writes(&env.fga)
        .iter()
        .map(|w| markers(&w.body).len())
        .sum();
    assert_eq!(sent, plan.len(), "a row was sent twice, or not at all");
    assert_last_states(&env.fga, &last, &stores);
}

/// A dead row brought back skips only what later delivered rows of its own store superseded:
/// a later row on the same tuple in another store is another tuple.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_row_is_superseded_only_by_rows_of_its_store() {
    let env = Env::start().await;
    let b = env.fga.add_store();
    let admin = env.db.connect().await;
    let t = tk("user:anne", "viewer", "document:1");
    let dead: i64 = admin
        .query_one(
            "INSERT INTO fga_outbox (payload, failed_at, last_error) VALUES ($1, now(), 'test') \
             RETURNING id",
            &[&in_store(writes(std::slice::from_ref(&t)), &b)],
        )
        .await
        .unwrap()
        .get(0);
    // Later, and delivered: a delete of the same tuple in the configured store.
    admin
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) VALUES ($1, now())",
            &[&deletes(&[t])],
        )
        .await
        .unwrap();
    let relay = env.start_relay().await;
    let retry = env.command(&["retry", &dead.to_string()]).output().unwrap();
    assert_success(&retry, "retry");
    env.wait_delivered(dead).await;
    assert!(
        env.fga.has_in(&b, "user:anne", "viewer", "document:1"),
        "the retried row's write was skipped for another store's row; relay log:\n{}",
        relay.logs()
    );
}

/// `run` with the configured store given by name (`FGA_STORE_NAME`), with this extra
/// environment.
fn spawn_relay_by_name(env: &Env, extra: &[(&str, &str)]) -> RelayProc {
    let mut vars = vec![
        ("FGA_STORE_ID", ""),
        ("FGA_STORE_NAME", env.fga.store_name()),
    ];
    vars.extend_from_slice(extra);
    env.spawn_relay(&vars)
}

/// The operations OpenFGA applied on `user`'s `viewer` of `document:1` in `store`, in order
/// (`true`: a write).
fn applied_in(fga: &Fga, store: &str, user: &str) -> Vec<bool> {
    fga.changelog_in(store)
        .iter()
        .filter(|c| c.user == user && c.relation == "viewer" && c.object == "document:1")
        .map(|c| c.op == crate::common::fga::Op::Write)
        .collect()
}

/// A relay given its store by name while OpenFGA's ListStores fails says why its rows wait and
/// what to look at, and holds them: the rows naming a store (the configured one by its id, or
/// another) wait, with every row after them, and the rows naming none fail for want of the
/// store's id, struck never. Nothing reaches OpenFGA meanwhile. Once ListStores answers, every
/// row is delivered to its store, in id order per (store, tuple): a revoke naming the configured
/// store's id between two grants naming none is applied between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_wait_while_the_store_name_cannot_be_resolved_then_go_in_order() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let b = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).on_list_stores());
    let anne = || vec![tk("user:anne", "viewer", "document:1")];
    let client = env.db.connect().await;
    let mut ids = Vec::new();
    for row in [
        writes(&anne()),
        in_store(deletes(&anne()), &a),
        in_store(writes(&anne()), &b),
        writes(&anne()),
        in_store(deletes(&anne()), &b),
        in_store(writes(&[tk("user:carol", "viewer", "document:1")]), &a),
    ] {
        ids.push(insert_with(&client, row).await);
    }
    let relay = spawn_relay_by_name(&env, &[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    // The first row names no store: it is tried, and fails before its Write leaves. A third
    // try with `--max-attempts 2`, the row still pending below: none of the failures struck it.
    wait_until(PROMPTLY, "the first row is tried 3 times", || async {
        env.row(ids[0]).await.attempts >= 3
    })
    .await;
    let logs = relay.logs();
    for words in [
        "cannot check the OpenFGA store now; starting anyway and retrying",
        "a row names a store, and the configured store's id is not known yet (--store-name \
         cannot be resolved: is OpenFGA's ListStores answering?); the row and those after it \
         wait until it is",
        "ListStores answered 500 Internal Server Error",
    ] {
        assert!(
            logs.contains(words),
            "the log does not say {words:?}:\n{logs}"
        );
    }
    let first = env.row(ids[0]).await;
    assert!(
        first
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("ListStores answered 500"),
        "{first:?}"
    );
    assert!(
        env.fga.writes().is_empty(),
        "a Write left while the store's id was not known: {:?}; relay log:\n{logs}",
        env.fga.writes()
    );
    for id in &ids {
        let r = env.row(*id).await;
        assert!(
            !r.delivered && !r.dead,
            "row {id} ended {r:?}; relay log:\n{logs}"
        );
    }
    env.fga.clear_faults();
    for id in &ids {
        env.wait_delivered(*id).await;
    }
    assert_eq!(env.dead().await, 0, "relay log:\n{}", relay.logs());
    assert_eq!(
        (
            applied_in(&env.fga, &a, "user:anne"),
            applied_in(&env.fga, &b, "user:anne")
        ),
        (vec![true, false, true], vec![true, false]),
        "not applied in id order per (store, tuple); relay log:\n{}",
        relay.logs()
    );
    assert!(env.fga.has_in(&a, "user:carol", "viewer", "document:1"));
    assert!(!env.fga.has_in(&b, "user:carol", "viewer", "document:1"));
}

/// A dead row brought back (`retry`) while `--store-name` cannot be resolved waits until it can:
/// which later rows are of its store is told by the configured store's id, and a later row
/// naming that id is of its store. Here a grant was dead-lettered and a later revoke naming the
/// configured store's id delivered; the grant retried under a relay that starts while ListStores
/// fails (three times) is skipped as superseded once the name resolves, never replayed over the
/// revoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_row_waits_for_the_store_name_and_a_row_naming_its_id_supersedes_it() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let anne = || vec![tk("user:anne", "viewer", "document:1")];
    env.fga
        .push_fault(crate::order::invalid("user:anne", "viewer", "document:1"));
    let grant = env.insert(writes(&anne())).await;
    let revoke = env.insert(in_store(deletes(&anne()), &a)).await;
    let drained = env
        .command(&["drain", "--timeout", "20s", "--allow-dead"])
        .env_remove("FGA_STORE_ID")
        .env("FGA_STORE_NAME", env.fga.store_name())
        .output()
        .unwrap();
    assert_success(&drained, "drain with FGA_STORE_NAME");
    assert!(env.row(grant).await.dead && env.row(revoke).await.delivered);
    let resolved = env.fga.list_stores().len();
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 3).on_list_stores());
    assert_success(
        &env.command(&["retry", &grant.to_string()])
            .output()
            .unwrap(),
        "retry",
    );
    let relay = spawn_relay_by_name(&env, &[]);
    env.wait_delivered(grant).await;
    let asked = env.fga.list_stores();
    assert_eq!(
        asked.get(resolved..resolved + 4),
        Some(&[500, 500, 500, 200][..]),
        "the relay did not start with the store's name unresolved"
    );
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "the retried grant was replayed over the later revoke naming the configured store \
         (applied: {:?}); relay log:\n{}",
        applied_in(&env.fga, &a, "user:anne"),
        relay.logs()
    );
    assert_eq!(applied_in(&env.fga, &a, "user:anne"), Vec::<bool>::new());
    let note = env.row(grant).await.last_error.unwrap_or_default();
    assert!(
        note.contains(&format!(
            "superseded by later delivered rows: write document:1#viewer@user:anne (row {revoke})"
        )),
        "{note}"
    );
    let logs = relay.logs();
    assert!(
        logs.contains(
            "a retried row is to be checked for later rows of its store that superseded it, \
             and the configured store's id is not known yet"
        ),
        "the log does not say why the retried row waits:\n{logs}"
    );
}

/// A row that cannot be decoded, naming the configured store's id, that another session holds
/// bars the later rows naming no store (they are the same store's), also under a relay that
/// started with its store's name unresolved: the store it bars is told by the name resolved,
/// not guessed. Corrected into a revoke of a tuple that a later row grants, it goes first:
/// OpenFGA ends holding the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_undecodable_row_naming_the_configured_stores_id_bars_its_rows_by_name_too() {
    const LOOKED: &str = "not dead-lettered: another session holds the row";
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    // The check at start fails: the relay starts with the name unresolved.
    env.fga
        .push_fault(FaultRule::once(Fault::internal()).on_list_stores());
    let admin = env.db.connect().await;
    let bad = insert_text(&admin, &json!({ "store_id": a, "writes": [] }).to_string())
        .await
        .unwrap();
    let holder = env.hold_row(bad).await;
    let relay = spawn_relay_by_name(&env, &[]);
    relay.wait_for_log(LOOKED).await;
    let anne = || vec![tk("user:anne", "viewer", "document:1")];
    let grant = env.insert(writes(&anne())).await;
    // The relay has looked at the held row twice since: a relay that let the grant go would
    // have sent it by then.
    let seen = relay.logs().matches(LOOKED).count();
    relay.wait_for_log_count(LOOKED, seen + 2).await;
    let overtaken = env.row(grant).await.delivered;
    holder
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&bad, &in_store(deletes(&anne()), &a)],
        )
        .await
        .unwrap();
    holder.batch_execute("COMMIT").await.unwrap();
    env.wait_drained().await;
    assert!(
        !overtaken && env.fga.has("user:anne", "viewer", "document:1"),
        "the grant went before the corrected revoke (overtaken: {overtaken}); relay log:\n{}",
        relay.logs()
    );
    assert!(env.row(bad).await.delivered);
    assert_eq!(env.fga.list_stores().first(), Some(&500));
}

/// Once every row of `paused` was tried (its store paused by then), commits a row of the
/// configured store: its read lets the paused stores' rows go from a queue at its bound.
async fn commit_once_tried(env: &Env, paused: &[i64]) -> i64 {
    wait_until(PROMPTLY, "every paused store's rows were tried", || async {
        let mut tried = true;
        for id in paused {
            tried &= env.row(*id).await.attempts >= 1;
        }
        tried
    })
    .await;
    env.insert(writes(&[tk("user:q", "viewer", "document:1")]))
        .await
}

/// Rows of stores paused by a `Retry-After` never take the room other stores' rows are read
/// into: with eight stores' rows paused filling the queue's bound (eight reads' worth at a batch
/// of 2), a row of the configured store committed meanwhile is read and delivered during their
/// pause, not after it. Fails with the held stores' rows kept in the queue (`let_go_held`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_paused_stores_never_fill_the_queue_before_another_stores_rows() {
    let env = Env::start().await;
    let mut stores = Vec::new();
    for _ in 0..8 {
        let s = env.fga.add_store();
        env.fga
            .push_fault(FaultRule::times(Fault::rate_limited(60), 1_000_000).when_store(&s));
        stores.push(s);
    }
    let mut paused = Vec::new();
    for (i, s) in stores.iter().enumerate() {
        for n in 0..2 {
            let row = writes(&[tk(&format!("user:p{i}x{n}"), "viewer", "document:p")]);
            paused.push(env.insert(in_store(row, s)).await);
        }
    }
    let relay = env.spawn_relay(&[("FGA_RELAY_BATCH_SIZE", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    let flowing = commit_once_tried(&env, &paused).await;
    // Well within the pause of 60 s the other stores asked for.
    let delivered = env
        .all_delivered_within(&[flowing], Duration::from_secs(30))
        .await;
    assert!(
        delivered,
        "the configured store's row waited for other stores' Retry-After; relay log:\n{}",
        relay.logs()
    );
}

/// Rows of paused stores let go for a queue at its bound are read again when their own store's
/// pause ends, not only the first store's: four stores pause for 4 s and four for 12 s (one
/// `Retry-After` each), their rows fill the queue's bound, and a row of the configured store is
/// committed (its read lets them go). With no other commit and no sweep (every 10 minutes),
/// every row is delivered soon after the longer pause. Fails with only the first pause's end
/// coming due (`Core::holds_due`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_let_go_are_read_again_when_their_own_stores_pause_ends() {
    let env = Env::start().await;
    let mut paused = Vec::new();
    for i in 0..8 {
        let s = env.fga.add_store();
        let pause = if i < 4 { 4 } else { 12 };
        env.fga
            .push_fault(FaultRule::times(Fault::rate_limited(pause), 1).when_store(&s));
        for n in 0..2 {
            let row = writes(&[tk(&format!("user:p{i}x{n}"), "viewer", "document:p")]);
            paused.push(env.insert(in_store(row, &s)).await);
        }
    }
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "2"),
        ("FGA_RELAY_SWEEP_INTERVAL", "10m"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let flowing = commit_once_tried(&env, &paused).await;
    paused.push(flowing);
    // The longer pause, and as long again: well before the sweep.
    let delivered = env
        .all_delivered_within(&paused, Duration::from_secs(40))
        .await;
    assert!(
        delivered,
        "rows of a store paused longer than another waited for the sweep; relay log:\n{}",
        relay.logs()
    );
}

/// A read made while `--store-name` is unresolved leaves out the rows naming no store (their
/// lane held) but cannot leave out those naming the configured store's id, which it does not
/// know yet. When the name resolves during that read, such a row is not queued ahead of a lower
/// row naming no store on its tuple that the read left out: OpenFGA applies the grant, then the
/// revoke. Fails with the read queuing rows of lanes it left out (`Deliverer::left_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_naming_the_configured_id_resolved_during_a_read_waits_for_the_rows_it_left_out() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).on_list_stores());
    let client = env.db.connect().await;
    let first = insert_with(&client, writes(&[tk("user:carl", "viewer", "document:9")])).await;
    let relay = spawn_relay_by_name(&env, &[("FGA_RELAY_BATCH_SIZE", "1")]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(PROMPTLY, "the first row is tried", || async {
        env.row(first).await.attempts >= 1
    })
    .await;
    let anne = || vec![tk("user:anne", "viewer", "document:1")];
    let grant = insert_with(&client, writes(&anne())).await;
    let revoke = insert_with(&client, in_store(deletes(&anne()), &a)).await;
    // The relay reads the new rows, and asks for the name again, while ListStores still fails.
    let asked = env.fga.list_stores().len();
    wait_until(
        PROMPTLY,
        "the relay asks for the store's name twice more",
        || async { env.fga.list_stores().len() >= asked + 2 },
    )
    .await;
    env.fga.clear_faults();
    for id in [first, grant, revoke] {
        env.wait_delivered(id).await;
    }
    assert_eq!(
        applied_in(&env.fga, &a, "user:anne"),
        vec![true, false],
        "not applied in id order; writes {:?}; relay log:\n{}",
        env.fga.writes().iter().map(|w| &w.body).collect::<Vec<_>>(),
        relay.logs()
    );
}

/// A store answered 429 with a `Retry-After` while another of its Writes was in flight, which
/// then succeeds: the success ends the store's backoff, not the pause OpenFGA asked for. The
/// throttled row waits it out quietly, rather than being planned, turned back at the gate and
/// planned again for the whole pause (which took 1.9 s of CPU in 5 s). Fails with a success
/// ending the hold regardless of the gate (`Lanes::note`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_during_a_retry_after_leaves_the_pause_in_place() {
    let env = Env::start().await;
    env.fga.push_fault(
        FaultRule::once(Fault::Delay(Duration::from_millis(1500))).when_tuple(
            "user:a1",
            "viewer",
            "document:1",
        ),
    );
    env.fga
        .push_fault(FaultRule::once(Fault::rate_limited(20)).when_tuple(
            "user:a0",
            "viewer",
            "document:1",
        ));
    let client = env.db.connect().await;
    let mut ids = Vec::new();
    for n in [1, 0] {
        let row = writes(&[tk(&format!("user:a{n}"), "viewer", "document:1")]);
        ids.push(insert_with(&client, row).await);
    }
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_TUPLES_PER_WRITE", "1")]);
    relay.wait_for_log("delivering (leader)").await;
    env.wait_delivered(ids[0]).await;
    let before = cpu_time(relay.pid());
    // A window of the pause (20 s), after the success.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let used = (cpu_time(relay.pid()) - before).as_secs_f64();
    assert!(
        !env.row(ids[1]).await.delivered,
        "the throttled row went before its pause was over"
    );
    assert!(
        used < 0.5,
        "the relay used {used:.2} s of CPU in 5 s while a store waited out a Retry-After"
    );
}

/// An answer to a question the relay asks (here ListStores, for `--store-name`) is read no
/// further than 4 MiB, as a Write's answer is no further than 1 MiB: a proxy answering with an
/// endless body cannot make the relay hold it. The name resolves once ListStores answers, and
/// the row is delivered. Fails with the body read whole (the peak memory from `/proc`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_to_a_question_is_not_read_into_memory() {
    let env = Env::start().await;
    env.fga.push_fault(
        FaultRule::times(
            Fault::Garbage {
                status: 200,
                content_type: "application/json".into(),
                body: "x".repeat(128 << 20),
            },
            2,
        )
        .on_list_stores(),
    );
    let relay = spawn_relay_by_name(&env, &[]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    let peak_kb = peak_kb(relay.pid());
    assert!(
        peak_kb < 64 * 1024,
        "the relay held {peak_kb} kB at its peak, for answers of 128 MiB"
    );
}

/// A row naming a store OpenFGA does not have is dead-lettered only while the configured store
/// exists: with the configured store missing too (an OpenFGA on another datastore than the one
/// the rows were written for: restored empty, or the wrong one), it is held, never given up
/// on. Fails with the configured store not asked (`FgaClient::configured_store_exists`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_naming_a_missing_store_is_held_while_the_configured_store_is_missing_too() {
    let env = Env::start().await;
    let a = env.fga.store_id().to_owned();
    let relay = env.start_relay().await;
    let first = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    env.wait_delivered(first).await;
    env.fga.delete_store_id(&a);
    // A store id OpenFGA never had.
    let never = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    let row = env
        .insert(in_store(
            writes(&[tk("user:b", "viewer", "document:1")]),
            never,
        ))
        .await;
    wait_until(
        PROMPTLY,
        "the row naming the missing store is tried",
        || async {
            let r = env.row(row).await;
            r.attempts >= 1 || r.dead
        },
    )
    .await;
    let r = env.row(row).await;
    assert!(
        !r.dead,
        "dead-lettered while the configured store is missing too: {r:?}; relay log:\n{}",
        relay.logs()
    );
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("not the configured store either")),
        "last_error: {:?}",
        r.last_error
    );
}
