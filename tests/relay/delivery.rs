//! What reaches OpenFGA, and how.

use crate::common::fga::{Fault, FaultRule, Fga};
use crate::common::pg::{PROMPTLY, count};
use crate::common::relay::{
    Env, README_TUPLES, accepted_writes, assert_no_tuple_in_two_writes_in_flight, assert_success,
    deletes, insert_with, slow_backlog, tk, wait_until, writes,
};
use serde_json::{Value, json};
use std::time::Duration;

/// The README's outbox example: both tuples travel in one Write, so that a member of the organization
/// never has one without the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_tuples_of_one_row_arrive_in_one_write() {
    let env = Env::start().await;
    let _relay = env.start_relay().await;
    let id = env
        .insert(writes(&README_TUPLES.map(|(u, r, o)| tk(u, r, o))))
        .await;
    env.wait_delivered(id).await;
    env.assert_fga_has(&README_TUPLES);
    let ok = accepted_writes(&env.fga);
    assert_eq!(
        ok.len(),
        1,
        "one Write carries both tuples: {:?}",
        ok.iter().map(|w| &w.body).collect::<Vec<_>>()
    );
    let keys = ok[0].body["writes"]["tuple_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(ok[0].body["writes"]["on_duplicate"], "ignore");
}

/// A row larger than OpenFGA's limit is split, and no Write carries more than 100 tuples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_250_tuples_goes_out_in_writes_of_at_most_100() {
    let env = Env::start().await;
    let tuples: Vec<Value> = (0..250)
        .map(|i| tk(&format!("user:u{i}"), "viewer", "document:big"))
        .collect();
    let id = env.insert(writes(&tuples)).await;
    let _relay = env.start_relay().await;
    env.wait_delivered(id).await;
    let sizes: Vec<usize> = env
        .fga
        .writes()
        .iter()
        .map(|w| {
            w.body["writes"]["tuple_keys"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .collect();
    assert!(sizes.iter().all(|&n| n <= 100), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 250, "{sizes:?}");
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert_eq!(env.fga.tuples().len(), 250);
}

/// Many small rows share Writes (as few as the limit allows), and a tuple never appears twice in
/// one Write: the second operation on it waits for the next Write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_batched_without_repeating_a_tuple_in_one_write() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    for i in 0..120 {
        insert_with(
            &client,
            writes(&[tk(&format!("user:u{i}"), "viewer", "document:1")]),
        )
        .await;
    }
    // The same tuple again, deleted: it must not share a Write with its write.
    insert_with(&client, deletes(&[tk("user:u0", "viewer", "document:1")])).await;
    // One Write at a time: with more in flight, the rows after the first hundred would leave
    // without waiting for the delete, which waits for the first Write's answer (three Writes).
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_IN_FLIGHT", "1")]);
    relay.wait_for_log("delivering (leader)").await;
    env.wait_drained().await;
    let ok = accepted_writes(&env.fga);
    for w in &ok {
        let mut seen = std::collections::HashSet::new();
        for part in ["writes", "deletes"] {
            for k in w.body[part]["tuple_keys"].as_array().into_iter().flatten() {
                assert!(
                    seen.insert(k.to_string()),
                    "a tuple twice in one write: {}",
                    w.body
                );
            }
        }
    }
    assert_eq!(ok.len(), 2, "121 operations need two Writes");
    assert!(
        !env.fga.has("user:u0", "viewer", "document:1"),
        "the delete came last"
    );
    assert!(env.fga.has("user:u1", "viewer", "document:1"));
}

/// At least once means a row may be delivered again (a crash between OpenFGA's answer and the
/// mark): OpenFGA must end exactly as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivering_the_same_row_twice_leaves_openfga_unchanged() {
    let env = Env::start().await;
    let id = env
        .insert(json!({
            "writes": [tk("user:anne", "viewer", "document:1")],
            "deletes": [tk("user:bob", "viewer", "document:1")]
        }))
        .await;
    let drain = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    assert_success(&drain, "first drain");
    assert!(env.row(id).await.delivered);
    let before = env.fga.tuples();
    let changes_before = env.fga.changelog().len();

    // As if the relay had crashed before marking the row.
    let client = env.db.connect().await;
    client
        .execute(
            "UPDATE fga_outbox SET processed_at = NULL WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let drain = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    assert_success(&drain, "second drain");

    assert!(env.row(id).await.delivered);
    assert_eq!(env.fga.writes().len(), 2, "the row really was sent twice");
    assert_eq!(env.fga.tuples(), before);
    assert_eq!(
        env.fga.changelog().len(),
        changes_before,
        "the second delivery changed nothing"
    );
}

/// An OpenFGA older than 1.10 ignores on_duplicate/on_missing and answers a duplicate with 400:
/// that counts as success for the tuple, and the rest of the Write still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_openfga_answering_duplicate_counts_as_delivered() {
    let env = Env::with_fga(Fga::builder().legacy().start()).await;
    env.fga.insert_tuple(crate::common::fga::StoredTuple::new(
        "user:anne",
        "viewer",
        "document:1",
    ));
    let dup = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let missing = env
        .insert(deletes(&[tk("user:zed", "viewer", "document:1")]))
        .await;
    let fresh = env
        .insert(writes(&[tk("user:carl", "viewer", "document:1")]))
        .await;
    let out = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    assert_success(&out, "drain");
    for id in [dup, missing, fresh] {
        let row = env.row(id).await;
        assert!(row.delivered && !row.dead, "row {id}: {row:?}");
    }
    assert!(env.fga.has("user:carl", "viewer", "document:1"));
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
}

/// For one tuple, operations reach OpenFGA in outbox id order: the last one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_on_one_tuple_arrive_in_id_order() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let t = tk("user:anne", "viewer", "document:7");
    for i in 0..50 {
        let p = if i % 2 == 0 {
            writes(std::slice::from_ref(&t))
        } else {
            deletes(std::slice::from_ref(&t))
        };
        insert_with(&client, p).await;
    }
    insert_with(&client, writes(std::slice::from_ref(&t))).await;
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    let ops: Vec<bool> = env
        .fga
        .changelog()
        .iter()
        .filter(|c| c.user == "user:anne")
        .map(|c| matches!(c.op, crate::common::fga::Op::Write))
        .collect();
    assert_eq!(ops.len(), 51);
    assert!(
        ops.iter().enumerate().all(|(i, &w)| w == (i % 2 == 0)),
        "{ops:?}"
    );
    assert!(env.fga.has("user:anne", "viewer", "document:7"));
}

/// Operations on one tuple spread over rows that would all fit in one Write: the relay never
/// puts the tuple twice in a Write, so OpenFGA rejects none of them (it would answer 400
/// `cannot_allow_duplicate_tuples_in_one_request`, which splitting would then hide: the
/// rejected Writes are counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tuple_is_never_twice_in_one_write_so_openfga_rejects_none() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let t = || tk("user:twice", "viewer", "document:t");
    for i in 0..9 {
        let other = tk(&format!("user:o{i}"), "viewer", "document:t");
        insert_with(&client, writes(&[other])).await;
        let p = if i % 2 == 0 {
            writes(&[t()])
        } else {
            deletes(&[t()])
        };
        insert_with(&client, p).await;
    }
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    let rejected: Vec<_> = env
        .fga
        .writes()
        .into_iter()
        .filter(|w| w.status != 200)
        .map(|w| w.body)
        .collect();
    assert!(
        rejected.is_empty(),
        "OpenFGA rejected {} Writes, the first: {}",
        rejected.len(),
        rejected.first().unwrap_or(&Value::Null)
    );
    assert_eq!(
        accepted_writes(&env.fga).len(),
        9,
        "one Write per operation on the tuple"
    );
    assert!(
        env.fga.has("user:twice", "viewer", "document:t"),
        "the last operation wrote it"
    );
    assert_eq!(env.dead().await, 0);
}

/// A row another session holds (a relay that lost leadership but has not stopped yet, or any
/// transaction that locked it) may be on its way to OpenFGA: a later row on the same tuple
/// waits for it, while rows on other tuples flow. Once the lock goes, both are delivered, in
/// id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_another_session_holds_keeps_later_rows_on_its_tuple_waiting() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let held = insert_with(&client, writes(&[tk("user:h", "viewer", "document:h")])).await;
    let behind = insert_with(&client, deletes(&[tk("user:h", "viewer", "document:h")])).await;
    let other = insert_with(&client, writes(&[tk("user:x", "viewer", "document:x")])).await;
    let mut holder = env.db.connect().await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM fga_outbox WHERE id = $1 FOR UPDATE",
        &[&held],
    )
    .await
    .unwrap();
    let _relay = env.start_relay().await;
    env.wait_delivered(other).await;
    // The relay has been through the rows (the one after both is delivered), and a second
    // insert wakes it again: the row behind the held one still waits.
    let later = env
        .insert(writes(&[tk("user:y", "viewer", "document:x")]))
        .await;
    env.wait_delivered(later).await;
    let row = env.row(behind).await;
    assert!(
        !row.delivered && !row.dead,
        "the row behind a held row went: {row:?}"
    );
    assert!(!env.fga.has("user:h", "viewer", "document:h"));
    tx.rollback().await.unwrap();
    // Nothing announces the lock going away: the next insert (or the sweep) brings the relay back.
    env.insert(writes(&[tk("user:z", "viewer", "document:x")]))
        .await;
    env.wait_drained().await;
    // Which operations on the held row's tuple OpenFGA accepted, in order (true: a write).
    let order: Vec<bool> = accepted_writes(&env.fga)
        .iter()
        .flat_map(|w| {
            ["writes", "deletes"].into_iter().filter(|part| {
                w.body[*part]["tuple_keys"]
                    .as_array()
                    .is_some_and(|keys| keys.iter().any(|k| k["user"] == "user:h"))
            })
        })
        .map(|part| part == "writes")
        .collect();
    assert_eq!(order, vec![true, false], "the write, then the delete");
    assert!(
        !env.fga.has("user:h", "viewer", "document:h"),
        "the delete came last"
    );
}

/// Grants and revokes of a few tuples, each row with a marker tuple of its own, against an
/// OpenFGA that takes 20 ms per Write. The `n` rows: (tuple, write?) in id order.
fn mixed_plan(n: usize, tuples: usize) -> Vec<(usize, bool)> {
    let mut last = vec![false; tuples];
    (0..n)
        .map(|j| {
            let k = (j * 7 + j / 13) % tuples;
            last[k] = !last[k];
            (k, last[k])
        })
        .collect()
}

/// Row `j`'s payload: a write (or a delete) of tuple `k`, and a marker tuple of its own, which
/// travels in the same Write and tells which row each accepted operation came from.
pub(crate) fn mixed_payload(j: usize, k: usize, write: bool) -> Value {
    let t = tk(&format!("user:t{k}"), "viewer", "document:mix");
    let marker = tk(&format!("user:m{j}"), "viewer", "document:marker");
    if write {
        writes(&[t, marker])
    } else {
        json!({"writes": [marker], "deletes": [t]})
    }
}

/// Several Writes fly together (`--max-in-flight 8` against a 20 ms OpenFGA), yet no two in
/// flight at once touch the same tuple, and every tuple's operations are applied in id order:
/// a tuple in flight holds back every later row on it until its Write is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_writes_fly_together_never_on_the_same_tuple_and_in_order() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(20)),
        1_000_000,
    ));
    let (rows, tuples) = (600, 40);
    let plan = mixed_plan(rows, tuples);
    let client = env.db.connect().await;
    for (j, (k, write)) in plan.iter().enumerate() {
        insert_with(&client, mixed_payload(j, *k, *write)).await;
    }
    let _relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_IN_FLIGHT", "8"),
        ("FGA_MAX_TUPLES_PER_WRITE", "10"),
    ]);
    wait_until(
        Duration::from_secs(60),
        "every row is delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    let overlapping = assert_no_tuple_in_two_writes_in_flight(&env.fga);
    assert!(
        overlapping > 0,
        "no two Writes were ever in flight at once with --max-in-flight 8"
    );
    crate::faults::assert_applied_in_id_order(&env.fga, &plan);
    let mut last = vec![false; tuples];
    for (k, write) in &plan {
        last[*k] = *write;
    }
    for (k, present) in last.iter().enumerate() {
        assert_eq!(
            env.fga.has(&format!("user:t{k}"), "viewer", "document:mix"),
            *present,
            "tuple {k}: OpenFGA does not hold the last operation's state"
        );
    }
}

/// Rows are marked delivered as their Writes are answered, not when a whole page is done: with
/// a slow OpenFGA, part of the first page is already marked while the rest is still on its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_marked_delivered_as_their_writes_are_answered() {
    let env = Env::start().await;
    slow_backlog(&env, "p", 400, Duration::from_millis(50), 0).await;
    let client = env.db.connect().await;
    let _relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "400"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "2"),
        ("FGA_MAX_TUPLES_PER_WRITE", "10"),
    ]);
    // 40 Writes of 50 ms, two at a time: a second or so for the page.
    wait_until(PROMPTLY, "part of the page is marked delivered", || async {
        let marked: i64 = client
            .query_one(
                "SELECT count(*) FROM fga_outbox WHERE processed_at IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        marked > 0 && marked < 400
    })
    .await;
    env.wait_drained().await;
}

/// Rows of one tuple each, `user:u<n>` viewer of `document:<n>` for n in `from..=to`, inserted in
/// one statement; `delivered` inserts them already delivered.
fn rows_sql(from: i64, to: i64, delivered: bool) -> String {
    format!(
        "INSERT INTO fga_outbox (payload, processed_at) \
         SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                  'user', 'user:u' || n, 'relation', 'viewer', 'object', 'document:' || n))), \
                {} \
           FROM generate_series({from}, {to}) n",
        if delivered { "now()" } else { "NULL" }
    )
}

/// What the relay's sessions have read of the table by scanning it whole, once the statistics
/// of at least `updates` row updates (its marks) have reached the server's counters: a
/// backend reports all its counters together, at most a few seconds after its transactions.
async fn rows_scanned_after(admin: &tokio_postgres::Client, updates: i64) -> i64 {
    let read = || async {
        let r = admin
            .query_one(
                "SELECT pg_stat_clear_snapshot(), n_tup_upd, seq_tup_read \
                 FROM pg_stat_user_tables WHERE relid = 'fga_outbox'::regclass",
                &[],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(1), r.get::<_, i64>(2))
    };
    wait_until(
        Duration::from_secs(30),
        &format!("the statistics count {updates} row updates"),
        || async { read().await.0 >= updates },
    )
    .await;
    read().await.1
}

/// The relay prepares its statements once a connection, and after a few runs PostgreSQL keeps a
/// generic plan for each. Planned while the table held a thousand rows, that plan was a scan of
/// the whole table for a Write's lock; kept while the table grows to the millions of delivered
/// rows it keeps as evidence, every Write would read them all. The relay's sessions must find
/// rows by key whatever size the table had when they planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_planned_on_a_small_table_still_find_rows_by_key_once_it_is_large() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    // Autovacuum's statistics would make PostgreSQL plan them again; a busy server may not get to
    // the table for minutes.
    // Statistics of a one-page table, as a new outbox has after its first autovacuum.
    admin
        .batch_execute(&format!(
            "ALTER TABLE fga_outbox SET (autovacuum_enabled = false); {}; ANALYZE fga_outbox",
            rows_sql(1, 50, false)
        ))
        .await
        .unwrap();
    // Writes of one row, one at a time: fifty of them on a few connections, each statement
    // planned generically by its sixth run.
    let _relay = env.spawn_relay(&[
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "1"),
    ]);
    // Waiting for the last row, found by key: counting the pending rows would scan the table
    // itself (its statistics say every row is pending).
    env.wait_delivered(env.newest_id().await).await;
    let before = rows_scanned_after(&admin, 50).await;
    admin
        .batch_execute(&rows_sql(51, 100_050, true))
        .await
        .unwrap();
    admin
        .batch_execute(&rows_sql(100_051, 100_100, false))
        .await
        .unwrap();
    env.wait_delivered(env.newest_id().await).await;
    let scanned = rows_scanned_after(&admin, 100).await - before;
    assert!(
        scanned < 100_000,
        "the relay read {scanned} rows by scanning the table while it delivered 50 rows of a \
         table of 100,100"
    );
}

/// Ids are the table's to give: an application that inserts its own (rows copied from another
/// outbox, an identity that starts below zero to use the whole bigint range) may give 0 or a
/// negative id. Those rows are pending like any other and must be delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_an_id_of_zero_or_below_are_delivered() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let mut ids = Vec::new();
    for (id, user) in [(-5i64, "user:minus"), (0, "user:zero")] {
        client
            .execute(
                "INSERT INTO fga_outbox (id, payload) VALUES ($1, $2)",
                &[&id, &writes(&[tk(user, "viewer", "document:1")])],
            )
            .await
            .unwrap();
        ids.push(id);
    }
    ids.push(insert_with(&client, writes(&[tk("user:one", "viewer", "document:1")])).await);
    let relay = env.start_relay().await;
    let delivered = env
        .all_delivered_within(&ids, Duration::from_secs(20))
        .await;
    let mut states = Vec::new();
    for id in &ids {
        states.push((*id, env.row(*id).await));
    }
    assert!(
        delivered,
        "rows still pending after 20 s: {states:?}\n{}",
        relay.logs()
    );
}

/// pg_stat_statements' pattern for the statement that locks a Write's rows without marking them
/// (lock.sql), and for the one that locks them by marking them (lock_by_marking.sql).
const LOCK: &str = "%SELECT id, payload::text FROM fga_outbox%FOR UPDATE SKIP LOCKED%";
const MARK: &str = "%SET processed_at = clock_timestamp()%RETURNING id, payload::text%";

/// The rows the statements matching `pattern` returned since pg_stat_statements was last reset.
async fn statement_rows(admin: &tokio_postgres::Client, pattern: &str) -> i64 {
    count(
        admin,
        "SELECT coalesce(sum(rows), 0)::bigint FROM pg_stat_statements \
         WHERE query LIKE $1 AND query NOT LIKE '%pg_stat_statements%'",
        &[&pattern],
    )
    .await
}

/// A Write of rows the relay knows nothing of yet (never held, failed or split) locks them by
/// marking them delivered in its transaction, which commits only once OpenFGA accepts it: one
/// UPDATE a row, with no row lock before it (a lock and then a mark cost PostgreSQL about a
/// third more). 1,000 rows of two tuples each pending when the relay starts (Writes of 50 rows,
/// none of them the rows of a read made with nothing in hand, 100 rows locked) are all
/// delivered, each row's tuples in OpenFGA, and the statement that locks rows without marking
/// them (counted by pg_stat_statements) locked none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writes_rows_are_locked_by_their_mark() {
    const ROWS: i64 = 1_000;
    let (env, admin) = Env::with_statement_stats().await;
    admin
        .execute(
            "INSERT INTO fga_outbox (payload) \
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                 'user', 'user:m' || g, 'relation', 'viewer', 'object', 'document:m'), \
                 jsonb_build_object('user', 'user:m' || g, 'relation', 'editor', \
                                    'object', 'document:m'))) \
             FROM generate_series(1, $1::bigint) g",
            &[&ROWS],
        )
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    let relay = env.start_relay().await;
    env.wait_drained().await;
    assert_eq!(env.dead().await, 0);
    for n in [1, ROWS / 2, ROWS] {
        assert!(env.fga.has(&format!("user:m{n}"), "viewer", "document:m"));
        assert!(env.fga.has(&format!("user:m{n}"), "editor", "document:m"));
    }
    let locked = statement_rows(&admin, LOCK).await;
    let by_mark = statement_rows(&admin, MARK).await;
    println!("rows locked by their mark: {by_mark}; by a lock, then marked: {locked}");
    assert_eq!(
        locked,
        0,
        "{locked} rows were locked before they were marked; relay log:\n{}",
        relay.logs()
    );
    assert!(
        by_mark >= ROWS / 2,
        "only {by_mark} of {ROWS} rows were locked by their mark; relay log:\n{}",
        relay.logs()
    );
}

/// The statement that locks a Write's rows by marking them marks nothing when it runs outside
/// the transaction the relay begins for it (should that BEGIN fail while the statement, sent in
/// the same round trip, still runs): on its own it would commit the marks at once, before the
/// Write left. Inside it, it marks the row; on the same session afterwards, it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mark_that_locks_a_write_marks_nothing_outside_its_transaction() {
    let env = Env::start().await;
    let id = env
        .insert(writes(&[tk("user:alone", "viewer", "document:alone")]))
        .await;
    let client = env.db.connect().await;
    let mark = include_str!("../../sql/queries/lock_by_marking.sql");
    let ids = vec![id];
    let alone = client.query(mark, &[&ids]).await.unwrap();
    assert!(alone.is_empty(), "marked outside a transaction: {alone:?}");
    let row = env.row(id).await;
    assert!(!row.delivered, "{row:?}");
    client
        .batch_execute("BEGIN; SET LOCAL fga_relay.marking = on")
        .await
        .unwrap();
    let inside = client.query(mark, &[&ids]).await.unwrap();
    assert_eq!(
        inside.len(),
        1,
        "the row is marked in the relay's transaction"
    );
    client.batch_execute("ROLLBACK").await.unwrap();
    // The same session after that transaction, as a pooled connection is: the setting is
    // defined now, and empty.
    let after = client.query(mark, &[&ids]).await.unwrap();
    assert!(after.is_empty(), "marked after the transaction: {after:?}");
    assert!(!env.row(id).await.delivered);
}

/// After a Write's mark waited in vain for a row another session holds, the Writes lock their
/// rows the skipping way for a second, then mark them again, however busy the stream is: rows
/// keep coming (60 rows of two tuples every 20 ms, more than one Write, so that every Write
/// locks its own rows), the held row is let go, and a Write marks its rows again within a few
/// seconds. When each Write of that second put the second off again, none ever did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_mark_their_rows_again_a_second_after_a_mark_waited_in_vain() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (env, admin) = Env::with_statement_stats().await;
    let held = env
        .insert(writes(&[tk("user:held", "viewer", "document:held")]))
        .await;
    let holder = env.hold_row(held).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, db) = (stop.clone(), env.db.connect().await);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                db.execute(
                    "INSERT INTO fga_outbox (payload) \
                     SELECT jsonb_build_object('writes', jsonb_build_array( \
                         jsonb_build_object('user', 'user:r' || g, 'relation', 'viewer', \
                                            'object', 'document:r'), \
                         jsonb_build_object('user', 'user:r' || g, 'relation', 'editor', \
                                            'object', 'document:r'))) \
                     FROM generate_series($1::bigint, $1::bigint + 59) g",
                    &[&n],
                )
                .await
                .unwrap();
                n += 60;
            }
        })
    };
    let _relay = env.start_relay().await;
    wait_until(
        PROMPTLY,
        "a Write locked its rows the skipping way after its mark waited in vain",
        || async { statement_rows(&admin, LOCK).await > 0 },
    )
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(15),
        "a Write marked its rows again while rows kept coming",
        || async { statement_rows(&admin, MARK).await > 0 },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    env.wait_drained().await;
    assert_eq!(env.dead().await, 0);
    assert!(env.fga.has("user:held", "viewer", "document:held"));
}
