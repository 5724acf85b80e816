//! Failover under the faults a lease has to survive: a take of leadership whose answer is lost
//! after it committed, and renewals whose answers come slowly. Both with real relay processes,
//! a real PostgreSQL behind a proxy that loses or slows its answers, and SIGSTOP / SIGKILL.

use crate::common::fga::{Fault, FaultRule, Op};
use crate::common::pg::PROMPTLY;
use crate::common::proxy::{proxy_for, tcp_db, tcp_url};
use crate::common::relay::{Env, deletes, insert_with, tk, wait_until, writes};
use std::time::{Duration, Instant, SystemTime};

/// Who leads: the leader record's holder, term (when it was taken), lease and session.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    holder: String,
    term: SystemTime,
    lease_until: SystemTime,
    backend_pid: i32,
}

async fn record(env: &Env) -> Record {
    let r = env
        .db
        .connect()
        .await
        .query_one(
            "SELECT holder, acquired_at, lease_until, backend_pid FROM fga_outbox_leader",
            &[],
        )
        .await
        .expect("the leader record");
    Record {
        holder: r.get(0),
        term: r.get(1),
        lease_until: r.get(2),
        backend_pid: r.get(3),
    }
}

/// Timings under which a Write the stand-in applies `LATE` after it received it lands within
/// the request timeout, and seconds after a relay that skipped the fence would send.
const VARS: [(&str, &str); 3] = [
    ("FGA_RELAY_REQUEST_TIMEOUT", "6s"),
    ("FGA_RELAY_LEADER_LEASE", "7s"),
    ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
];
const LATE: Duration = Duration::from_millis(5800);

/// Relay A led once, and its term ended with nothing of it in flight and no release (stopped,
/// its session ended). B leads, its Write of a tuple is applied late, and B is killed; a later
/// row deletes the tuple. A takes leadership, and that take commits but its answer is lost (the
/// proxy holds back everything the server sends on A's connection from A's take on): the
/// record now names A. A gives that session up and takes leadership again on a new one. Finding
/// its own name in the record must not let it skip B's fence: the delete lands after B's late
/// write, and OpenFGA ends without the tuple.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_whose_answer_was_lost_does_not_skip_the_fence_of_the_leader_it_replaced() {
    let env = Env::with(tcp_db(&[]), crate::common::fga::Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let a = env.spawn_relay(&[&VARS[..], &[("DATABASE_URL", url.as_str())]].concat());
    a.wait_for_log("delivering (leader)").await;
    let mut b = env.spawn_relay(&VARS);
    b.wait_for_log("standing by").await;

    // A's term ends without a release while nothing of it is in flight.
    a.signal(libc::SIGSTOP);
    let first = record(&env).await;
    env.db
        .connect()
        .await
        .execute("SELECT pg_terminate_backend($1)", &[&first.backend_pid])
        .await
        .unwrap();
    b.wait_for_log("delivering (leader)").await;
    a.signal(libc::SIGCONT);
    a.wait_for_log("standing by").await;

    // B's Write of the tuple is applied late; B dies meanwhile.
    env.fga.push_fault(FaultRule::once(Fault::Delay(LATE)));
    let client = env.db.connect().await;
    insert_with(&client, writes(&[tk("user:late", "viewer", "document:f")])).await;
    wait_until(Duration::from_secs(60), "B sends its Write", || {
        let n = env.fga.write_count();
        async move { n >= 1 }
    })
    .await;
    // A's next take carries its name (the holder parameter): its answer is lost.
    proxy.hold_answers_after(&format!("pid {} run ", a.pid()));
    b.kill9();
    let delete = insert_with(&client, deletes(&[tk("user:late", "viewer", "document:f")])).await;
    a.wait_for_log("cannot ask for leadership").await;
    wait_until(
        Duration::from_secs(60),
        "the delete is delivered",
        || async { env.row(delete).await.delivered },
    )
    .await;
    let received = env.fga.writes()[0].received_at;
    wait_until(PROMPTLY, "the late Write has landed", || async {
        Instant::now() > received + LATE + Duration::from_millis(200)
    })
    .await;
    let changes: Vec<Op> = env
        .fga
        .changelog()
        .into_iter()
        .filter(|c| c.user == "user:late")
        .map(|c| c.op)
        .collect();
    assert_eq!(
        changes,
        [Op::Write, Op::Delete],
        "the delete must be applied after B's late write"
    );
    assert!(!env.fga.has("user:late", "viewer", "document:f"));
    assert!(
        record(&env)
            .await
            .holder
            .contains(&format!("pid {} run ", a.pid()))
    );
}

/// Every answer on the leader's LISTEN connection (where it renews its lease) comes 0.35
/// heartbeats late: a renewal (two round trips, a prepare and its run) takes 0.7 heartbeats. Renewals a heartbeat after the previous answer would each leave later, and
/// two in a row would answer past the leader's send window (the lease less a heartbeat), so the
/// leader would drop its own leadership at its next Write and take it again. On a fixed cadence
/// they keep its window open: the same term delivers a row inserted after many slow renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_lease_renewals_do_not_close_the_send_window() {
    let env = Env::with(tcp_db(&[]), crate::common::fga::Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let relay = env.spawn_relay(&[
        ("DATABASE_URL", url.as_str()),
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
        ("FGA_RELAY_LEADER_LEASE", "3s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let before = env
        .insert(writes(&[tk("user:before", "viewer", "document:r")]))
        .await;
    env.wait_delivered(before).await;
    assert_eq!(
        proxy.delay_answers_named("fga-relay run listener", Duration::from_millis(350)),
        1
    );
    let term = record(&env).await;
    // Five renewals answered slowly (each moves the lease on).
    let mut seen = term.lease_until;
    for i in 0..5 {
        wait_until(PROMPTLY, &format!("renewal {i}"), || async {
            record(&env).await.lease_until > seen
        })
        .await;
        seen = record(&env).await.lease_until;
    }
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:r")]))
        .await;
    env.wait_delivered(after).await;
    assert_eq!(
        record(&env).await.term,
        term.term,
        "the leader kept its term: it never dropped leadership"
    );
    assert!(!relay.logs().contains("lease ran out"), "{}", relay.logs());
}
