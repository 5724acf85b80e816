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

/// Timings under which a Write the proxy lets OpenFGA apply `LATE` after it received it lands within
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

/// A lone relay's LISTEN connection, which holds leadership, freezes (bytes stop both ways,
/// nothing is closed, so the server keeps the session). The relay gives the session up within
/// two heartbeats and, reconnecting, ends it itself (it knows its pid and start): a row inserted
/// after the freeze is delivered while the frozen session's lease (a minute) still runs. Without
/// that, nothing could take leadership from the frozen session before its lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_relay_ends_its_own_previous_session_before_its_lease_runs_out() {
    let env = Env::with(tcp_db(&[]), crate::common::fga::Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let relay = env.spawn_relay(&[
        ("DATABASE_URL", url.as_str()),
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
        ("FGA_RELAY_LEADER_LEASE", "60s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let before = env
        .insert(writes(&[tk("user:before", "viewer", "document:e")]))
        .await;
    env.wait_delivered(before).await;
    // Only the session that leads: a pass caught with its pooled connections frozen could have
    // Writes in flight, and the relay would rightly wait out its own fence on retaking.
    assert_eq!(proxy.freeze_named("fga-relay run listener"), 1);
    let frozen = record(&env).await;
    // The row goes in once the relay has given the session up: before that, the leader still
    // delivers through its pooled connections (its lease runs), and the row would prove nothing.
    relay
        .wait_for_log("heartbeat got no answer: the connection is dead")
        .await;
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:e")]))
        .await;
    // Long enough for the lease to run out and the relay to recover without its own ending of
    // the session too: the assertion below then says which way it went.
    wait_until(
        Duration::from_secs(120),
        "a row inserted after the freeze is delivered",
        || async { env.row(after).await.delivered },
    )
    .await;
    let delivered_at: SystemTime = env
        .db
        .connect()
        .await
        .query_one(
            "SELECT processed_at FROM fga_outbox WHERE id = $1",
            &[&after],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        delivered_at < frozen.lease_until,
        "delivered at {delivered_at:?}, not before the frozen session's lease ran out \
         ({:?}): the relay did not end its own previous session",
        frozen.lease_until
    );
    relay
        .wait_for_log("ended this relay's previous session")
        .await;
}

/// A Write handed to the HTTP client whose connection is not up yet (the https front holds its
/// TLS handshake) when the leader is stopped (SIGSTOP). Continued once its lease has run out by
/// its own clock, but before the Write's deadline, the relay must not send it: the request body
/// asks the lease as the connection writes it. The Write never reaches OpenFGA (the front's
/// connection ends with no Write received); the relay delivers the row later, as leader again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stopped_before_its_body_left_does_not_reach_openfga_once_the_lease_ran_out() {
    use crate::common::tls::{HttpsFront, TempDir, TestCa};
    let env = Env::start().await;
    let ca = TestCa::new("fga-relay test CA");
    let front = HttpsFront::start(&ca.server_cert(&["127.0.0.1"]), env.fga.addr());
    let files = TempDir::new();
    let ca_file = files.file("ca.pem", ca.pem()).display().to_string();
    // The window ends at most two heartbeats (3 s) after the last renewal, and the relay is
    // continued just after that: 1.6 to 3.1 s after the Write was handed over, well within its
    // connection's deadline (4.4 s, the request timeout), so that it is the window, not a
    // deadline, that stops the Write.
    let margin = Duration::from_millis(1500);
    let relay = env.spawn_relay(&[
        ("FGA_API_URL", front.url().as_str()),
        ("FGA_CA_FILE", ca_file.as_str()),
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "1500ms"),
        ("FGA_RELAY_LEADER_LEASE", "4500ms"),
        ("FGA_RELAY_REQUEST_TIMEOUT", "4400ms"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    // A first row delivered: the store's existence is checked, so that the next Write asks
    // OpenFGA nothing before it goes (for the next 10 s).
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:w")]))
        .await;
    env.wait_delivered(first).await;
    let before = env.fga.write_count();
    // The connections so far go, so that the Write needs a new one.
    env.fga.set_refusing(true);
    env.fga.set_refusing(false);
    front.hold_next_handshake();
    let id = env
        .insert(writes(&[tk("user:held", "viewer", "document:w")]))
        .await;
    wait_until(PROMPTLY, "the Write waits for its connection", || {
        let (held, _) = front.held();
        async move { held == 1 }
    })
    .await;
    relay.signal(libc::SIGSTOP);
    let lease_until = record(&env).await.lease_until;
    // By its own clock, the relay's window ends a heartbeat before the lease PostgreSQL holds.
    wait_until(PROMPTLY, "the stopped relay's window has ended", || async {
        SystemTime::now() > lease_until - margin + Duration::from_millis(100)
    })
    .await;
    front.release();
    relay.signal(libc::SIGCONT);
    wait_until(PROMPTLY, "the held Write is given up or sent", || {
        let (_, ended) = front.held();
        let sent = env.fga.write_count();
        async move { ended == 1 || sent > before }
    })
    .await;
    assert_eq!(
        env.fga.write_count(),
        before,
        "a Write left after the lease ran out: {:?}",
        env.fga.writes().iter().map(|w| &w.body).collect::<Vec<_>>()
    );
    assert!(!env.fga.has("user:held", "viewer", "document:w"));
    env.wait_delivered(id).await;
}
