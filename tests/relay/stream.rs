//! Delivery as one stream with a lane per store: a row committed while Writes fly goes at once,
//! a row committed late is never overtaken, and one store's trouble (a failing backlog, an
//! outage after it worked, a `Retry-After`, wrong settings) never touches another store's rows.
//! Each test but the full window's (which the relay that delivered in passes passed too) failed
//! on that relay.

use crate::common::fga::{Fault, FaultRule, Op};
use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, deletes, insert_with, tk, wait_until, writes};
use crate::stores::in_store;
use std::time::{Duration, Instant};

/// A row committed while a Write is in flight is read and sent at once, beside it: it does not
/// wait for that Write to be answered (the request timeout is long enough that the slow Write is
/// answered, not given up on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_while_a_write_flies_goes_at_once() {
    let env = Env::start().await;
    env.fga.push_fault(
        FaultRule::times(Fault::Delay(Duration::from_secs(8)), 1).when_tuple(
            "user:slow",
            "viewer",
            "document:1",
        ),
    );
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_REQUEST_TIMEOUT", "10s"),
        ("FGA_RELAY_LEADER_LEASE", "12s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let slow = env
        .insert(writes(&[tk("user:slow", "viewer", "document:1")]))
        .await;
    wait_until(PROMPTLY, "the slow Write reaches OpenFGA", || async {
        env.fga.write_count() >= 1
    })
    .await;
    let quick = env
        .insert(writes(&[tk("user:quick", "viewer", "document:2")]))
        .await;
    wait_until(
        PROMPTLY,
        "the row committed while a Write flies is delivered",
        || async { env.row(quick).await.delivered },
    )
    .await;
    assert!(
        !env.row(slow).await.delivered,
        "the row committed while the slow Write flew waited for its answer; relay log:\n{}",
        relay.logs()
    );
    env.wait_drained().await;
}

/// A relay whose window is full still takes a newly committed row as soon as a Write lands,
/// and, with room again and nothing to read, holds the wake lock: writers notify it, and a row
/// committed then is delivered without a sweep (the tests' sweep is an hour away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_a_full_window_picks_up_a_new_row_and_writers_notify_it() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(1500)),
        2,
    ));
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_IN_FLIGHT", "1")]);
    relay.wait_for_log("delivering (leader)").await;
    let first = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    wait_until(PROMPTLY, "the first Write reaches OpenFGA", || async {
        env.fga.write_count() >= 1
    })
    .await;
    let second = env
        .insert(writes(&[tk("user:b", "viewer", "document:2")]))
        .await;
    env.wait_delivered(first).await;
    env.wait_delivered(second).await;
    // Idle again, with room: writers notify.
    let admin = env.db.connect().await;
    wait_until(PROMPTLY, "the relay holds the wake lock", || async {
        crate::common::relay::relay_sleeps(&admin, true).await
    })
    .await;
    let third = env
        .insert(writes(&[tk("user:c", "viewer", "document:3")]))
        .await;
    // Only a notification can explain it: nothing else makes a waiting relay read.
    wait_until(
        PROMPTLY,
        "the row committed at rest is delivered",
        || async { env.row(third).await.delivered },
    )
    .await;
    drop(relay);
}

/// Writers whose transactions overlap without a break (four of them, each holding its insert
/// open 30 ms) while the relay works through a backlog, which it reads without the wake lock:
/// at any instant one of them holds the lock's shared side, having skipped NOTIFY. Once the
/// backlog is delivered the relay still takes the wake lock (it queues for it, and writers that
/// find it queued notify), so the rows that follow are announced, not found on a timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_whose_transactions_overlap_still_let_the_relay_take_the_wake_lock() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("delivering (leader)").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..4u64 {
        let client = env.db.connect().await;
        let stop = stop.clone();
        writers.spawn(async move {
            // Staggered, so that their transactions overlap.
            tokio::time::sleep(Duration::from_millis(8 * w)).await;
            let mut ids = Vec::new();
            let mut i = 0;
            while !stop.is_cancelled() {
                let t = tk(&format!("user:w{w}-{i}"), "viewer", "document:o");
                client.batch_execute("BEGIN").await.unwrap();
                ids.push(insert_with(&client, writes(&[t])).await);
                client
                    .batch_execute("SELECT pg_sleep(0.03); COMMIT")
                    .await
                    .unwrap();
                i += 1;
            }
            ids
        });
    }
    // A backlog larger than a read: the relay lets the wake lock go while it reads on.
    let admin = env.db.connect().await;
    let backlog: Vec<i64> = admin
        .query(
            "INSERT INTO fga_outbox (payload) \
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                 'user', 'user:b' || g, 'relation', 'viewer', 'object', 'document:b'))) \
             FROM generate_series(1, 300) g RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let undelivered = |ids: Vec<i64>| {
        let admin = &admin;
        async move {
            crate::common::pg::count(
                admin,
                "SELECT count(*) FROM fga_outbox WHERE id = ANY($1) AND processed_at IS NULL",
                &[&ids],
            )
            .await
        }
    };
    wait_until(PROMPTLY, "the backlog is delivered", || {
        let left = undelivered(backlog.clone());
        async move { left.await == 0 }
    })
    .await;
    wait_until(
        PROMPTLY,
        "the relay holds the wake lock while writers' transactions overlap",
        || async { crate::common::relay::relay_sleeps(&admin, true).await },
    )
    .await;
    stop.cancel();
    let mut ids = Vec::new();
    while let Some(w) = writers.join_next().await {
        ids.extend(w.unwrap());
    }
    env.wait_drained().await;
    assert_eq!(undelivered(ids).await, 0);
}

/// A row that commits late, with an id below rows read already, is never overtaken by a row
/// committed after it on the same tuple: writer 1 inserts the grant (the lowest id) and commits
/// only once the relay's first Write has left; writer 2, serialised behind it on a business
/// lock as docs/writing.md tells writers to do, then commits the revoke. OpenFGA must apply the
/// grant, then the revoke, and end without the tuple.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_late_is_never_overtaken_by_a_later_row_on_its_tuple() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(200)),
        1_000_000,
    ));
    let writer1 = env.db.connect().await;
    writer1
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(4242)")
        .await
        .expect("writer 1 begins");
    let grant = insert_with(&writer1, writes(&[tk("user:late", "viewer", "document:x")])).await;
    let others = env.db.connect().await;
    for j in 0..150 {
        insert_with(
            &others,
            writes(&[tk(&format!("user:o{j}"), "viewer", "document:1")]),
        )
        .await;
    }
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_IN_FLIGHT", "1"),
        ("FGA_RELAY_BATCH_SIZE", "10"),
    ]);
    wait_until(PROMPTLY, "the first Write reaches OpenFGA", || async {
        env.fga.write_count() >= 1
    })
    .await;
    let writer2 = env.db.connect().await;
    let revoke = tokio::spawn(async move {
        writer2
            .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(4242)")
            .await
            .expect("writer 2 waits for writer 1");
        let id = insert_with(
            &writer2,
            deletes(&[tk("user:late", "viewer", "document:x")]),
        )
        .await;
        writer2
            .batch_execute("COMMIT")
            .await
            .expect("writer 2 commits");
        id
    });
    writer1
        .batch_execute("COMMIT")
        .await
        .expect("writer 1 commits");
    let revoke = revoke.await.expect("writer 2");
    assert!(grant < revoke);
    env.wait_drained_within(Duration::from_secs(60)).await;
    assert!(
        !env.fga.has("user:late", "viewer", "document:x"),
        "OpenFGA holds the tuple: the grant committed late was applied after the revoke; \
         relay log:\n{}",
        relay.logs()
    );
    let order: Vec<Op> = env
        .fga
        .changelog()
        .into_iter()
        .filter(|c| c.user == "user:late")
        .map(|c| c.op)
        .collect();
    assert_eq!(order, [Op::Write, Op::Delete], "the order OpenFGA applied");
}

/// Rows of one store whose Writes keep failing sit at the head of the table: another store's
/// rows, committed after them, are delivered promptly, one after the other, while the failing
/// store's rows stay pending and none is dead-lettered.
async fn another_store_flows_while_one_fails(fault: Fault) {
    let env = Env::start().await;
    let failing = env.fga.store_id().to_owned();
    let healthy = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::times(fault, 1_000_000).when_store(&failing));
    let client = env.db.connect().await;
    client
        .batch_execute(
            "INSERT INTO fga_outbox (payload) SELECT jsonb_build_object('writes', \
             jsonb_build_array(jsonb_build_object('user', 'user:f' || i, 'relation', 'viewer', \
             'object', 'document:1'))) FROM generate_series(1, 3000) i",
        )
        .await
        .expect("the failing store's backlog");
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(PROMPTLY, "the failing store's Writes fail", || async {
        env.fga.writes().iter().any(|w| w.store == failing)
    })
    .await;
    for j in 0..6 {
        let id = env
            .insert(in_store(
                writes(&[tk(&format!("user:h{j}"), "viewer", "document:1")]),
                &healthy,
            ))
            .await;
        wait_until(PROMPTLY, "the healthy store's row is delivered", || async {
            env.row(id).await.delivered
        })
        .await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert_eq!(env.dead().await, 0, "relay log:\n{}", relay.logs());
    assert_eq!(env.pending().await, 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failing_with_a_backlog_at_the_head_never_delays_another_store() {
    another_store_flows_while_one_fails(Fault::internal()).await;
}

/// Wrong settings for one store (a 403 with its slow backoff, up to 30 s): the other store's
/// rows do not wait it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_refused_for_its_settings_never_delays_another_store() {
    another_store_flows_while_one_fails(Fault::status(403, "forbidden", "no access to store"))
        .await;
}

/// A `Retry-After` pauses its own store only: the other store's row goes at once, the throttled
/// store's after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_pauses_only_its_own_store() {
    let env = Env::start().await;
    let throttled = env.fga.store_id().to_owned();
    let other = env.fga.add_store();
    env.fga
        .push_fault(FaultRule::once(Fault::rate_limited(20)).when_store(&throttled));
    let relay = env.start_relay().await;
    let paused = env
        .insert(writes(&[tk("user:p", "viewer", "document:1")]))
        .await;
    wait_until(
        PROMPTLY,
        "the throttled store's Write is answered 429",
        || async { env.fga.write_count() >= 1 },
    )
    .await;
    let flowing = env
        .insert(in_store(
            writes(&[tk("user:q", "viewer", "document:1")]),
            &other,
        ))
        .await;
    wait_until(
        PROMPTLY,
        "the other store's row is delivered during the wait",
        || async { env.row(flowing).await.delivered },
    )
    .await;
    assert!(
        !env.row(paused).await.delivered,
        "the throttled store did not wait; relay log:\n{}",
        relay.logs()
    );
    env.wait_drained_within(Duration::from_secs(40)).await;
    assert_eq!(env.dead().await, 0);
}

/// A store that worked (its last minute's Writes all succeeded), then fails alone while another
/// store flows: its rows are never struck for it (`--max-attempts 2`), however well the other
/// store does, and all are delivered once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_after_working_has_no_row_dead_lettered() {
    let env = Env::start().await;
    let failing = env.fga.store_id().to_owned();
    let flowing = env.fga.add_store();
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    // It works: its recent Writes all succeed, a Write a row.
    for j in 0..40 {
        let id = env
            .insert(writes(&[tk(&format!("user:w{j}"), "viewer", "document:1")]))
            .await;
        env.wait_delivered(id).await;
    }
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).when_store(&failing));
    let started = Instant::now();
    let mut j = 0;
    while started.elapsed() < Duration::from_secs(15) {
        env.insert(writes(&[tk(&format!("user:x{j}"), "viewer", "document:1")]))
            .await;
        env.insert(in_store(
            writes(&[tk(&format!("user:y{j}"), "viewer", "document:1")]),
            &flowing,
        ))
        .await;
        j += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        env.dead().await,
        0,
        "rows of the failing store were dead-lettered; relay log:\n{}",
        relay.logs()
    );
    env.fga.clear_faults();
    env.wait_drained_within(Duration::from_secs(30)).await;
    assert_eq!(env.dead().await, 0);
}

/// A row brought back from dead a second time is looked at again for later rows that
/// superseded it: brought back once (nothing superseded it then), held by failing Writes,
/// dead-lettered by hand meanwhile, then a revoke of its tuple delivered, and brought back
/// again: its grant is skipped, never replayed over the revoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_retry_looks_again_for_rows_that_superseded_it() {
    let env = Env::start().await;
    env.fga
        .push_fault(crate::order::invalid("user:anne", "viewer", "document:1"));
    let grant = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "the grant is dead", || async {
        env.row(grant).await.dead
    })
    .await;
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).when_tuple(
            "user:anne",
            "viewer",
            "document:1",
        ));
    let before = env.row(grant).await.attempts;
    let retry = |args: &[&str]| {
        let out = env.command(args).output().expect("run retry");
        crate::common::relay::assert_success(&out, "fga-relay retry");
    };
    retry(&["retry", &grant.to_string()]);
    wait_until(PROMPTLY, "the grant brought back fails again", || async {
        env.row(grant).await.attempts > before
    })
    .await;
    let admin = env.db.connect().await;
    admin
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'given up on by hand' \
             WHERE id = $1",
            &[&grant],
        )
        .await
        .expect("dead-letter by hand");
    env.fga.clear_faults();
    let revoke = env
        .insert(deletes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(revoke).await;
    retry(&["retry", &grant.to_string()]);
    wait_until(
        PROMPTLY,
        "the grant brought back again is done with",
        || async {
            let r = env.row(grant).await;
            r.delivered || r.dead
        },
    )
    .await;
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "the grant was replayed over the later revoke; relay log:\n{}",
        relay.logs()
    );
    let r = env.row(grant).await;
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("superseded")),
        "{r:?}"
    );
}

/// A burst on one tuple, larger than a read (`--batch-size` 2) and committed at once: the reads
/// leave the lane out while a read's worth of its rows waits in the queue behind the Write in
/// flight. Once they have gone, the rest is read without waiting for a sweep (30 s) or another
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_a_read_on_one_tuple_is_delivered_without_a_sweep() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(200)),
        1_000,
    ));
    let relay = env.spawn_relay(&[("FGA_RELAY_BATCH_SIZE", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    let t = tk("user:burst", "viewer", "document:1");
    let values: Vec<String> = (1..=6).map(|i| format!("(${i})")).collect();
    let payloads: Vec<serde_json::Value> = (0..6)
        .map(|i| match i % 2 {
            0 => writes(std::slice::from_ref(&t)),
            _ => deletes(std::slice::from_ref(&t)),
        })
        .collect();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = payloads
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let admin = env.db.connect().await;
    let ids: Vec<i64> = admin
        .query(
            &format!(
                "INSERT INTO fga_outbox (payload) VALUES {} RETURNING id",
                values.join(", ")
            ),
            &params,
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let last = *ids.last().unwrap();
    wait_until(PROMPTLY, "the burst is delivered", || async {
        env.row(last).await.delivered
    })
    .await;
    let applied: Vec<bool> = env
        .fga
        .changelog()
        .iter()
        .filter(|c| c.user == "user:burst")
        .map(|c| c.op == Op::Write)
        .collect();
    assert_eq!(
        applied,
        [true, false, true, false, true, false],
        "relay log:\n{}",
        relay.logs()
    );
}

/// A read whose every row is dead-lettered (none can be decoded) leaves nothing in the queue
/// and no Write in flight, and the page it read was full: the rows after it are read at once,
/// not when the stream's next timer (the liveness beat, the sweep: ten minutes here) comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_page_of_rows_all_dead_lettered_is_followed_at_once() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let bad = serde_json::json!({ "writes": "not a list" });
    let good = writes(&[tk("user:after", "viewer", "document:1")]);
    let ids: Vec<i64> = admin
        .query(
            "INSERT INTO fga_outbox (payload) VALUES ($1), ($1), ($2) RETURNING id",
            &[&bad, &good],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_BATCH_SIZE", "2"),
        ("FGA_RELAY_SWEEP_INTERVAL", "600s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(
        PROMPTLY,
        "the row after the dead page is delivered",
        || async { env.row(ids[2]).await.delivered },
    )
    .await;
    for &id in &ids[..2] {
        assert!(env.row(id).await.dead, "relay log:\n{}", relay.logs());
    }
}
