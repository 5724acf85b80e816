//! Delivery guarantees under faults that really happen: the relay killed with SIGKILL,
//! PostgreSQL restarted, OpenFGA refusing, rate-limiting, hanging, rejecting; several relays and
//! a drain at once. Each test checks that no row is lost, none is left claimed, and OpenFGA ends
//! in the state the outbox says.

use crate::common::fga::{Fault, FaultRule, Fga, Model};
use crate::common::metrics::scrape;
use crate::common::pg::{PROMPTLY, PgOptions, TestDb};
use crate::common::procs::peak_kb;
use crate::common::relay::{
    Env, accepted_writes, assert_no_tuple_in_two_writes_in_flight, assert_success, deletes,
    insert_with, slow_backlog, tk, wait_until, write_tuple_keys, writes,
};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// The outbox of `n` rows: row i writes `user:u{i} viewer document:{i % 100}`, and every tenth
/// row also deletes the tuple written five rows before. Returns the expected final tuples.
pub(crate) async fn fill(env: &Env, n: i64) -> BTreeMap<String, bool> {
    let client = env.db.connect().await;
    client
        .execute(
            "INSERT INTO fga_outbox (payload)
             SELECT CASE WHEN i % 10 = 9 THEN jsonb_build_object(
                        'writes', jsonb_build_array(jsonb_build_object(
                            'user', 'user:u' || i, 'relation', 'viewer', 'object', 'document:' || (i % 100))),
                        'deletes', jsonb_build_array(jsonb_build_object(
                            'user', 'user:u' || (i - 5), 'relation', 'viewer', 'object', 'document:' || ((i - 5) % 100))))
                    ELSE jsonb_build_object(
                        'writes', jsonb_build_array(jsonb_build_object(
                            'user', 'user:u' || i, 'relation', 'viewer', 'object', 'document:' || (i % 100))))
                    END
             FROM generate_series(0, $1::bigint - 1) i",
            &[&n],
        )
        .await
        .unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..n {
        expected.insert(format!("user:u{i}|document:{}", i % 100), true);
        if i % 10 == 9 {
            expected.insert(format!("user:u{}|document:{}", i - 5, (i - 5) % 100), false);
        }
    }
    expected
}

/// Asserts that OpenFGA holds exactly the tuples `expected` says are present.
fn assert_final_state(fga: &Fga, expected: &BTreeMap<String, bool>) {
    let held: std::collections::BTreeSet<String> = fga
        .tuples()
        .iter()
        .map(|t| format!("{}|{}", t.user, t.object))
        .collect();
    let want: std::collections::BTreeSet<String> = expected
        .iter()
        .filter(|(_, present)| **present)
        .map(|(k, _)| k.clone())
        .collect();
    let missing: Vec<_> = want.difference(&held).take(10).collect();
    let extra: Vec<_> = held.difference(&want).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "OpenFGA differs from the outbox: missing {missing:?}, extra {extra:?}"
    );
}

/// Operations OpenFGA accepted beyond the outbox's own: deliveries made twice.
fn duplicate_operations(fga: &Fga, outbox_ops: usize) -> usize {
    let accepted: usize = accepted_writes(fga)
        .iter()
        .map(|w| {
            ["writes", "deletes"]
                .iter()
                .map(|p| w.body[p]["tuple_keys"].as_array().map_or(0, Vec::len))
                .sum::<usize>()
        })
        .sum();
    accepted.saturating_sub(outbox_ops)
}

async fn assert_nothing_left(env: &Env) {
    assert_eq!(env.pending().await, 0, "rows left pending");
    assert_eq!(
        env.dead().await,
        0,
        "rows dead-lettered by a transient fault"
    );
    assert_eq!(env.idle_in_transaction().await, 0, "a claim left open");
}

/// SIGKILL at random moments of a 5,000-row drain, five times, with the window of Writes in
/// flight full: nothing is lost, and each crash costs at most the Writes that were in flight
/// (`--max-in-flight` Writes of at most `--max-tuples-per-write` operations), not a page.
///
/// Per crash: right after a kill (once OpenFGA has answered every Write it received), the
/// operations OpenFGA accepted beyond those of the rows marked delivered are the ones that will
/// be sent again, minus those already counted for earlier crashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_of_a_5000_row_drain_loses_nothing() {
    let env = Env::start().await;
    let expected = fill(&env, 5000).await;
    let outbox_ops = 5000 + 500;
    // Slow OpenFGA down a little so that the drain lasts long enough to be killed in the middle.
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(50)),
        1_000_000,
    ));
    let (window, per_write) = (4, 20);
    let rounds = 5;
    let mut counted = 0;
    for round in 0..rounds {
        let before = env.fga.write_count();
        let mut relay = env.spawn_relay(&[
            ("FGA_RELAY_BATCH_SIZE", "200"),
            ("FGA_RELAY_MAX_IN_FLIGHT", "4"),
            ("FGA_MAX_TUPLES_PER_WRITE", "20"),
        ]);
        wait_until(PROMPTLY, "the relay delivers", || async {
            env.fga.write_count() > before
        })
        .await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..400))).await;
        relay.kill9();
        wait_until(PROMPTLY, "OpenFGA answers what it received", || async {
            env.fga.writes().iter().all(|w| w.answered_at.is_some())
        })
        .await;
        let excess = accepted_operations(&env.fga) - marked_operations(&env).await;
        let this_crash = excess - counted;
        counted = excess;
        println!(
            "round {round}: killed with {} rows pending; {this_crash} operations to be sent again",
            env.pending().await
        );
        // A crash redelivers at most the Writes in flight: rows are marked as each is answered.
        assert!(
            this_crash <= (window * per_write) as i64,
            "crash {round} leaves {this_crash} operations to send again"
        );
    }
    env.fga.clear_faults();
    let _relay = env.start_relay().await;
    wait_until(
        Duration::from_secs(60),
        "every row is delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    assert_nothing_left(&env).await;
    assert_final_state(&env.fga, &expected);
    let dups = duplicate_operations(&env.fga, outbox_ops);
    println!("{rounds} crashes caused {dups} duplicate tuple operations");
    assert!(
        dups as i64 <= counted,
        "{dups} duplicates, more than the {counted} the crashes left"
    );
}

/// Tuple operations in the Writes OpenFGA accepted.
fn accepted_operations(fga: &Fga) -> i64 {
    accepted_writes(fga)
        .iter()
        .map(|w| {
            ["writes", "deletes"]
                .iter()
                .map(|p| w.body[p]["tuple_keys"].as_array().map_or(0, Vec::len) as i64)
                .sum::<i64>()
        })
        .sum()
}

/// Tuple operations of the rows marked delivered.
async fn marked_operations(env: &Env) -> i64 {
    env.db
        .connect()
        .await
        .query_one(
            "SELECT coalesce(sum(jsonb_array_length(coalesce(payload->'writes', '[]'))
                               + jsonb_array_length(coalesce(payload->'deletes', '[]'))), 0)::bigint
             FROM fga_outbox WHERE processed_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// PostgreSQL restarted in the middle of a drain: the relay reconnects and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_drain_loses_nothing() {
    let env = Env::start().await;
    let expected = fill(&env, 5000).await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(10)),
        1_000_000,
    ));
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "the relay delivers", || async {
        env.fga.write_count() > 5
    })
    .await;
    env.db.restart();
    // Rows inserted after the restart, while the relay reconnects, are delivered too.
    let late = env
        .insert(writes(&[tk("user:late", "viewer", "document:late")]))
        .await;
    relay.wait_for_log("LISTEN connection reconnected").await;
    env.fga.clear_faults();
    wait_until(
        Duration::from_secs(60),
        "every row is delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    assert!(env.row(late).await.delivered);
    assert_nothing_left(&env).await;
    assert_final_state(&env.fga, &{
        let mut e = expected;
        e.insert("user:late|document:late".into(), true);
        e
    });
}

/// OpenFGA refusing connections for a while dead-letters nothing, records the failed attempts,
/// and delivery resumes within a couple of seconds of OpenFGA coming back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openfga_refusing_connections_for_a_while_then_back() {
    let env = Env::start().await;
    // Two attempts: a relay that counted every failure of a row alone during the outage would
    // dead-letter the first row long before OpenFGA is back.
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    env.fga.set_refusing(true);
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(
            env.insert(writes(&[tk(&format!("user:u{i}"), "viewer", "document:1")]))
                .await,
        );
    }
    relay.wait_for_log_count("write failed", 5).await;
    let row = env.row(ids[0]).await;
    assert!(!row.delivered && !row.dead && row.attempts >= 1, "{row:?}");
    assert!(
        row.last_error.unwrap_or_default().contains("connect"),
        "the reason is recorded"
    );
    // Long enough for the backoff to reach its cap, and for ten failed attempts of a row sent
    // alone (five times --max-attempts).
    wait_until(
        Duration::from_secs(60),
        "ten failed attempts of the first row",
        || async { env.row(ids[0]).await.attempts >= 10 },
    )
    .await;
    assert_eq!(env.dead().await, 0, "an outage dead-lettered rows");
    env.fga.set_refusing(false);
    let back = Instant::now();
    env.wait_drained().await;
    println!(
        "delivered everything {:?} after OpenFGA came back",
        back.elapsed()
    );
    assert_eq!(env.dead().await, 0);
    assert_eq!(env.fga.tuples().len(), 30);
}

/// 429 with Retry-After: the relay waits at least that long before the next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limiting_with_retry_after_is_honoured() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::once(Fault::rate_limited(2)));
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let _relay = env.start_relay().await;
    env.wait_delivered(id).await;
    let w = env.fga.writes();
    assert_eq!(w[0].status, 429);
    assert_eq!(w[1].status, 200);
    let gap = w[1].received_at - w[0].received_at;
    assert!(
        gap >= Duration::from_secs(2),
        "retried after {gap:?}, before Retry-After's 2 s"
    );
    let row = env.row(id).await;
    assert_eq!(row.attempts, 1);
    assert!(row.last_error.unwrap_or_default().contains("429"));
}

/// OpenFGA accepting the connection and never answering: the request times out, counts as a
/// transient failure, and the row is delivered on a later attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openfga_hanging_times_out_and_is_retried() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(Fault::Hang, 3));
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    // More timeouts than --max-attempts: they are an outage, not the row's fault.
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(Duration::from_secs(30), "the row is delivered", || async {
        env.row(id).await.delivered
    })
    .await;
    assert!(relay.logs().contains("timed out"), "{}", relay.logs());
    assert_eq!(env.row(id).await.attempts, 3);
}

/// Garbage from something in front of OpenFGA (a proxy's HTML page) is a loud error, retried,
/// and dead-letters nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answers_dead_letter_nothing() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Garbage {
            status: 200,
            content_type: "text/html".into(),
            body: "<html>captive portal</html>".into(),
        },
        2,
    ));
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let relay = env.start_relay().await;
    wait_until(Duration::from_secs(30), "the row is delivered", || async {
        env.row(id).await.delivered
    })
    .await;
    assert!(
        relay.logs().contains("unexpected answer from OpenFGA"),
        "{}",
        relay.logs()
    );
    assert_eq!(env.dead().await, 0);
}

/// A row that keeps failing (5xx whenever it is sent) while the rows around it succeed is held
/// back, the others flow past it, and it is dead-lettered after --max-attempts. A later row on
/// one of its tuples waits behind it: it is delivered only once the bad row is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_failing_transiently_alone_is_isolated_then_dead_lettered() {
    let env = Env::start().await;
    env.fga
        .push_fault(FaultRule::times(Fault::internal(), 1_000_000).when_tuple(
            "user:poison",
            "viewer",
            "document:p",
        ));
    let client = env.db.connect().await;
    let mut before = Vec::new();
    for i in 0..20 {
        before.push(
            insert_with(
                &client,
                writes(&[tk(&format!("user:a{i}"), "viewer", "document:1")]),
            )
            .await,
        );
    }
    let bad = insert_with(
        &client,
        writes(&[
            tk("user:poison", "viewer", "document:p"),
            tk("user:shared", "viewer", "document:s"),
        ]),
    )
    .await;
    let behind = insert_with(
        &client,
        deletes(&[tk("user:shared", "viewer", "document:s")]),
    )
    .await;
    let mut after = Vec::new();
    for i in 0..20 {
        after.push(
            insert_with(
                &client,
                writes(&[tk(&format!("user:b{i}"), "viewer", "document:1")]),
            )
            .await,
        );
    }
    let _relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "3")]);
    wait_until(
        PROMPTLY,
        "the rows around the bad one are delivered",
        || async {
            let mut all = true;
            for id in before.iter().chain(&after) {
                all &= env.row(*id).await.delivered;
            }
            all
        },
    )
    .await;
    assert!(
        !env.row(behind).await.delivered,
        "the row behind the bad one must wait"
    );
    // Strikes count only while other rows are delivered (alone, a failure looks like an
    // outage): keep traffic flowing, as a live system has.
    let mut n = 0;
    wait_until(Duration::from_secs(30), "the bad row is dead", || {
        n += 1;
        let (client, env, n) = (&client, &env, n);
        async move {
            let t = tk(&format!("user:c{n}"), "viewer", "document:1");
            insert_with(client, writes(&[t])).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            env.row(bad).await.dead
        }
    })
    .await;
    let row = env.row(bad).await;
    assert!(
        row.last_error
            .clone()
            .unwrap_or_default()
            .contains("gave up after 3"),
        "{row:?}"
    );
    wait_until(
        PROMPTLY,
        "the row behind it goes once it is dead",
        || async { env.row(behind).await.delivered },
    )
    .await;
    // The tuple the bad row would have written is absent: its write never happened, and the
    // delete behind it did.
    assert!(!env.fga.has("user:shared", "viewer", "document:s"));
    assert!(!env.fga.has("user:poison", "viewer", "document:p"));
}

/// One tuple OpenFGA rejects among 100 rows: its row alone is dead, with OpenFGA's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_tuple_among_100_rows_dead_letters_only_its_row() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let mut ids = Vec::new();
    for i in 0..100 {
        let t = if i == 57 {
            tk("organization:acme", "viewer", "document:57") // not an allowed type for document#viewer
        } else {
            tk(&format!("user:u{i}"), "viewer", &format!("document:{i}"))
        };
        ids.push(insert_with(&client, writes(&[t])).await);
    }
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    let bad = env.row(ids[57]).await;
    assert!(bad.dead);
    assert!(
        bad.last_error
            .unwrap_or_default()
            .contains("is not an allowed type restriction")
    );
    assert_eq!(env.dead().await, 1);
    assert_eq!(env.fga.tuples().len(), 99);
}

/// The ordering test: a few tuples written, deleted, written, deleted… in successive rows, while
/// rows keep arriving, OpenFGA fails now and then (5xx, 409 races, slow answers), two relays run,
/// one of them is killed, and a `drain` runs too. OpenFGA must end in the last operation's state
/// for every tuple; for each tuple, OpenFGA applies no operation before every earlier one (in id
/// order) was applied at least once (a redelivery may repeat earlier ones); and no two Writes
/// in flight at once touch the same tuple (several Writes fly together, and two deliverers
/// never overlap on a tuple).
///
/// Each row also writes a marker tuple of its own, which travels in the same Write as the row's
/// operation and tells which row each accepted operation came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_revokes_keep_their_order_through_faults_two_relays_and_a_drain() {
    let env = Env::start().await;
    let tuples = 8;
    let rows = 600;
    let mut last: HashMap<usize, bool> = HashMap::new();
    let mut plan = Vec::new();
    for j in 0..rows {
        let k = (j * 7 + j / 13) % tuples;
        let write = !last.get(&k).copied().unwrap_or(false);
        last.insert(k, write);
        plan.push((k, write));
    }
    let faults = |n: usize| {
        for i in 0..n {
            let f = match i % 3 {
                0 => Fault::internal(),
                1 => Fault::aborted(),
                _ => Fault::Delay(Duration::from_millis(30)),
            };
            env.fga.push_fault(FaultRule::once(f));
        }
    };
    let client = env.db.connect().await;
    let mut a = env.spawn_relay(&[]);
    a.wait_for_log("delivering (leader)").await;
    let b = env.spawn_relay(&[]);
    b.wait_for_log("standing by").await;
    let mut drain = None;
    for (j, (k, write)) in plan.iter().enumerate() {
        let t = tk(&format!("user:t{k}"), "viewer", "document:mix");
        let marker = tk(&format!("user:m{j}"), "viewer", "document:marker");
        let p = if *write {
            writes(&[t, marker])
        } else {
            serde_json::json!({"writes": [marker], "deletes": [t]})
        };
        insert_with(&client, p).await;
        if j % 50 == 0 {
            faults(4);
        }
        if j == 200 {
            drain = Some(
                env.command(&["drain", "--timeout", "60s"])
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
        if j == 300 {
            a.kill9();
        }
        if j % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let out = drain.unwrap().wait_with_output().unwrap();
    assert_success(&out, "drain during the storm");
    // The standby took over from the killed leader (or the drain did, and handed back).
    b.wait_for_log("delivering (leader)").await;
    wait_until(
        Duration::from_secs(60),
        "every row is delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    env.fga.clear_faults();
    assert_applied_in_id_order(&env.fga, &plan);
    assert_no_tuple_in_two_writes_in_flight(&env.fga);
    assert_nothing_left(&env).await;
    for k in 0..tuples {
        let present = env.fga.has(&format!("user:t{k}"), "viewer", "document:mix");
        assert_eq!(
            present, last[&k],
            "tuple {k}: OpenFGA does not hold the last operation's state"
        );
    }
    let failed = env.fga.writes().iter().filter(|w| w.status != 200).count();
    assert!(failed > 10, "faults were injected ({failed} failed writes)");
}

/// For each tuple, the index (among the rows on that tuple, in id order) of every operation
/// OpenFGA accepted, in the order it accepted them, never runs ahead of the ones before it:
/// each is at most one past the highest applied so far.
pub(crate) fn assert_applied_in_id_order(fga: &Fga, plan: &[(usize, bool)]) {
    let mut index_on_tuple = Vec::with_capacity(plan.len());
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for (k, _) in plan {
        let c = counts.entry(*k).or_default();
        index_on_tuple.push(*c);
        *c += 1;
    }
    let mut highest: HashMap<usize, usize> = HashMap::new();
    for w in accepted_writes(fga) {
        let markers = w.body["writes"]["tuple_keys"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for m in markers {
            let Some(j) = m["user"].as_str().and_then(|u| u.strip_prefix("user:m")) else {
                continue;
            };
            let j: usize = j.parse().unwrap();
            let (k, i) = (plan[j].0, index_on_tuple[j]);
            let h = highest.get(&k).copied();
            let next = h.map_or(0, |h| h + 1);
            assert!(
                i <= next,
                "tuple {k}: operation {i} (row {j}) applied before operation {next}"
            );
            highest.insert(k, h.map_or(i, |h| h.max(i)));
        }
    }
    for (k, n) in counts {
        assert_eq!(
            highest.get(&k).map(|h| h + 1),
            Some(n),
            "tuple {k}: operations missing"
        );
    }
}

/// The LISTEN connection hangs silently (its backend stopped: no error, no answer, as after a
/// network cut). The heartbeat notices within two intervals; once PostgreSQL lets the dead
/// session go, the relay leads again and delivers what was inserted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_hung_listen_connection_is_noticed_by_the_heartbeat() {
    let env = Env::start().await;
    let relay = env.start_relay().await;
    let admin = env.db.connect().await;
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'fga-relay run listener'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // SAFETY: signals to a PostgreSQL backend process of our own test cluster.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    relay.wait_for_log("heartbeat got no answer").await;
    let id = env
        .insert(writes(&[tk("user:during", "viewer", "document:1")]))
        .await;
    // The stopped backend still holds the leadership lock, as a half-dead session does until
    // PostgreSQL's keepalives end it; the relay stands by meanwhile.
    relay.wait_for_log("standing by").await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait_until(
        PROMPTLY,
        "the row inserted during the hang is delivered",
        || async { env.row(id).await.delivered },
    )
    .await;
}

/// PostgreSQL turned read-only (as a demoted primary is): the relay drops its connections and
/// reconnects only to a writable server; rows inserted meanwhile are delivered once it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_left_for_a_writable_one() {
    let env = Env::start().await;
    let relay = env.start_relay().await;
    let admin = env.db.connect().await;
    for sql in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'fga-relay%'",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    relay
        .wait_for_log("cannot open the LISTEN connection")
        .await;
    let admin = env.db.connect().await;
    admin
        .batch_execute(&format!(
            "BEGIN READ WRITE; INSERT INTO fga_outbox (payload) VALUES ('{}'); COMMIT;",
            writes(&[tk("user:ro", "viewer", "document:1")])
        ))
        .await
        .unwrap();
    for sql in [
        "SET default_transaction_read_only = off",
        "ALTER SYSTEM RESET default_transaction_read_only",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    wait_until(
        PROMPTLY,
        "delivered once the server is writable",
        || async { env.pending().await == 0 },
    )
    .await;
    assert!(env.fga.has("user:ro", "viewer", "document:1"));
}

/// With two servers in DATABASE_URL, the first read-only, the relay works on the writable one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_several_hosts_the_relay_picks_the_writable_one() {
    // Two clusters of the test's own, whatever TEST_DATABASE_URL says: the relay's URL names
    // both servers by their socket directories.
    let standby = TestDb::start_with(PgOptions::default());
    let c = standby.connect().await;
    c.batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let env = Env::with(TestDb::start_with(PgOptions::default()), Fga::start()).await;
    let (Some(a), Some(b)) = (standby.socket_dir(), env.db.socket_dir()) else {
        unreachable!("a cluster of the test's own has a socket directory");
    };
    let url = format!(
        "host={},{} port=5432,5432 user=postgres dbname=postgres",
        a.display(),
        b.display()
    );
    let relay = env.spawn_relay(&[("DATABASE_URL", &url)]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:rw", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
}

/// A flaky, rate-limited OpenFGA (60% of Writes answered 500, 20% answered 429, for the whole
/// run) with thousands of rows and live traffic: failures that hit every row are not the rows'
/// fault, even sent alone, so nothing is dead-lettered, even with `--max-attempts 2`; every row
/// is delivered once the faults stop. `FLAKY_ROWS` and `FLAKY_SECONDS` size a longer run
/// (docs/guarantees.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_rate_limited_openfga_dead_letters_no_valid_row() {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (rows, seconds) = (var("FLAKY_ROWS", 2000), var("FLAKY_SECONDS", 20));
    let env = Env::start().await;
    env.fga
        .set_random_faults(Some(crate::common::fga::RandomFaults {
            internal: 0.6,
            rate_limited: 0.2,
            retry_after: None,
        }));
    let client = env.db.connect().await;
    client
        .execute(
            "INSERT INTO fga_outbox (payload)
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object(
                 'user', 'user:f' || i, 'relation', 'viewer', 'object', 'document:' || (i % 50))))
             FROM generate_series(1, $1::bigint) i",
            &[&(rows as i64)],
        )
        .await
        .unwrap();
    // Small Writes, so that many rows end up sent alone, where a strike can be counted.
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_ATTEMPTS", "2"),
        ("FGA_MAX_TUPLES_PER_WRITE", "2"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    // Live traffic for the whole faulty run: a row every 50 ms.
    let started = Instant::now();
    let mut live = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let t = tk(&format!("user:live{live}"), "viewer", "document:live");
        insert_with(&client, writes(&[t])).await;
        live += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if live.is_multiple_of(100) {
            assert_eq!(env.dead().await, 0, "a valid row was dead-lettered");
        }
    }
    let during = env.fga.writes();
    env.fga.set_random_faults(None);
    let stopped = Instant::now();
    wait_until(
        Duration::from_secs(120),
        "every row is delivered once the faults stop",
        || async { env.pending().await == 0 },
    )
    .await;
    let failed = during.iter().filter(|w| w.status >= 429).count();
    println!(
        "{rows} rows + {live} live over {seconds} s of faults: {} Writes, {failed} failed, \
         {} 429; all delivered {:?} after the faults stopped",
        during.len(),
        during.iter().filter(|w| w.status == 429).count(),
        stopped.elapsed()
    );
    assert_eq!(env.dead().await, 0, "a valid row was dead-lettered");
    assert!(
        failed * 2 > during.len(),
        "faults were injected ({failed} of {} Writes failed)",
        during.len()
    );
    assert_eq!(env.fga.tuples().len() as u64, rows + live);
}

/// A proxy in front of OpenFGA with a body limit answers 413 with its HTML page: the Write is
/// halved until it passes, and a row whose own Write is too large is dead-lettered with the
/// reason; every other row is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_413_halves_the_write_and_dead_letters_a_row_too_large_alone() {
    let env = Env::start().await;
    let limit = 3000;
    env.fga.set_body_limit(Some(limit));
    let client = env.db.connect().await;
    let mut ids = Vec::new();
    for i in 0..60 {
        let t = tk(&format!("user:s{i}"), "viewer", &format!("document:{i}"));
        ids.push(insert_with(&client, writes(&[t])).await);
    }
    let big: Vec<_> = (0..60)
        .map(|i| tk(&format!("user:big{i}"), "viewer", "document:big"))
        .collect();
    let big = insert_with(&client, writes(&big)).await;
    for i in 60..80 {
        let t = tk(&format!("user:s{i}"), "viewer", &format!("document:{i}"));
        ids.push(insert_with(&client, writes(&[t])).await);
    }
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    for id in &ids {
        assert!(env.row(*id).await.delivered, "row {id}");
    }
    let row = env.row(big).await;
    assert!(row.dead, "{row:?}");
    assert!(
        row.last_error.clone().unwrap_or_default().contains("413"),
        "{row:?}"
    );
    let writes = env.fga.writes();
    assert!(writes.iter().any(|w| w.status == 413), "the limit was hit");
    assert!(
        accepted_writes(&env.fga)
            .iter()
            .any(|w| w.body["writes"]["tuple_keys"]
                .as_array()
                .map_or(0, Vec::len)
                > 1),
        "halved Writes still carry several rows"
    );
}

/// What stands in front of OpenFGA answers with HTML pages: 502, 503 and 504 and a 408 are
/// transient (retried at once, as an outage is); nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_error_pages_and_408_are_transient() {
    let env = Env::start().await;
    for (status, title) in [
        (502, "Bad Gateway"),
        (503, "Service Temporarily Unavailable"),
        (504, "Gateway Time-out"),
        (408, "Request Time-out"),
    ] {
        env.fga
            .push_fault(FaultRule::once(Fault::html(status, title)));
    }
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    env.wait_delivered(id).await;
    let row = env.row(id).await;
    assert_eq!(row.attempts, 4, "{row:?}");
    let logs = relay.logs();
    assert_eq!(
        logs.matches("class=\"transient\"").count(),
        4,
        "each page is a transient failure:\n{logs}"
    );
    assert!(!logs.contains("class=\"configuration\""), "{logs}");
    assert_eq!(env.dead().await, 0);
}

/// A redirect is not followed (that would send the body and the token where the operator never
/// said): a configuration error that names the `Location`, retried, dead-lettering nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_followed_and_names_its_location() {
    let env = Env::start().await;
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    elsewhere.set_nonblocking(true).unwrap();
    let location = format!(
        "http://{}/stores/{}/write",
        elsewhere.local_addr().unwrap(),
        env.fga.store_id()
    );
    env.fga.push_fault(FaultRule::once(Fault::Redirect {
        status: 307,
        location: location.clone(),
    }));
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let relay = env.start_relay().await;
    env.wait_delivered(id).await;
    assert!(
        matches!(elsewhere.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the redirect was followed"
    );
    let logs = relay.logs();
    assert!(logs.contains(&location), "the Location is named:\n{logs}");
    assert!(logs.contains("class=\"configuration\""), "{logs}");
    assert_eq!(env.dead().await, 0);
}

/// Keeps traffic flowing beside a row under test: a one-tuple row every 100 ms until `done`.
async fn traffic_until<F, Fut>(env: &Env, what: &str, deadline: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let client = env.db.connect().await;
    let mut n = 0;
    wait_until(deadline, what, || {
        n += 1;
        let (client, n) = (&client, n);
        let check = done();
        async move {
            let t = tk(&format!("user:c{n}"), "viewer", "document:traffic");
            insert_with(client, writes(&[t])).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            check.await
        }
    })
    .await;
}

/// A rate limiter answering 429 whenever one row is sent, while the traffic beside it flows,
/// is still not that row's fault: it is never dead-lettered, and is delivered once the limiter
/// lets it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_throttled_while_others_flow_is_never_dead_lettered() {
    let env = Env::start().await;
    env.fga
        .push_fault(FaultRule::times(Fault::rate_limited(0), 12).when_tuple(
            "user:busy",
            "viewer",
            "document:b",
        ));
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:busy", "viewer", "document:b")]))
        .await;
    traffic_until(
        &env,
        "the throttled row is delivered",
        Duration::from_secs(60),
        || async {
            let row = env.row(id).await;
            assert!(!row.dead, "a throttled row was dead-lettered: {row:?}");
            row.delivered
        },
    )
    .await;
    assert!(env.row(id).await.attempts >= 12);
    assert_eq!(env.dead().await, 0);
}

/// `Retry-After` applies on every path: a row that alone keeps failing with 503 and
/// `Retry-After: 2` while others flow (the strike path) makes the whole relay wait before its
/// next Write, as an outage's does; the row is still dead-lettered in the end. One Write at a
/// time: a Write sent beside the failing one, before its answer came back, can reach OpenFGA
/// just after that answer (on a connection of its own) and would look like one sent too soon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_waited_out_on_the_strike_path_too() {
    let env = Env::start().await;
    env.fga.push_fault(
        FaultRule::times(
            Fault::Status {
                status: 503,
                code: "unavailable".into(),
                message: "try later".into(),
                retry_after: Some("2".into()),
            },
            1_000_000,
        )
        .when_tuple("user:slow", "viewer", "document:s"),
    );
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_ATTEMPTS", "2"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "1"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:slow", "viewer", "document:s")]))
        .await;
    traffic_until(
        &env,
        "the failing row is dead",
        Duration::from_secs(90),
        || async { env.row(id).await.dead },
    )
    .await;
    let all = env.fga.writes();
    let mut waited = 0;
    for (i, w) in all.iter().enumerate() {
        if w.status == 503 {
            let answered = w.answered_at.expect("answered");
            // The first Write that reached OpenFGA after that answer.
            if let Some(next) = all[i + 1..].iter().find(|n| n.received_at >= answered) {
                let gap = next.received_at.saturating_duration_since(answered);
                assert!(
                    gap >= Duration::from_secs(2),
                    "a Write {gap:?} after a 503 with Retry-After: 2"
                );
            }
            waited += 1;
        }
    }
    assert!(waited >= 2, "the row failed {waited} times");
    assert!(
        relay.logs().contains("holding it back"),
        "a strike was counted"
    );
}

/// The window of Writes in flight adapts as TCP's does: 5xx answers halve it, so a struggling
/// OpenFGA is not sent eight Writes at once again, and it grows back to `--max-in-flight` while
/// Writes succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_of_writes_in_flight_halves_on_5xx_and_grows_back() {
    let env = Env::start().await;
    slow_backlog(&env, "w", 3000, Duration::from_millis(30), 3).await;
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "8"),
        ("FGA_MAX_TUPLES_PER_WRITE", "10"),
    ]);
    let base = relay.endpoint().await;
    let window = || async { scrape(&base).await["fga_relay_write_window"] };
    wait_until(PROMPTLY, "the window narrows after 5xx answers", || async {
        window().await < 8.0
    })
    .await;
    wait_until(
        PROMPTLY,
        "the window grows back while Writes succeed",
        || async { window().await == 8.0 },
    )
    .await;
    env.wait_drained().await;
    assert_eq!(env.dead().await, 0);
}

/// A 503 or 429 whose `Retry-After` says "now" (`0`, or an HTTP date already past, as a server whose
/// clock is behind the relay's sends) must not make the relay retry with no backoff at all: the
/// OpenFGA SDKs ignore such a value and back off as usual. Over a 3 s outage the relay's own
/// backoff (0.1 s doubling to 2 s) sends a handful of Writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_of_now_does_not_turn_an_outage_into_a_busy_loop() {
    let mut busy = Vec::new();
    // The first case is the relay's own backoff, for comparison.
    for (status, retry_after) in [
        (503, None),
        (503, Some("0")),
        (503, Some("Thu, 01 Jan 2015 00:00:00 GMT")),
        (429, Some("0")),
        (429, Some("Thu, 01 Jan 2015 00:00:00 GMT")),
    ] {
        let env = Env::start().await;
        env.fga.push_fault(FaultRule::times(
            Fault::Status {
                status,
                code: "unavailable".into(),
                message: "upstream connect error".into(),
                retry_after: retry_after.map(str::to_owned),
            },
            1_000_000,
        ));
        // A backlog on 200 tuples, as an outage leaves behind.
        let client = env.db.connect().await;
        for i in 0..200 {
            insert_with(
                &client,
                writes(&[tk(&format!("user:u{i}"), "viewer", "document:1")]),
            )
            .await;
        }
        let relay = env.start_relay().await;
        wait_until(Duration::from_secs(10), "the first Write fails", || async {
            env.fga.write_count() > 0
        })
        .await;
        // The outage's length, not a synchronisation: how many Writes it drew is the point.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = env.fga.write_count();
        env.fga.clear_faults();
        env.wait_drained().await;
        assert_eq!(env.dead().await, 0);
        let failures = relay.logs().matches("write failed").count();
        eprintln!("{status} Retry-After {retry_after:?}: {during} Writes in a 3 s outage");
        if during > 30 {
            busy.push(format!(
                "{status} with Retry-After {retry_after:?}: {during} Writes in a 3 s outage \
                 ({failures} `write failed` lines)"
            ));
        }
    }
    assert!(
        busy.is_empty(),
        "the relay retried without backing off: {busy:#?}"
    );
}

/// A Write of two rows, one of which OpenFGA rejects, must dead-letter that row only. When a
/// valid row's user is a prefix of the rejected tuple's user up to an apostrophe (`user:o` and
/// `user:o'x`, both ids OpenFGA takes), the rejection is pinned on the valid row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_is_pinned_on_the_row_it_names_not_on_a_row_whose_tuple_is_a_prefix() {
    let env = Env::start().await;
    let valid = env
        .insert(writes(&[tk("user:o", "viewer", "document:1")]))
        .await;
    // An undefined condition: OpenFGA answers `Invalid tuple 'document:1#viewer@user:o'x
    // (condition nope)'. Reason: undefined condition`.
    let rejected = env
        .insert(
            serde_json::json!({"writes": [{"user": "user:o'x", "relation": "viewer",
                                   "object": "document:1", "condition": {"name": "nope"}}]}),
        )
        .await;
    let relay = env.start_relay().await;
    wait_until(
        Duration::from_secs(30),
        "both rows are delivered or dead",
        || async {
            let (a, b) = (env.row(valid).await, env.row(rejected).await);
            (a.delivered || a.dead) && (b.delivered || b.dead)
        },
    )
    .await;
    let (a, b) = (env.row(valid).await, env.row(rejected).await);
    assert!(
        a.delivered && env.fga.has("user:o", "viewer", "document:1"),
        "the valid row was dead-lettered with {:?}\n{}",
        a.last_error,
        relay.logs()
    );
    assert!(b.dead, "the rejected row: {b:?}");
}

/// An answer no hop should send, however long (a misbehaving proxy's endless page), is read no
/// further than 1 MiB: the relay's memory stays small, and the rows wait as for any 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_not_read_into_memory() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Garbage {
            status: 502,
            content_type: "text/html".into(),
            body: "x".repeat(128 << 20),
        },
        2,
    ));
    let relay = env.start_relay().await;
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

/// A proxy in front of OpenFGA that refuses one row's content (a web application firewall
/// taking `'); DROP TABLE` in a user id for an attack, with its HTML 403 or a JSON 400 of its
/// own) must not stop the rows on other tuples: every other row is delivered, whatever becomes
/// of that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_refusing_one_rows_content_does_not_stop_the_other_rows() {
    let poison = "user:robert');DROP_TABLE_students;--";
    let mut stalled = Vec::new();
    for refusal in [
        Fault::html(403, "Forbidden"),
        Fault::Garbage {
            status: 400,
            content_type: "application/json".into(),
            body: r#"{"error":"request blocked","rule":"942100"}"#.into(),
        },
    ] {
        let env = Env::start().await;
        env.fga
            .push_fault(FaultRule::times(refusal.clone(), 1_000_000).when_tuple(
                poison,
                "viewer",
                "document:1",
            ));
        let client = env.db.connect().await;
        insert_with(&client, writes(&[tk(poison, "viewer", "document:1")])).await;
        let mut others = Vec::new();
        for i in 0..20 {
            let row = writes(&[tk(&format!("user:u{i}"), "viewer", "document:2")]);
            others.push(insert_with(&client, row).await);
        }
        let relay = env.start_relay().await;
        let delivered = env
            .all_delivered_within(&others, Duration::from_secs(30))
            .await;
        let refused = env.fga.writes().iter().filter(|w| w.status != 200).count();
        if !delivered {
            stalled.push(format!(
                "{refusal:?}: the rows on other tuples still pending after 30 s ({refused} \
                 Writes refused, {} accepted; last log line: {:?})",
                accepted_writes(&env.fga).len(),
                relay.logs().lines().last().unwrap_or("")
            ));
        }
    }
    assert!(stalled.is_empty(), "{stalled:#?}");
}

/// A row that a proxy keeps refusing alone (its HTML 403) while the traffic beside it flows is
/// that row's failure, as a transient one alone is: held back, then dead-lettered after
/// --max-attempts with the proxy's answer as its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_a_proxy_refuses_alone_while_others_flow_is_dead_lettered_with_the_answer() {
    let env = Env::start().await;
    let poison = "user:robert');DROP_TABLE_students;--";
    env.fga.push_fault(
        FaultRule::times(Fault::html(403, "Forbidden"), 1_000_000).when_tuple(
            poison,
            "viewer",
            "document:1",
        ),
    );
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "2")]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk(poison, "viewer", "document:1")]))
        .await;
    traffic_until(
        &env,
        "the refused row is dead",
        Duration::from_secs(60),
        || async { env.row(id).await.dead },
    )
    .await;
    let reason = env.row(id).await.last_error.unwrap_or_default();
    assert!(
        reason.contains("gave up after 2") && reason.contains("403"),
        "{reason}\n{}",
        relay.logs()
    );
    assert!(!env.fga.has(poison, "viewer", "document:1"));
}

/// A row larger than the tuple limit is already sent in parts, not as one transaction. When a
/// part of 100 tuples is over OpenFGA's message size (gRPC's 616,448 bytes: here 100 tuples
/// with a 7 kB condition context each, every context well under OpenFGA's 32 KiB), a smaller
/// part would pass; the row must not be dead-lettered for the size of a part the relay chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_sent_in_parts_is_not_dead_lettered_because_a_part_is_too_large() {
    let model = Model::default()
        .with_relation("document", "viewer", &["user with big"])
        .with_condition("big", &["note"]);
    let env = Env::with_fga(Fga::builder().model(model).start()).await;
    let note = "n".repeat(7_000);
    let tuples: Vec<_> = (0..150)
        .map(|i| {
            json!({"user": format!("user:u{i}"), "relation": "viewer", "object": "document:1",
                   "condition": {"name": "big", "context": {"note": note}}})
        })
        .collect();
    let id = env.insert(writes(&tuples)).await;
    let relay = env.start_relay().await;
    wait_until(
        Duration::from_secs(30),
        "the row is delivered or dead",
        || async {
            let r = env.row(id).await;
            r.delivered || r.dead
        },
    )
    .await;
    let row = env.row(id).await;
    let applied: Vec<String> = accepted_writes(&env.fga)
        .iter()
        .flat_map(|w| write_tuple_keys(&w.body))
        .collect();
    assert!(
        row.delivered,
        "a valid row of 150 tuples was dead-lettered ({} of its tuples applied): {:?}\n{}",
        applied.len(),
        row.last_error,
        relay.logs()
    );
    // Its parts were applied one after another, in the row's order, each tuple once.
    let expected: Vec<String> = (0..150)
        .map(|i| format!("document:1#viewer@user:u{i}"))
        .collect();
    assert_eq!(applied, expected);
}
