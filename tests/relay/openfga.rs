//! What a real OpenFGA does that a client must handle: a store deleted under the relay (OpenFGA
//! deletes softly and keeps answering its Writes), a stored model it cannot use, conflicts,
//! throttling and its own deadline (where the Write may have committed), on the versions users
//! run and on OpenFGA's PostgreSQL datastore.

use crate::common::fga::{Fault, FaultRule, Fga, LEGACY, Op};
use crate::common::pg::TestDb;
use crate::common::relay::{Env, tk, wait_until, writes};
use std::time::Duration;

/// The line the relay logs each time OpenFGA refuses its Writes for a reason of settings.
const HELD: &str = "OpenFGA refused the relay's writes: check its settings";

/// Rows, then a relay with one attempt per row: whatever holds delivery must strike no row.
async fn rows_and_a_strict_relay(
    env: &Env,
    n: usize,
) -> (Vec<i64>, crate::common::relay::RelayProc) {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            env.insert(writes(&[tk(
                &format!("user:h{i}"),
                "viewer",
                "document:held",
            )]))
            .await,
        );
    }
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "1")]);
    (ids, relay)
}

/// Asserts that each row is still pending, not dead, with `reason` in its last error.
async fn assert_held(env: &Env, ids: &[i64], reason: &str) {
    for id in ids {
        let row = env.row(*id).await;
        assert!(
            !row.delivered && !row.dead,
            "row {id} must be held: {row:?}"
        );
        assert!(
            row.last_error
                .as_deref()
                .unwrap_or_default()
                .contains(reason),
            "row {id} must say why it is held ({reason}): {row:?}"
        );
    }
}

/// OpenFGA deletes a store softly: GetStore answers 404 `store_id_not_found`, while Writes to it
/// are still answered 200 and land where nobody reads. The relay checks that its store exists
/// before it writes (at most every few seconds) and holds delivery with an error, striking no
/// row, instead of marking rows delivered into a deleted store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_store_holds_delivery_and_dead_letters_nothing() {
    let env = Env::start().await;
    let relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "1")]);
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:1")]))
        .await;
    env.wait_delivered(first).await;
    env.fga.delete_store();
    // What the relay is up against: the deleted store still takes Writes.
    env.fga
        .write_direct(vec![tk("user:ghost", "viewer", "document:1")], vec![])
        .expect("OpenFGA answers Writes to a deleted store");
    // Until the relay asks again (every few seconds), its Writes still go to the deleted store:
    // a row a second, until one is held.
    let mut held = None;
    for i in 0..30 {
        let id = env
            .insert(writes(&[tk(
                &format!("user:h{i}"),
                "viewer",
                "document:held",
            )]))
            .await;
        wait_until(
            Duration::from_secs(10),
            "the row is delivered or held",
            || async {
                let row = env.row(id).await;
                row.delivered || row.last_error.is_some()
            },
        )
        .await;
        if !env.row(id).await.delivered {
            held = Some(id);
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let held = held.expect("a row is held within 30 s of the store's deletion");
    let sent_when_held = env.fga.write_count();
    relay.wait_for_log_count(HELD, 3).await;
    assert_held(&env, &[held], "no longer exists").await;
    assert_eq!(env.dead().await, 0);
    assert_eq!(
        env.fga.write_count(),
        sent_when_held,
        "once the store is found gone, no Write goes to it"
    );
}

/// A model the server cannot use (stored by another version, or changed in its database) is
/// answered `invalid authorization model encountered` for every Write, whatever its rows: that
/// is the settings' fault, never the rows'. Provoked on OpenFGA's PostgreSQL datastore by
/// changing the stored model; once it is mended, the held rows flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_openfga_finds_invalid_holds_delivery_until_it_is_mended() {
    let db = TestDb::start();
    let fga = Fga::builder().postgres(&db.uri()).start();
    let env = Env::with(db, fga).await;
    let admin = env.db.connect().await;
    // The stored model names type `user` in a relation's type restrictions; make that
    // reference name a type the model does not have.
    let changed = admin
        .execute(
            "UPDATE authorization_model
                SET serialized_protobuf = overlay(serialized_protobuf PLACING 'usez'::bytea
                        FROM position('user'::bytea IN serialized_protobuf) FOR 4)
              WHERE authorization_model_id = $1",
            &[&env.fga.model_id().expect("a model")],
        )
        .await
        .expect("change the stored model");
    assert_eq!(changed, 1);
    let (ids, relay) = rows_and_a_strict_relay(&env, 3).await;
    relay.wait_for_log_count(HELD, 3).await;
    assert_held(&env, &ids, "invalid authorization model").await;
    admin
        .execute(
            "UPDATE authorization_model
                SET serialized_protobuf = overlay(serialized_protobuf PLACING 'user'::bytea
                        FROM position('usez'::bytea IN serialized_protobuf) FOR 4)
              WHERE authorization_model_id = $1",
            &[&env.fga.model_id().expect("a model")],
        )
        .await
        .expect("mend the stored model");
    env.wait_drained().await;
    assert_eq!(env.dead().await, 0);
    for i in 0..3 {
        assert!(
            env.fga
                .has(&format!("user:h{i}"), "viewer", "document:held")
        );
    }
}

/// Conflicts between concurrent writers (409 `Aborted`), datastore throttling (500
/// `resource_exhausted`) and OpenFGA's own deadline (`deadline_exceeded`, here after the Write
/// committed) are retried, strike no row, and leave each tuple applied once and in order.
async fn transient_answers_are_retried_safely(fga: Fga) {
    let env = Env::with_fga(fga).await;
    let t = tk("user:anne", "viewer", "document:t");
    for fault in [
        Fault::aborted(),
        Fault::resource_exhausted(),
        Fault::Applied(Box::new(Fault::deadline_exceeded())),
        Fault::deadline_exceeded(),
    ] {
        env.fga.push_fault(FaultRule::times(fault, 2));
    }
    let write = env.insert(writes(std::slice::from_ref(&t))).await;
    let delete = env
        .insert(crate::common::relay::deletes(std::slice::from_ref(&t)))
        .await;
    let again = env.insert(writes(std::slice::from_ref(&t))).await;
    let _relay = env.spawn_relay(&[("FGA_RELAY_MAX_ATTEMPTS", "1")]);
    wait_until(
        Duration::from_secs(60),
        "the three rows are delivered",
        || async {
            env.row(write).await.delivered
                && env.row(delete).await.delivered
                && env.row(again).await.delivered
        },
    )
    .await;
    assert_eq!(env.dead().await, 0);
    let ops: Vec<Op> = env
        .fga
        .changelog()
        .into_iter()
        .filter(|c| c.user == "user:anne")
        .map(|c| c.op)
        .collect();
    assert_eq!(
        ops,
        [Op::Write, Op::Delete, Op::Write],
        "each operation applied once, in the outbox's order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_throttling_and_deadlines_are_retried_safely() {
    transient_answers_are_retried_safely(Fga::start()).await;
}

/// The same on OpenFGA before 1.10, where the retry of a committed Write is answered "already
/// exists" rather than ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_throttling_and_deadlines_are_retried_safely_before_1_10() {
    transient_answers_are_retried_safely(Fga::builder().legacy().start()).await;
}

/// The servers the suite runs are the versions the README names.
#[test]
fn the_suite_runs_the_versions_the_readme_names() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read the README");
    for version in [crate::common::fga::MODERN, LEGACY] {
        assert!(
            readme.contains(version.trim_start_matches('v')),
            "the README's compatibility table names OpenFGA {version}"
        );
    }
}
