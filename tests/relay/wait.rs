//! Read your own writes: `fga_outbox_wait(ids, timeout)` (sql/schema/0005_wait.sql) returns once
//! the rows are in OpenFGA, reports a dead row, returns at its timeout, and refuses to run where
//! it could never see the relay's work.

use crate::common::fga::{Fault, FaultRule};
use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, insert_with, tk, wait_for, wait_until, writes};
use std::time::{Duration, Instant};

/// The SQLSTATE of a database error.
fn sqlstate(e: &tokio_postgres::Error) -> Option<String> {
    e.as_db_error().map(|d| d.code().code().to_owned())
}

fn a_tuple(n: usize) -> serde_json::Value {
    writes(&[tk(
        &format!("user:u{n}"),
        "viewer",
        &format!("document:{n}"),
    )])
}

/// The Writes take a while (the proxy holds each for 300 ms), so the rows are in flight when
/// the wait starts: it returns `delivered` only once OpenFGA has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_delivered_once_the_rows_are_in_openfga() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(300)),
        10,
    ));
    let _relay = env.start_relay().await;
    let client = env.db.connect().await;
    let ids = [
        insert_with(&client, a_tuple(1)).await,
        insert_with(&client, a_tuple(2)).await,
    ];
    let answer = wait_for(&client, &ids, "10s").await.unwrap();
    assert_eq!(answer, "delivered");
    assert!(env.fga.has("user:u1", "viewer", "document:1"));
    assert!(env.fga.has("user:u2", "viewer", "document:2"));
    for id in ids {
        assert!(env.row(id).await.delivered);
    }
    // Delivered already: at once, whatever the timeout. An empty list has nothing to wait for.
    assert_eq!(wait_for(&client, &ids, "0s").await.unwrap(), "delivered");
    assert_eq!(wait_for(&client, &[], "0s").await.unwrap(), "delivered");
}

/// A row OpenFGA rejects for good is reported with the relay's last_error, as soon as it is
/// dead, even while another listed row is still pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_a_dead_row_with_its_last_error() {
    let env = Env::start().await;
    let _relay = env.start_relay().await;
    let client = env.db.connect().await;
    // organization is not an allowed type for document#viewer in the tests' model.
    let bad = insert_with(
        &client,
        writes(&[tk("organization:acme", "viewer", "document:1")]),
    )
    .await;
    let good = insert_with(&client, a_tuple(2)).await;
    let answer = wait_for(&client, &[good, bad], "10s").await.unwrap();
    let last_error = env.row(bad).await.last_error.unwrap_or_default();
    assert!(
        last_error.contains("is not an allowed type restriction"),
        "{last_error}"
    );
    assert_eq!(answer, format!("dead: row {bad}: {last_error}"));
}

/// With no relay running, the wait returns `pending` at its timeout; the row is still pending,
/// and is delivered once a relay runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_pending_at_its_timeout_when_the_relay_is_down() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let id = insert_with(&client, a_tuple(1)).await;
    let started = Instant::now();
    let answer = wait_for(&client, &[id], "500ms").await.unwrap();
    let took = started.elapsed();
    assert_eq!(answer, "pending");
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(took < PROMPTLY, "{took:?}");
    let row = env.row(id).await;
    assert!(!row.delivered && !row.dead, "{row:?}");

    let _relay = env.start_relay().await;
    assert_eq!(wait_for(&client, &[id], "10s").await.unwrap(), "delivered");
    assert!(env.fga.has("user:u1", "viewer", "document:1"));
}

/// OpenFGA never answers: the relay holds the row (claimed, its Write in flight) far longer than
/// the wait's timeout. The wait, queued behind the relay's transaction, still returns at its
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_pending_at_its_timeout_while_the_write_hangs() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(Fault::Hang, 1));
    // The lease must outlast a request (the relay refuses to start otherwise).
    let _relay = env.spawn_relay(&[
        ("FGA_RELAY_REQUEST_TIMEOUT", "60s"),
        ("FGA_RELAY_LEADER_LEASE", "120s"),
    ]);
    let client = env.db.connect().await;
    let id = insert_with(&client, a_tuple(1)).await;
    wait_until(PROMPTLY, "the relay holds the row in flight", || async {
        env.idle_in_transaction().await >= 1
    })
    .await;
    let started = Instant::now();
    let answer = wait_for(&client, &[id], "1s").await.unwrap();
    let took = started.elapsed();
    assert_eq!(answer, "pending");
    assert!(took < PROMPTLY, "returned after {took:?}");
    assert!(!env.row(id).await.delivered);
}

/// A row in flight: the wait queues behind the relay's Write (for the advisory lock the Write's
/// transaction holds, keyed by its id), rather than napping and looking again, and returns
/// `delivered` once OpenFGA has the tuple. While queued it holds no lock on the table, and it
/// takes no row lock and no transaction id, so it writes nothing: called inside a READ COMMITTED
/// transaction, that transaction still has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_row_in_flight_queues_behind_the_write_and_writes_nothing() {
    let env = Env::start().await;
    env.fga
        .push_fault(FaultRule::times(Fault::Delay(Duration::from_secs(3)), 1));
    let _relay = env.start_relay().await;
    let waiter = env.db.connect().await;
    let id = insert_with(&waiter, a_tuple(1)).await;
    wait_until(PROMPTLY, "the relay holds the row in flight", || async {
        env.idle_in_transaction().await >= 1
    })
    .await;
    let pid: i32 = waiter
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let waiting = tokio::spawn(async move {
        waiter.batch_execute("BEGIN").await?;
        let answer = wait_for(&waiter, &[id], "10s").await?;
        let xid: Option<String> = waiter
            .query_one("SELECT pg_current_xact_id_if_assigned()::text", &[])
            .await?
            .get(0);
        waiter.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>((answer, xid))
    });
    let admin = env.db.connect().await;
    wait_until(
        PROMPTLY,
        "the wait queues for the Write's advisory lock",
        || async {
            crate::common::pg::count(
                &admin,
                "SELECT count(*) FROM pg_stat_activity \
             WHERE pid = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                &[&pid],
            )
            .await
                == 1
        },
    )
    .await;
    // Queued, it holds no lock on the table: DDL would wait for the relay's Write only.
    let table_locks = crate::common::pg::count(
        &admin,
        "SELECT count(*) FROM pg_locks WHERE pid = $1 AND relation = 'fga_outbox'::regclass",
        &[&pid],
    )
    .await;
    assert_eq!(table_locks, 0, "the queued wait holds a lock on the table");
    assert!(!env.fga.has("user:u1", "viewer", "document:1"));
    let (answer, xid) = waiting.await.unwrap().unwrap();
    assert_eq!(answer, "delivered");
    assert!(env.fga.has("user:u1", "viewer", "document:1"));
    assert_eq!(xid, None, "the wait took a transaction id");
}

/// Fifty writers, each waiting for its own row while the Writes take a while: every one of them
/// hears `delivered`, and at that moment OpenFGA has its tuple.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_waiters_each_return_once_their_row_is_delivered() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(50)),
        1000,
    ));
    let _relay = env.start_relay().await;
    let env = std::sync::Arc::new(env);
    let mut tasks = Vec::new();
    for n in 0..50 {
        let env = env.clone();
        tasks.push(tokio::spawn(async move {
            let client = env.db.connect().await;
            let id = insert_with(&client, a_tuple(n)).await;
            let answer = wait_for(&client, &[id], "20s").await.unwrap();
            let there = env
                .fga
                .has(&format!("user:u{n}"), "viewer", &format!("document:{n}"));
            (n, answer, there)
        }));
    }
    for task in tasks {
        let (n, answer, there) = task.await.unwrap();
        assert_eq!(answer, "delivered", "waiter {n}");
        assert!(
            there,
            "waiter {n} heard delivered before OpenFGA had its tuple"
        );
    }
}

/// Inside REPEATABLE READ or SERIALIZABLE the snapshot never moves: refused, with the reason.
/// READ COMMITTED (explicit or not) is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_inside_repeatable_read_and_serializable() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let id = insert_with(&client, a_tuple(1)).await;
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        client
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let e = wait_for(&client, &[id], "1s").await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("25000"), "{level}: {e:?}");
        let message = e.as_db_error().unwrap().message().to_owned();
        assert!(
            message.contains(&format!("inside a {level} transaction")),
            "{message}"
        );
        client.batch_execute("ROLLBACK").await.unwrap();
    }
    client
        .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await
        .unwrap();
    assert_eq!(wait_for(&client, &[id], "0s").await.unwrap(), "pending");
    client.batch_execute("COMMIT").await.unwrap();
}

/// Called before COMMIT, in the transaction that inserted the rows: they cannot be delivered
/// until it commits, so it is refused at once rather than timing out. After COMMIT the same
/// call works. An id with no row is an error too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_inside_the_transaction_that_inserted_the_rows() {
    let env = Env::start().await;
    let _relay = env.start_relay().await;
    let client = env.db.connect().await;
    client.batch_execute("BEGIN").await.unwrap();
    let id = insert_with(&client, a_tuple(1)).await;
    let started = Instant::now();
    let e = wait_for(&client, &[id], "30s").await.unwrap_err();
    assert!(started.elapsed() < PROMPTLY);
    assert_eq!(sqlstate(&e).as_deref(), Some("25001"), "{e:?}");
    assert!(
        e.as_db_error()
            .unwrap()
            .message()
            .contains("must be called after COMMIT"),
        "{e:?}"
    );
    // The error ends that transaction, as any error does: its row is gone.
    client.batch_execute("ROLLBACK").await.unwrap();
    let id = insert_with(&client, a_tuple(1)).await;
    assert_eq!(wait_for(&client, &[id], "10s").await.unwrap(), "delivered");

    let e = wait_for(&client, &[id, id + 1000], "1s").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("P0002"), "{e:?}");
    assert!(
        e.as_db_error()
            .unwrap()
            .message()
            .contains(&format!("no row with id {}", id + 1000)),
        "{e:?}"
    );
}

/// A wait holds no lock on the table while it sleeps: DDL (`migrate`'s `ALTER TABLE`) does not
/// queue behind it, and so neither do the writers that would queue behind the DDL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_holds_no_lock_on_the_table() {
    let env = Env::start().await;
    let waiter = env.db.connect().await;
    let id = insert_with(&waiter, a_tuple(1)).await;
    let pid: i32 = waiter
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let waiting = tokio::spawn(async move { wait_for(&waiter, &[id], "8s").await });
    let admin = env.db.connect().await;
    wait_until(PROMPTLY, "the wait is under way", || async {
        crate::common::pg::count(&admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%fga_outbox_wait%'", &[&pid]).await
            == 1
    })
    .await;
    admin
        .batch_execute(
            "SET lock_timeout = '4s'; \
             ALTER TABLE fga_outbox ADD COLUMN wait_test integer; \
             ALTER TABLE fga_outbox DROP COLUMN wait_test",
        )
        .await
        .expect("DDL does not wait for the waiting call");
    assert_eq!(waiting.await.unwrap().unwrap(), "pending");
}

/// A session plans a wait's look once, at its first wait (a generic plan, kept while the session
/// lasts). Planned while the table held fifty rows, that plan was a scan of the whole
/// table, and every look of every later wait read all the rows the table had grown to. A look
/// must find its rows by key whatever size the table had when it was planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_planned_on_a_small_table_still_finds_rows_by_key_once_it_is_large() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let delivered = |n: i64| {
        format!(
            "INSERT INTO fga_outbox (payload, processed_at) \
             SELECT '{{\"writes\": [{{\"user\": \"user:u\", \"relation\": \"viewer\", \
                       \"object\": \"document:1\"}}]}}', now() \
               FROM generate_series(1, {n})"
        )
    };
    // Statistics of a one-page table, as a new outbox has after its first autovacuum; then no
    // autovacuum, whose statistics would make PostgreSQL plan the look again.
    admin
        .batch_execute(&format!(
            "ALTER TABLE fga_outbox SET (autovacuum_enabled = false); {}; ANALYZE fga_outbox",
            delivered(50)
        ))
        .await
        .unwrap();
    let client = env.db.connect().await;
    assert_eq!(
        wait_for(&client, &[env.newest_id().await], "1s")
            .await
            .unwrap(),
        "delivered"
    );
    admin.batch_execute(&delivered(100_000)).await.unwrap();
    // In a transaction that has not written (where a wait may run): nothing the session counts
    // is reported before it ends, so the session's own counters (`pg_stat_xact_*`) still hold
    // what the wait read.
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        wait_for(&client, &[env.newest_id().await], "1s")
            .await
            .unwrap(),
        "delivered"
    );
    let scanned: i64 = client
        .query_one(
            "SELECT seq_tup_read FROM pg_stat_xact_user_tables \
             WHERE relid = 'fga_outbox'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client.batch_execute("COMMIT").await.unwrap();
    assert!(
        scanned < 100_000,
        "the wait read {scanned} rows by scanning the table of 100,050 rows"
    );
}
