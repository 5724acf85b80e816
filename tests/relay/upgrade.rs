//! Rolling upgrades and rollbacks between 0.2.0 (commit 4524e41, the relay that delivered in
//! passes) and this version (one continuous stream). A Kubernetes rollout starts the new pod
//! before it stops the old one, so the two run side by side on one outbox: they must take turns
//! through the same leadership lock, lease and fence, or order per tuple breaks. Nothing in the
//! schema or in leadership changed between them; these tests show that they do interoperate, in
//! both directions, whether the leader is stopped (SIGTERM) or killed (SIGKILL) with a Write in
//! flight that OpenFGA applies late.
//!
//! The 0.2.0 binary is built once per machine from this repository's history by the harness
//! (`tests/common/v020.rs`), on first need: into `~/.cache/fga-relay/v0.2.0/fga-relay`, or where
//! `FGA_RELAY_V020_BIN` says.

use crate::common::fga::{Fault, FaultRule, Op};
use crate::common::pg::PROMPTLY;
use crate::common::relay::{
    BIN, Env, RelayProc, deletes, insert_with, tk, wait_until, write_tuple_keys, writes,
};
use crate::delivery::mixed_payload;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Rows, each a grant or revoke of one of a few tuples, so that every tuple sees a long
/// sequence of both across the handover.
const ROWS: usize = 180;
const TUPLES: usize = 6;

/// Timings under which the Write in flight at the handover, applied `LATE` after OpenFGA
/// received it, lands within the request timeout, and seconds after a leader that skipped the
/// fence would have sent that tuple's next operation.
const VARS: [(&str, &str); 3] = [
    ("FGA_RELAY_REQUEST_TIMEOUT", "6s"),
    ("FGA_RELAY_LEADER_LEASE", "7s"),
    ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
];
const LATE: Duration = Duration::from_millis(5800);

/// A tuple of its own for the Write in flight at the handover: granted just before, revoked
/// after. A leader that sent the revoke before the late grant landed would leave it granted.
const LATE_TUPLE: (&str, &str, &str) = ("user:late", "viewer", "document:late");

/// The 0.2.0 relay, built on first need (`tests/common/v020.rs`); the test fails with what to do
/// when it cannot be.
fn v020() -> PathBuf {
    crate::common::v020::binary().unwrap_or_else(|e| panic!("{e}"))
}

/// How the leader ends its term.
#[derive(Clone, Copy)]
enum End {
    /// SIGTERM: as Kubernetes stops the old pod once the new one is up.
    Stop,
    /// SIGKILL: a node lost, an out-of-memory kill.
    Kill,
}

/// Row `j`'s tuple (`user:t{k} viewer document:mix`) and whether it grants (else revokes) it:
/// each tuple's rows alternate, starting with a grant.
fn plan() -> Vec<(usize, bool)> {
    let mut held = [false; TUPLES];
    (0..ROWS)
        .map(|j| {
            let k = (j * 7 + j / 11) % TUPLES;
            held[k] = !held[k];
            (k, held[k])
        })
        .collect()
}

/// Inserts rows `range` of the plan, each in its own transaction. With `faults`, a Write now and
/// then fails: a 500, a 409, or one OpenFGA applies but answers 504 (sent again), one at a time
/// so that the relay keeps delivering between them.
async fn insert_rows(
    env: &Env,
    plan: &[(usize, bool)],
    range: std::ops::Range<usize>,
    faults: bool,
) -> Vec<i64> {
    let client = env.db.connect().await;
    let mut ids = Vec::new();
    for j in range {
        let (k, grant) = plan[j];
        ids.push(insert_with(&client, mixed_payload(j, k, grant)).await);
        // Not at the first row, which shows that the first relay delivers before the second starts.
        if faults && j % 20 == 10 {
            let fault = match (j / 20) % 3 {
                0 => Fault::internal(),
                1 => Fault::aborted(),
                _ => Fault::Applied(Box::new(Fault::deadline_exceeded())),
            };
            env.fga.push_fault(FaultRule::once(fault));
        }
    }
    ids
}

/// The relay that leads, by the leader record's holder (which names its pid).
async fn leads(env: &Env, relay: &RelayProc) -> bool {
    let holder: String = env
        .db
        .connect()
        .await
        .query_one("SELECT holder FROM fga_outbox_leader", &[])
        .await
        .expect("the leader record")
        .get(0);
    holder.contains(&format!("pid {} run ", relay.pid()))
}

/// `from` leads and delivers; `to` starts and stands by; more rows come; a Write is held in
/// flight (OpenFGA applies it `LATE`) and `from` ends its term as `end` says while rows keep
/// coming; `to` takes over and delivers the rest. Then what OpenFGA applied is checked.
async fn hand_over(from: &Path, to: &Path, end: End) {
    let env = Env::start().await;
    let plan = plan();
    let (a, b, c) = (ROWS / 3, 2 * ROWS / 3, 2 * ROWS / 3 + 10);

    let mut old = env.spawn_relay_of(from, &VARS);
    old.wait_for_log("delivering (leader)").await;
    let ids = insert_rows(&env, &plan, 0..a, true).await;
    env.wait_delivered(ids[0]).await;

    let new = env.spawn_relay_of(to, &VARS);
    new.wait_for_log("standing by").await;
    insert_rows(&env, &plan, a..b, true).await;

    // The grant of the late tuple is applied late: the leader ends with it in flight. Only that
    // Write: the next leader's Writes go at once, so that a revoke sent too early lands first.
    env.fga.clear_faults();
    let (user, relation, object) = LATE_TUPLE;
    env.fga
        .push_fault(FaultRule::once(Fault::Delay(LATE)).when_tuple(user, relation, object));
    insert_rows(&env, &plan, b..c, false).await;
    env.insert(writes(&[tk(user, relation, object)])).await;
    let late = format!("{object}#{relation}@{user}");
    // Generous: the leader may be backing off after the failures above.
    wait_until(
        Duration::from_secs(60),
        "the late Write is in flight",
        || {
            let in_flight = env
                .fga
                .writes()
                .iter()
                .any(|w| w.answered_at.is_none() && write_tuple_keys(&w.body).contains(&late));
            async move { in_flight }
        },
    )
    .await;
    match end {
        End::Stop => old.term(),
        End::Kill => old.kill9(),
    }
    // Rows committed during the handover.
    env.insert(deletes(&[tk(user, relation, object)])).await;
    insert_rows(&env, &plan, c..ROWS, false).await;
    if let End::Stop = end {
        // It waits for its Write in flight first.
        let status = old.wait_exit(LATE + PROMPTLY).await;
        assert!(
            status.success(),
            "the stopped relay exited with {status}; its log:\n{}",
            old.logs()
        );
    }
    new.wait_for_log("delivering (leader)").await;
    // The record the other version left says how long to wait: nothing after a clean release,
    // until none of its Writes can land after a kill.
    let waited = new
        .logs()
        .contains("the previous leader did not let go cleanly");
    assert_eq!(
        waited,
        matches!(end, End::Kill),
        "the relay that took over waited for the fence: {waited}; its log:\n{}",
        new.logs()
    );
    env.wait_drained_within(Duration::from_secs(90)).await;
    // A Write of the killed leader may still be on its way to OpenFGA: judge once it has landed.
    wait_until(PROMPTLY, "every Write OpenFGA received has landed", || {
        let landed = env.fga.writes().iter().all(|w| w.answered_at.is_some());
        async move { landed }
    })
    .await;
    assert!(
        leads(&env, &new).await,
        "the relay that took over does not hold the leader record"
    );
    assert_applied_in_order(&env, &plan, &new).await;
}

/// Every row delivered, none dead; in OpenFGA's changelog each tuple's operations appear once
/// each, in id order (an operation applied out of order would be a grant of a held tuple or a
/// revoke of a missing one, which OpenFGA skips, and the sequence would differ), every row's
/// marker is there, and each tuple ends in its last row's state.
async fn assert_applied_in_order(env: &Env, plan: &[(usize, bool)], relay: &RelayProc) {
    assert_eq!(env.dead().await, 0, "relay log:\n{}", relay.logs());
    assert_eq!(env.pending().await, 0);
    let changelog = env.fga.changelog();
    for k in 0..TUPLES {
        let user = format!("user:t{k}");
        let applied: Vec<Op> = changelog
            .iter()
            .filter(|c| c.user == user && c.object == "document:mix")
            .map(|c| c.op)
            .collect();
        let rows: Vec<Op> = plan
            .iter()
            .filter(|(t, _)| *t == k)
            .map(|(_, grant)| if *grant { Op::Write } else { Op::Delete })
            .collect();
        assert_eq!(
            applied, rows,
            "tuple {k}: OpenFGA applied its operations otherwise than in id order"
        );
        assert_eq!(
            env.fga.has(&user, "viewer", "document:mix"),
            rows.last() == Some(&Op::Write),
            "tuple {k} does not end in its last row's state"
        );
    }
    let (user, relation, object) = LATE_TUPLE;
    let late: Vec<Op> = changelog
        .iter()
        .filter(|c| c.user == user && c.object == object)
        .map(|c| c.op)
        .collect();
    assert_eq!(
        late,
        [Op::Write, Op::Delete],
        "the revoke must be applied after the grant in flight at the handover"
    );
    assert!(!env.fga.has(user, relation, object));
    let markers: BTreeSet<String> = changelog
        .iter()
        .filter(|c| c.object == "document:marker" && c.op == Op::Write)
        .map(|c| c.user.clone())
        .collect();
    let missing: Vec<usize> = (0..ROWS)
        .filter(|j| !markers.contains(&format!("user:m{j}")))
        .collect();
    assert!(missing.is_empty(), "rows never applied: {missing:?}");
}

/// An upgrade: a 0.2.0 leader stopped while its Write is in flight hands over to this version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_2_0_leader_stopped_hands_over_to_this_version_in_order() {
    hand_over(&v020(), Path::new(BIN), End::Stop).await;
}

/// An upgrade where the old pod dies: a 0.2.0 leader killed while OpenFGA is still to apply its
/// Write. This version waits out the 0.2.0 leader's fence before it sends the tuple again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_2_0_leader_killed_with_a_write_in_flight_hands_over_to_this_version_in_order() {
    hand_over(&v020(), Path::new(BIN), End::Kill).await;
}

/// A rollback: this version, stopped while its Write is in flight, hands back to 0.2.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_version_stopped_hands_back_to_0_2_0_in_order() {
    hand_over(Path::new(BIN), &v020(), End::Stop).await;
}

/// A rollback where the new pod dies: 0.2.0 waits out this version's fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_version_killed_with_a_write_in_flight_hands_back_to_0_2_0_in_order() {
    hand_over(Path::new(BIN), &v020(), End::Kill).await;
}
