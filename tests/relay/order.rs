//! Order per tuple where it is easiest to lose: rows finished by an older OpenFGA's "already
//! exists", a rejected row another session holds or whose dead-lettering fails, a row changed
//! after its page was read, dead rows brought back by `retry`, and conditions an older OpenFGA
//! cannot overwrite. Each test fails with its mechanism taken out.

use crate::common::fga::{Fault, FaultRule, Fga, StoredTuple};
use crate::common::pg::{PROMPTLY, PgOptions, TestDb};
use crate::common::relay::{Env, RelayProc, deletes, insert_with, tk, wait_until, writes};
use crate::stores::in_store;
use serde_json::json;
use std::time::Duration;

/// How long the Write a test acts beside takes: below the request timeout the tests run with
/// (2 s), long enough for the test's one statement meanwhile on a loaded machine.
const SLOW_WRITE: Duration = Duration::from_millis(1500);

/// When OpenFGA answered the first Write it received.
fn first_answered(fga: &Fga) -> Option<std::time::Instant> {
    fga.writes().first().and_then(|w| w.answered_at)
}

/// Every operation OpenFGA applied on `user relation object`, in order: true a write.
fn applied_on(fga: &Fga, user: &str, relation: &str, object: &str) -> Vec<bool> {
    fga.changelog()
        .iter()
        .filter(|c| c.user == user && c.relation == relation && c.object == object)
        .map(|c| matches!(c.op, crate::common::fga::Op::Write))
        .collect()
}

/// Waits until OpenFGA has received `n` Writes (a Write is recorded as it arrives).
async fn wait_writes_received(fga: &Fga, n: usize) {
    wait_until(PROMPTLY, &format!("{n} Write(s) received"), || async {
        fga.write_count() >= n
    })
    .await;
}

/// Makes the first UPDATE of an outbox row for which `when` holds (a condition on `OLD` and
/// `NEW`) fail, as a database error would; the sequence `update_tries` counts the tries, outside
/// any transaction.
async fn fail_first_update(admin: &tokio_postgres::Client, when: &str) {
    admin
        .batch_execute(&format!(
            "CREATE SEQUENCE update_tries;
             CREATE FUNCTION fail_first_update() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF {when} AND nextval('update_tries') = 1 THEN
                     RAISE EXCEPTION 'injected: the update of row % fails', NEW.id;
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER fail_first_update BEFORE UPDATE ON fga_outbox
                 FOR EACH ROW EXECUTE FUNCTION fail_first_update();"
        ))
        .await
        .unwrap();
}

/// The update [`fail_first_update`] fails was tried.
async fn assert_update_failed(admin: &tokio_postgres::Client) {
    let tries: i64 = admin
        // A sequence never used also shows `last_value` 1: count only once it was called.
        .query_one(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM update_tries",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(tries >= 1, "the injected fault never fired");
}

/// On OpenFGA before 1.10 a row whose write OpenFGA already holds is finished by that answer,
/// with no Write of its own to mark it. Its mark must land before a later row on its tuple is
/// sent: here that mark fails once (a database error), and the relay must not send the later
/// delete before the row is marked, or it sends the row again after the delete and OpenFGA
/// ends up holding the tuple the outbox removed last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_finished_by_already_exists_is_marked_before_its_tuple_moves_on() {
    let env = Env::with_fga(Fga::builder().legacy().start()).await;
    env.fga
        .insert_tuple(StoredTuple::new("user:anne", "viewer", "document:1"));
    let t = tk("user:anne", "viewer", "document:1");
    let first = env.insert(writes(std::slice::from_ref(&t))).await;
    let last = env.insert(deletes(std::slice::from_ref(&t))).await;
    // The first mark of `first` fails.
    let admin = env.db.connect().await;
    fail_first_update(
        &admin,
        &format!("NEW.id = {first} AND OLD.processed_at IS NULL AND NEW.processed_at IS NOT NULL"),
    )
    .await;
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "both rows are delivered", || async {
        env.row(first).await.delivered && env.row(last).await.delivered
    })
    .await;
    assert_update_failed(&admin).await;
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "OpenFGA holds the tuple the outbox deleted last (applied: {:?}); relay log:\n{}",
        applied_on(&env.fga, "user:anne", "viewer", "document:1"),
        relay.logs()
    );
}

/// A row OpenFGA rejects (here a write whose tuple exists with another condition: 409) that
/// another session holds when the relay dead-letters it stays pending; no later row on its
/// tuple may overtake it meanwhile. Otherwise the later delete removes the tuple, the rejected
/// write then succeeds, and OpenFGA holds a tuple the outbox deleted last.
///
/// The holder queues for the row's lock while its Write is in flight and gets it when the
/// Write's transaction ends; the relay's dead-lettering, a moment later, may still come first
/// (PostgreSQL wakes the waiter, which must then take the lock). Then the scenario did not
/// happen, and it is tried again on another tuple.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_row_another_session_holds_keeps_its_tuple_blocked() {
    let env = Env::start().await;
    let relay = env.start_relay().await;
    for n in 0..5 {
        let object = format!("document:h{n}");
        env.fga.insert_tuple(
            StoredTuple::new("user:anne", "viewer", &object)
                .with_condition("non_expired", json!({"expires_at": "2020-01-01T00:00:00Z"})),
        );
        // The rejected row's Write is slow, so that the holder queues for its lock meanwhile.
        env.fga
            .push_fault(FaultRule::once(Fault::Delay(SLOW_WRITE)).when_tuple(
                "user:anne",
                "viewer",
                &object,
            ));
        let holder = env.db.connect().await;
        holder.batch_execute("BEGIN").await.unwrap();
        let before = env.fga.write_count();
        let mut conditioned = tk("user:anne", "viewer", &object);
        conditioned["condition"] =
            json!({"name": "non_expired", "context": {"expires_at": "2030-01-01T00:00:00Z"}});
        // In one transaction: the pass that sends the rejected row has the later one too.
        let writer = env.db.connect().await;
        writer.batch_execute("BEGIN").await.unwrap();
        let rejected = insert_with(&writer, writes(&[conditioned])).await;
        let later = insert_with(&writer, deletes(&[tk("user:anne", "viewer", &object)])).await;
        writer.batch_execute("COMMIT").await.unwrap();
        wait_writes_received(&env.fga, before + 1).await;
        holder
            .execute(
                "SELECT 1 FROM fga_outbox WHERE id = $1 FOR UPDATE",
                &[&rejected],
            )
            .await
            .unwrap();
        if env.row(rejected).await.dead {
            // The relay dead-lettered it before the holder took it: not the case tested.
            holder.batch_execute("COMMIT").await.unwrap();
            env.wait_delivered(later).await;
            continue;
        }
        // A row on another tuple, inserted now, is delivered by a later pass than the one that
        // saw the rejection: once it is, that pass is over.
        let other = env
            .insert(writes(&[tk(
                "user:other",
                "viewer",
                &format!("document:o{n}"),
            )]))
            .await;
        env.wait_delivered(other).await;
        let overtaken = env.row(later).await.delivered;
        holder.batch_execute("COMMIT").await.unwrap();
        wait_until(PROMPTLY, "the rejected row is done with", || async {
            let r = env.row(rejected).await;
            (r.dead || r.delivered) && env.row(later).await.delivered
        })
        .await;
        let r = env.row(rejected).await;
        assert!(
            !overtaken,
            "the later delete went out while the rejected row was pending; relay log:\n{}",
            relay.logs()
        );
        assert!(r.dead, "the rejected row ended {r:?}");
        assert!(
            !env.fga.has("user:anne", "viewer", &object),
            "OpenFGA holds the tuple the outbox deleted last (applied: {:?})",
            applied_on(&env.fga, "user:anne", "viewer", &object),
        );
        return;
    }
    panic!("in 5 tries the relay always dead-lettered the row before the holder took it");
}

/// A rejected row whose dead-lettering fails (a database error) is still pending, and stays in
/// hand, in its place, while the stream starts again: no later row on its tuple may go first.
/// Otherwise, with a read's worth of rows queued behind it (so that the stream starting again
/// does not read it back before it plans), the later delete removes the tuple, the rejected
/// write then succeeds, and OpenFGA holds a tuple the outbox deleted last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_row_whose_dead_lettering_fails_keeps_its_tuple_blocked() {
    let env = Env::start().await;
    let object = "document:dl";
    env.fga.insert_tuple(
        StoredTuple::new("user:anne", "viewer", object)
            .with_condition("non_expired", json!({"expires_at": "2020-01-01T00:00:00Z"})),
    );
    // The first dead-lettering fails.
    let admin = env.db.connect().await;
    fail_first_update(
        &admin,
        "OLD.failed_at IS NULL AND NEW.failed_at IS NOT NULL",
    )
    .await;
    // In one transaction, read a page of two at a time: the rejected row's Write flies alone
    // (one Write in flight; the delete waits behind it), slowly, while the rows after it are
    // read and queued behind it: a read's worth more.
    let mut conditioned = tk("user:anne", "viewer", object);
    conditioned["condition"] =
        json!({"name": "non_expired", "context": {"expires_at": "2030-01-01T00:00:00Z"}});
    let writer = env.db.connect().await;
    writer.batch_execute("BEGIN").await.unwrap();
    let rejected = insert_with(&writer, writes(&[conditioned])).await;
    let later = insert_with(&writer, deletes(&[tk("user:anne", "viewer", object)])).await;
    for n in 0..3 {
        let other = tk("user:other", "viewer", &format!("document:dl{n}"));
        insert_with(&writer, writes(&[other])).await;
    }
    writer.batch_execute("COMMIT").await.unwrap();
    env.fga
        .push_fault(FaultRule::once(Fault::Delay(SLOW_WRITE)).when_tuple(
            "user:anne",
            "viewer",
            object,
        ));
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_MAX_IN_FLIGHT", "1"),
        ("FGA_RELAY_BATCH_SIZE", "2"),
    ]);
    wait_until(PROMPTLY, "the rejected row is done with", || async {
        let r = env.row(rejected).await;
        (r.dead || r.delivered) && env.row(later).await.delivered
    })
    .await;
    assert_update_failed(&admin).await;
    let r = env.row(rejected).await;
    assert!(
        r.dead && !env.fga.has("user:anne", "viewer", object),
        "the rejected row ended {r:?}, and OpenFGA holds the tuple the outbox deleted last: {} \
         (applied: {:?}); relay log:\n{}",
        env.fga.has("user:anne", "viewer", object),
        applied_on(&env.fga, "user:anne", "viewer", object),
        relay.logs()
    );
}

/// A row's mark is durable before any later row on its tuple leaves: PostgreSQL crashing right
/// after a grant and then its revoke were delivered loses neither mark, and OpenFGA never gets
/// the grant again after the revoke. With the marks committed asynchronously, the crash lost
/// both, the relay sent both again, and OpenFGA held the revoked grant until the revoke came
/// again. The server commits asynchronously unless told otherwise, and its WAL writer runs every
/// 10 s (autovacuum off), so that only a commit that waits for the flush makes a mark durable
/// before the crash; the relay renews its lease (a durable commit, which would flush the marks
/// with it) every 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rows_mark_survives_a_postgresql_crash_right_after_it() {
    let db = TestDb::start_with(PgOptions {
        settings: vec![
            ("wal_writer_delay".into(), "10000ms".into()),
            ("autovacuum".into(), "off".into()),
            // As a server tuned for writers' throughput may have it: the relay turns it on.
            ("synchronous_commit".into(), "off".into()),
        ],
        durable: true,
        ..PgOptions::default()
    });
    let env = Env::with(db, Fga::start()).await;
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "5s"),
        ("FGA_RELAY_LEADER_LEASE", "16s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let t = tk("user:crash", "viewer", "document:crash");
    let writer = env.db.connect().await;
    writer.batch_execute("BEGIN").await.unwrap();
    let grant = insert_with(&writer, writes(std::slice::from_ref(&t))).await;
    let revoke = insert_with(&writer, deletes(std::slice::from_ref(&t))).await;
    writer.batch_execute("COMMIT").await.unwrap();
    wait_until(PROMPTLY, "both rows are delivered", || async {
        env.row(grant).await.delivered && env.row(revoke).await.delivered
    })
    .await;
    env.db.stop_immediately();
    env.db.restart_after_stop();
    let (g, r) = (env.row(grant).await, env.row(revoke).await);
    assert!(
        g.delivered && r.delivered,
        "the crash took back marks: grant {g:?}, revoke {r:?}; relay log:\n{}",
        relay.logs()
    );
    env.wait_drained().await;
    assert_eq!(
        applied_on(&env.fga, "user:crash", "viewer", "document:crash"),
        [true, false],
        "OpenFGA applied the tuple's operations out of id order"
    );
}

/// A first row (`user:a viewer document:a`) and a row after it that writes `user:old viewer
/// document:r` and deletes the first row's tuple; a relay started, and the first row's Write
/// received and slowed, so that the row after it waits, read, until it is answered. Returns the
/// two ids and the relay.
async fn a_row_behind_a_slow_write(env: &Env) -> (i64, i64, RelayProc) {
    let a = tk("user:a", "viewer", "document:a");
    let first = env.insert(writes(std::slice::from_ref(&a))).await;
    let changed = env
        .insert(json!({"writes": [tk("user:old", "viewer", "document:r")], "deletes": [a]}))
        .await;
    env.fga
        .push_fault(FaultRule::once(Fault::Delay(SLOW_WRITE)).when_tuple(
            "user:a",
            "viewer",
            "document:a",
        ));
    let relay = env.start_relay().await;
    wait_writes_received(&env.fga, 1).await;
    (first, changed, relay)
}

/// Starts a relay with a row behind a slow first Write on its tuple (`user:a viewer
/// document:a`), read with the first, and changes it to `now` while that Write is in flight,
/// before its answer. The row as read wrote `user:old viewer document:r` and deleted the first
/// row's tuple. Once both are delivered, checks that nothing of what the row said when read was
/// applied, and returns the relay.
async fn change_a_row_while_the_write_before_it_flies(
    env: &Env,
    now: serde_json::Value,
) -> RelayProc {
    let (first, changed, relay) = a_row_behind_a_slow_write(env).await;
    let admin = env.db.connect().await;
    admin
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&changed, &now],
        )
        .await
        .unwrap();
    let updated = std::time::Instant::now();
    assert!(
        first_answered(&env.fga).is_none_or(|at| at > updated),
        "precondition: the row was changed after the Write before it was answered"
    );
    env.wait_delivered(changed).await;
    env.wait_delivered(first).await;
    assert!(
        applied_on(&env.fga, "user:old", "viewer", "document:r").is_empty(),
        "the row's old payload was sent; relay log:\n{}",
        relay.logs()
    );
    assert!(
        env.fga.has("user:a", "viewer", "document:a"),
        "the old payload's delete was applied"
    );
    relay
}

/// A row read in a pass (without a lock) and changed before its Write locks it is sent as it is
/// when locked, never with what it said when read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_changed_after_it_was_read_is_sent_as_its_lock_sees_it() {
    let env = Env::start().await;
    let now = writes(&[tk("user:new", "viewer", "document:r")]);
    change_a_row_while_the_write_before_it_flies(&env, now).await;
    assert!(env.fga.has("user:new", "viewer", "document:r"));
}

/// A row changed, before its Write locks it, to a payload that is not UTF-8 (a database in
/// `SQL_ASCII` stores the bytes as given) is looked at again and dead-lettered as a read would,
/// and the rows after it flow: the lock once failed the whole stream on it, again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_changed_to_bytes_that_are_not_text_before_its_lock_is_dead_lettered() {
    let env = Env::with(TestDb::start_encoded("SQL_ASCII"), Fga::start()).await;
    let (first, changed, relay) = a_row_behind_a_slow_write(&env).await;
    let admin = env.db.connect().await;
    admin
        .execute(
            "UPDATE fga_outbox SET payload = ('{\"writes\": [{\"user\": \"user:' || chr(255) \
             || '\", \"relation\": \"viewer\", \"object\": \"document:r\"}]}')::jsonb \
             WHERE id = $1",
            &[&changed],
        )
        .await
        .unwrap();
    assert!(
        first_answered(&env.fga).is_none(),
        "precondition: the row was changed before the Write before it was answered"
    );
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:r")]))
        .await;
    env.wait_delivered(first).await;
    wait_until(PROMPTLY, "the changed row is dead-lettered", || async {
        env.row(changed).await.dead
    })
    .await;
    env.wait_delivered(after).await;
    let r = env.row(changed).await;
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("not UTF-8")),
        "the reason does not say what is wrong: {r:?}"
    );
    assert!(
        applied_on(&env.fga, "user:old", "viewer", "document:r").is_empty(),
        "the row's old payload was sent; relay log:\n{}",
        relay.logs()
    );
}

/// A row read naming one store and changed, before its Write locks it, to name another is
/// delivered to the store it names when locked, never to the one it named when read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_changed_to_name_another_store_after_it_was_read_lands_in_that_store() {
    let env = Env::start().await;
    let other = env.fga.add_store();
    let now = in_store(writes(&[tk("user:moved", "viewer", "document:r")]), &other);
    let relay = change_a_row_while_the_write_before_it_flies(&env, now).await;
    assert!(
        !env.fga.has("user:moved", "viewer", "document:r"),
        "the changed row was written to the store it named when read; relay log:\n{}",
        relay.logs()
    );
    assert!(env.fga.has_in(&other, "user:moved", "viewer", "document:r"));
}

/// On OpenFGA before 1.10, a write whose tuple exists with another condition is answered
/// "already exists", and the new condition never lands. The relay reads the tuple back on that
/// answer: held with another condition, the row is dead-lettered with the reason, never marked
/// delivered; held as written, the row is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_openfga_holding_another_condition_dead_letters_the_write() {
    let env = Env::with_fga(Fga::builder().legacy().start()).await;
    let old = json!({"expires_at": "2020-01-01T00:00:00Z"});
    for object in ["document:1", "document:2"] {
        env.fga.insert_tuple(
            StoredTuple::new("user:anne", "viewer", object)
                .with_condition("non_expired", old.clone()),
        );
    }
    let with = |object: &str, expires_at: &str| {
        let mut t = tk("user:anne", "viewer", object);
        t["condition"] = json!({"name": "non_expired", "context": {"expires_at": expires_at}});
        t
    };
    let changed = env
        .insert(writes(&[with("document:1", "2030-01-01T00:00:00Z")]))
        .await;
    let same = env
        .insert(writes(&[with("document:2", "2020-01-01T00:00:00Z")]))
        .await;
    let out = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "drain exits 3 on a dead row:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = env.row(changed).await;
    assert!(
        r.dead && !r.delivered,
        "the write whose condition OpenFGA did not take ended {r:?}; log:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reason = r.last_error.unwrap_or_default();
    assert!(
        reason.contains("condition") && reason.contains("2020-01-01"),
        "the reason does not say what OpenFGA holds: {reason}"
    );
    let s = env.row(same).await;
    assert!(
        s.delivered,
        "the write OpenFGA holds as written ended {s:?}"
    );
    assert_eq!(
        env.fga.condition_of("user:anne", "viewer", "document:1"),
        Some(json!({"name": "non_expired", "context": old}))
    );
}

/// A 400 naming one tuple, as OpenFGA answers a tuple its model does not allow.
pub(crate) fn invalid(user: &str, relation: &str, object: &str) -> FaultRule {
    FaultRule::once(Fault::status(
        400,
        "validation_error",
        &format!(
            "Invalid tuple '{object}#{relation}@{user}'. Reason: relation '{relation}' not found"
        ),
    ))
    .when_tuple(user, relation, object)
}

/// A grant of anne on document:1 that OpenFGA rejected (dead), a later revoke of it delivered,
/// and the grant brought back to pending (retried) with no relay running; returned with a
/// session that holds its row locked in an open transaction, as an operator's would.
async fn retried_grant_another_session_holds(env: &Env) -> (i64, tokio_postgres::Client) {
    env.fga
        .push_fault(invalid("user:anne", "viewer", "document:1"));
    let anne = || vec![tk("user:anne", "viewer", "document:1")];
    let grant = env.insert(writes(&anne())).await;
    let mut relay = env.start_relay().await;
    wait_until(PROMPTLY, "the grant is dead", || async {
        env.row(grant).await.dead
    })
    .await;
    let revoke = env.insert(deletes(&anne())).await;
    env.wait_delivered(revoke).await;
    relay.term();
    relay.wait_exit(Duration::from_secs(20)).await;
    env.db
        .connect()
        .await
        .execute(
            "UPDATE fga_outbox SET failed_at = NULL WHERE id = $1",
            &[&grant],
        )
        .await
        .unwrap();
    let holder = env.hold_row(grant).await;
    (grant, holder)
}

/// A retried row whose note another session held off, which that session then finishes itself
/// (marks it delivered, as an operator settling it by hand would): the relay lets it go, and a
/// later row on its tuple is delivered. Fails with the row kept waiting for its note for ever
/// (`Noted::Gone` taken for `Noted::HeldElsewhere`): the later row never left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_row_another_session_finishes_while_its_note_waits_frees_its_tuple() {
    let env = Env::start().await;
    let anne = || vec![tk("user:anne", "viewer", "document:1")];
    let (grant, holder) = retried_grant_another_session_holds(&env).await;
    let relay = env.start_relay().await;
    relay
        .wait_for_log("it waits for its note of superseded operations")
        .await;
    holder
        .execute(
            "UPDATE fga_outbox SET processed_at = now() WHERE id = $1",
            &[&grant],
        )
        .await
        .unwrap();
    holder.batch_execute("COMMIT").await.unwrap();
    let again = env.insert(writes(&anne())).await;
    let delivered = env
        .all_delivered_within(&[again], Duration::from_secs(10))
        .await;
    assert!(
        delivered,
        "a later row on the tuple of a retried row finished by another session never left; \
         relay log:\n{}",
        relay.logs()
    );
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
}

/// `fga-relay retry` never replays a dead row's operation over a later row's operation on the
/// same tuple that OpenFGA already applied: a grant dead-lettered (the model did not allow it
/// yet), a later revoke of it delivered, then the dead row retried, leaves the tuple revoked.
/// Such operations are skipped and said so (`--dry-run`, the log, the row's `last_error`); the
/// rest of a row, and a dead row nothing later touched, are delivered as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_never_replays_an_operation_a_later_row_superseded() {
    let env = Env::start().await;
    for (user, object) in [
        ("user:anne", "document:1"),
        ("user:carl", "document:3"),
        ("user:dan", "document:4"),
    ] {
        env.fga.push_fault(invalid(user, "viewer", object));
    }
    let grant = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let pair = env
        .insert(writes(&[
            tk("user:bob", "viewer", "document:2"),
            tk("user:carl", "viewer", "document:3"),
        ]))
        .await;
    let untouched = env
        .insert(writes(&[tk("user:dan", "viewer", "document:4")]))
        .await;
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "the three rows are dead", || async {
        env.row(grant).await.dead && env.row(pair).await.dead && env.row(untouched).await.dead
    })
    .await;
    let revoke = env
        .insert(deletes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let revoke_bob = env
        .insert(deletes(&[tk("user:bob", "viewer", "document:2")]))
        .await;
    env.wait_delivered(revoke).await;
    env.wait_delivered(revoke_bob).await;

    let out = env
        .command(&["retry", "--dead", "--dry-run"])
        .output()
        .unwrap();
    crate::common::relay::assert_success(&out, "retry --dry-run");
    let listed = String::from_utf8_lossy(&out.stdout);
    for line in [
        format!("row {grant}: skip write document:1#viewer@user:anne (superseded by row {revoke}"),
        format!(
            "row {pair}: skip write document:2#viewer@user:bob (superseded by row {revoke_bob}"
        ),
        format!("row {pair}: replay write document:3#viewer@user:carl"),
        format!("row {untouched}: replay write document:4#viewer@user:dan"),
    ] {
        assert!(
            listed.contains(&line),
            "--dry-run does not say {line:?}:\n{listed}"
        );
    }
    assert!(env.row(grant).await.dead, "--dry-run changed a row");

    let out = env.command(&["retry", "--dead"]).output().unwrap();
    crate::common::relay::assert_success(&out, "retry --dead");
    wait_until(PROMPTLY, "the retried rows are delivered", || async {
        env.row(grant).await.delivered
            && env.row(pair).await.delivered
            && env.row(untouched).await.delivered
    })
    .await;
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "the retried grant was applied over the later revoke (applied: {:?}); relay log:\n{}",
        applied_on(&env.fga, "user:anne", "viewer", "document:1"),
        relay.logs()
    );
    assert!(
        !env.fga.has("user:bob", "viewer", "document:2"),
        "the retried row's superseded write was applied"
    );
    assert!(env.fga.has("user:carl", "viewer", "document:3"));
    assert!(env.fga.has("user:dan", "viewer", "document:4"));
    let note = env.row(grant).await.last_error.unwrap_or_default();
    assert!(
        note.contains("superseded") && note.contains(&format!("row {revoke}")),
        "the row does not say what was skipped: {note:?}"
    );
    assert!(
        relay
            .logs()
            .contains("operation superseded by a later delivered row"),
        "no log line says what was skipped"
    );
}

/// A dead row brought back by hand (an `UPDATE` of `failed_at`, not `fga-relay retry`) keeps the
/// rule too: the schema's trigger marks it, and its superseded operation is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_row_brought_back_by_hand_skips_what_a_later_row_superseded() {
    let env = Env::start().await;
    env.fga
        .push_fault(invalid("user:anne", "viewer", "document:1"));
    let grant = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "the grant is dead", || async {
        env.row(grant).await.dead
    })
    .await;
    let revoke = env
        .insert(deletes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(revoke).await;
    let admin = env.db.connect().await;
    admin
        .execute(
            "UPDATE fga_outbox SET failed_at = NULL WHERE id = $1",
            &[&grant],
        )
        .await
        .unwrap();
    // A row inserted after, on another tuple: once it is delivered, the pass that read the
    // grant again is over.
    let after = env
        .insert(writes(&[tk("user:other", "viewer", "document:o")]))
        .await;
    env.wait_delivered(after).await;
    env.wait_delivered(grant).await;
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "the grant brought back by hand was applied over the later revoke; relay log:\n{}",
        relay.logs()
    );
    let note = env.row(grant).await.last_error.unwrap_or_default();
    assert!(note.contains("superseded"), "last_error: {note:?}");
}

/// A dead row retried while a later row on its tuple is in flight (its Write slow) is looked at
/// for superseding rows only once that Write has landed and its row is marked: the revoke
/// supersedes the grant, which is skipped, and OpenFGA ends without the tuple. Fails with the
/// look taken at once, when nothing later is marked yet (`Core::unchecked`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_retried_while_a_later_row_on_its_tuple_is_in_flight_is_not_replayed_over_it() {
    let env = Env::start().await;
    env.fga
        .push_fault(invalid("user:anne", "viewer", "document:1"));
    let grant = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "the grant is dead", || async {
        env.row(grant).await.dead
    })
    .await;
    let before = env.fga.write_count();
    // The revoke's Write takes 1.5 s at OpenFGA.
    env.fga
        .push_fault(FaultRule::once(Fault::Delay(SLOW_WRITE)).when_tuple(
            "user:anne",
            "viewer",
            "document:1",
        ));
    let revoke = env
        .insert(deletes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    wait_writes_received(&env.fga, before + 1).await;
    // While it is in flight, the dead grant is brought back.
    let out = env.command(&["retry", "--dead"]).output().unwrap();
    crate::common::relay::assert_success(&out, "retry --dead");
    env.wait_delivered(revoke).await;
    env.wait_delivered(grant).await;
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "the retried grant was applied over the later revoke (applied: {:?}); last_error {:?}; relay log:\n{}",
        applied_on(&env.fga, "user:anne", "viewer", "document:1"),
        env.row(grant).await.last_error,
        relay.logs()
    );
}

/// A retried row whose operation a later delivered row superseded, held by another session (an
/// operator's open transaction): its note and its mark skip it (SKIP LOCKED) rather than wait,
/// so a row on another tuple flows meanwhile; and once let go, the retried row gets its note
/// and is marked. Fails with the note's or the mark's UPDATE waiting for the lock
/// (sql/queries/record_skipped.sql, sql/queries/mark_finished.sql), and with the row taken as
/// checked though its note was skipped (`Deliverer::skip_superseded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_row_another_session_holds_never_stops_the_other_rows() {
    let env = Env::start().await;
    let (grant, holder) = retried_grant_another_session_holds(&env).await;
    let relay = env.start_relay().await;
    let other = env
        .insert(writes(&[tk("user:bob", "viewer", "document:2")]))
        .await;
    let flowed = env
        .all_delivered_within(&[other], Duration::from_secs(8))
        .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        flowed,
        "a row on another tuple waited for the session holding the retried row; relay log:\n{}",
        relay.logs()
    );
    env.wait_delivered(grant).await;
    assert!(!env.fga.has("user:anne", "viewer", "document:1"));
    // Its note was not lost to the lock: written once the row was let go, before its mark.
    let note = env.row(grant).await.last_error.unwrap_or_default();
    assert!(
        note.starts_with("retried: skipped 1 of 1 operations"),
        "the retried row's note is {note:?}; relay log:\n{}",
        relay.logs()
    );
}
