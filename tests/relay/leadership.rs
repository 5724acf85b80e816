//! Leadership and connections that heal themselves: a leader that is alive to PostgreSQL but
//! does nothing (every connection frozen, or the process stopped) is replaced within the lease;
//! a stopped leader that is continued sends nothing; every new leader waits until no Write of an
//! earlier one can land, however the earlier one let go; server-side timeouts meant for
//! applications do not break delivery; small liveness gaps (a writer's long transaction, rows
//! another session holds, `retry`, `drain` failing) do not stall or spin.

use crate::common::fga::{Fault, FaultRule, Fga, Op};
use crate::common::pg::{PROMPTLY, PgOptions, TestDb, count};
use crate::common::proxy::{proxy_for, tcp_db, tcp_url};
use crate::common::relay::{
    Env, RelayProc, accepted_writes, deletes, insert_viewers, insert_with, relay_sleeps, tk,
    wait_for_writes, wait_until, writes,
};
use std::time::{Duration, Instant};

/// The issue's acceptance deadline for delivery after a leader stops working.
const RECOVERY: Duration = Duration::from_secs(30);

/// Ends every session whose `application_name` is `name`, as an administrator would.
async fn end_sessions(env: &Env, name: &str) {
    env.db
        .connect()
        .await
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
}

/// Asserts that the relay given preshared key `key` sent no Write received after `since`.
fn assert_sent_nothing_after(fga: &Fga, key: &str, since: Instant) {
    let late: Vec<_> = writes_by(fga, key)
        .into_iter()
        .filter(|w| w.received_at > since)
        .collect();
    assert!(
        late.is_empty(),
        "the replaced leader sent {} Write(s) after it was stopped: {:?}",
        late.len(),
        late.iter().map(|w| &w.body).collect::<Vec<_>>()
    );
    // Not even begun: a Write whose body the lease check at the connection cut short still
    // opened a request.
    let bearer = format!("Bearer {key}");
    let begun = fga
        .write_heads()
        .into_iter()
        .filter(|(at, auth)| *at > since && auth.as_deref() == Some(bearer.as_str()))
        .count();
    assert_eq!(
        begun, 0,
        "the replaced leader began {begun} Write request(s) after it was stopped"
    );
}

/// [`assert_sent_nothing_after`], for a leader that had no Write in flight when it was stopped:
/// nor did it break one off before its head left (the client ends the connection the Write
/// would have gone on then, its own or a new one that carried nothing yet).
fn assert_began_nothing_after(fga: &Fga, key: &str, since: Instant) {
    assert_sent_nothing_after(fga, key, since);
    let bearer = format!("Bearer {key}");
    let broken = fga
        .connection_ends()
        .into_iter()
        .filter(|(at, owner)| *at > since && owner.as_deref().is_none_or(|o| o == bearer))
        .count();
    assert_eq!(
        broken, 0,
        "the replaced leader broke off {broken} request(s) after it was stopped"
    );
}

/// Waits until the relay given preshared key `key` has sent `n` Writes, then stops it (SIGSTOP).
async fn stop_after_writes(fga: &Fga, relay: &RelayProc, key: &str, n: usize) {
    wait_until(PROMPTLY, "the leader is in the middle of the page", || {
        let sent = writes_by(fga, key).len();
        async move { sent >= n }
    })
    .await;
    relay.signal(libc::SIGSTOP);
}

/// The Writes a relay sent, told apart by the preshared key it was given.
fn writes_by(fga: &Fga, key: &str) -> Vec<crate::common::fga::WriteRecord> {
    let bearer = format!("Bearer {key}");
    fga.writes()
        .into_iter()
        .filter(|w| w.authorization.as_deref() == Some(bearer.as_str()))
        .collect()
}

/// Every connection of a lone relay freezes (bytes stop both ways, nothing is closed): the
/// relay notices, ends its old session (which still holds leadership on the server), leads
/// again and delivers rows inserted after the freeze within 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_relay_whose_connections_all_freeze_delivers_again_within_30s() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let relay = env.spawn_relay(&[
        ("DATABASE_URL", url.as_str()),
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "5s"),
        ("FGA_RELAY_LEADER_LEASE", "15s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let before = env
        .insert(writes(&[tk("user:before", "viewer", "document:1")]))
        .await;
    env.wait_delivered(before).await;
    let frozen = proxy.freeze_open_connections();
    assert!(frozen >= 2, "the LISTEN connection and a pooled one");
    let t0 = Instant::now();
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:2")]))
        .await;
    wait_until(
        RECOVERY,
        "a row inserted after the freeze is delivered",
        || async { env.row(after).await.delivered },
    )
    .await;
    println!("delivered {:?} after every connection froze", t0.elapsed());
    assert!(env.fga.has("user:after", "viewer", "document:2"));
}

/// How many pooled connections of a relay (`application_name` exactly `fga-relay run`, the
/// LISTEN one's goes on with " listener") are open, and how many of them are not idle.
async fn idle_pooled(admin: &tokio_postgres::Client) -> (i64, i64) {
    let open = count(
        admin,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fga-relay run'",
        &[],
    )
    .await;
    let busy = count(
        admin,
        "SELECT count(*) FROM pg_stat_activity \
         WHERE application_name = 'fga-relay run' AND state <> 'idle'",
        &[],
    )
    .await;
    (open, busy)
}

/// A lone leader's LISTEN connection and the idle connections of its pool freeze together (a
/// silent path to the server, nothing closed) while it sleeps; new connections get through. The
/// stream stops by itself when the session is lost, so nothing is given up: only the pool's
/// clearing when the session is abandoned keeps the next term off the frozen connections,
/// which no timeout ends (the proxy's kernel acknowledges every byte, so neither keepalives nor
/// `tcp_user_timeout` fire, and the new session renews the lease meanwhile). Delivered within
/// 15 s, below every other way out: the 20 s `tcp_user_timeout`, the 60 s lease, the liveness
/// timeout's restart. Without the clearing, the new term's first read waits on a frozen pooled
/// connection until the process is restarted (75 s and counting when tried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_session_and_idle_pool_freeze_delivers_on_new_connections_within_15s() {
    const BOUND: Duration = Duration::from_secs(15);
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    // Ten Writes in flight at once, each on a pooled connection of its own: the pool holds
    // more connections than the probe at the next connect takes out of it (one).
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(300)),
        10,
    ));
    let client = env.db.connect().await;
    insert_viewers(&client, "b", "document:b", 10).await;
    let relay = env.spawn_relay(&[
        ("DATABASE_URL", url.as_str()),
        ("FGA_RELAY_LEADER_LEASE", "60s"),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    env.wait_drained().await;
    // Asleep (the wake lock held), every Write landed and no read under way: the pool's
    // connections are all back in it, idle, and no answer is on its way to the relay.
    let admin = env.db.connect().await;
    wait_until(PROMPTLY, "the relay sleeps with its pool idle", || async {
        let (open, busy) = idle_pooled(&admin).await;
        open >= 2 && busy == 0 && relay_sleeps(&admin, true).await
    })
    .await;
    assert!(proxy.freeze_named("fga-relay run\0") >= 2, "the idle pool");
    assert_eq!(proxy.freeze_named("fga-relay run listener"), 1);
    let t0 = Instant::now();
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:a")]))
        .await;
    wait_until(
        BOUND,
        "a row inserted after the freeze is delivered",
        || async { env.row(after).await.delivered },
    )
    .await;
    println!(
        "delivered {:?} after the session and the idle pool froze",
        t0.elapsed()
    );
    assert!(
        !relay.logs().contains("giving it up"),
        "the stream ended by itself: the clearing of a given-up stream played no part"
    );
    assert!(env.fga.has("user:after", "viewer", "document:a"));
}

/// A relay leading through a proxy (1 s heartbeat, 3 s lease, this connect timeout in
/// seconds), whose LISTEN connection the proxy then freezes, and every new one after it.
async fn leader_whose_new_sessions_freeze(
    connect_timeout: u32,
) -> (Env, crate::common::proxy::FreezingProxy, RelayProc) {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = format!(
        "{} connect_timeout={connect_timeout}",
        tcp_url(proxy.port())
    );
    let relay = env.spawn_relay(&[
        ("DATABASE_URL", url.as_str()),
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
        ("FGA_RELAY_LEADER_LEASE", "3s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    assert_eq!(proxy.freeze_named_from_now_on("fga-relay run listener"), 1);
    (env, proxy, relay)
}

/// A leader whose LISTEN connection freezes, and each new one after it (their TCP connect
/// succeeds, nothing after it passes: the connect timeout covers only the TCP connect): the
/// first try to open a session is given up after twice the connect timeout, a heartbeat and
/// the test notification's 2 s (7 s here), said with where and what to look for, and tried
/// again (each try's bound twice the last's); once connections get through again, the relay
/// leads and delivers. Without that bound its first try waits for ever, and nothing is
/// delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_new_sessions_never_open_tries_again_and_delivers_once_they_do() {
    let (env, proxy, relay) = leader_whose_new_sessions_freeze(2).await;
    let stalled = "did not finish opening the connection within 7s";
    wait_until(RECOVERY, "a try to open a session is given up", || async {
        relay.logs().contains(stalled)
    })
    .await;
    let logs = relay.logs();
    for said in [
        "host=127.0.0.1",
        "lets connections in but no bytes through",
        "raise connect_timeout",
    ] {
        assert!(logs.contains(said), "{said:?} not said; its log:\n{logs}");
    }
    proxy.let_new_connections_through();
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:a")]))
        .await;
    wait_until(
        RECOVERY,
        "a row inserted meanwhile is delivered",
        || async { env.row(after).await.delivered },
    )
    .await;
    assert!(env.fga.has("user:after", "viewer", "document:a"));
}

/// As above, but the relay is told to stop (SIGTERM) while it tries to open a session that
/// never opens (a 10 s connect timeout: a 23 s bound): it stops at once, exit 0. Without the
/// stop heard while it connects it waits out the bound first (and with no bound, for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_while_its_new_session_never_opens_stops_at_once() {
    let (_env, proxy, mut relay) = leader_whose_new_sessions_freeze(10).await;
    wait_until(RECOVERY, "the session is lost", || async {
        relay.logs().contains("LISTEN connection lost")
    })
    .await;
    wait_until(RECOVERY, "the next try is under way, frozen", || async {
        proxy.connections_named("fga-relay run listener") >= 2
    })
    .await;
    let t0 = Instant::now();
    relay.term();
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    let took = t0.elapsed();
    println!("exited {status} {took:?} after SIGTERM");
    let logs = relay.logs();
    assert!(status.success(), "{status}; its log:\n{logs}");
    assert!(
        took < Duration::from_secs(10),
        "stopped {took:?} after SIGTERM; its log:\n{logs}"
    );
}

/// `fga-relay drain` all of whose connections freeze while one of its Writes is in flight: the
/// Write's answer comes (OpenFGA is not behind the proxy), its mark waits on its frozen
/// connection, and the stream is given up one fence after the session is lost. The drain's next
/// statement (how many of its rows are left) goes to the pool before it reconnects; the pool is
/// cleared as the stream is given up, so that statement runs on a new connection, and the drain
/// leads again and delivers every row, exiting 0 within 30 s. Without that clearing it waits on
/// the frozen idle connection (one Write in flight at a time: the pool's other connection is
/// idle) forever, past its own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_connections_freeze_mid_write_delivers_every_row_on_new_ones() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    // A second per Write: time to freeze while one is in flight.
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_secs(1)),
        1_000_000,
    ));
    let client = env.db.connect().await;
    insert_viewers(&client, "d", "document:d", 10).await;
    let mut drain = env.command(&["drain", "--timeout", "60s"]);
    drain.envs([
        ("DATABASE_URL", url.as_str()),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "1"),
    ]);
    let mut drain = RelayProc::spawn(drain);
    wait_for_writes(&env.fga, 2, "the drain is in the middle of its rows").await;
    proxy.freeze_open_connections();
    env.fga.clear_faults();
    let t0 = Instant::now();
    let status = drain.wait_exit(RECOVERY).await;
    println!("drain exited {status} {:?} after the freeze", t0.elapsed());
    assert!(status.success(), "{status}; its log:\n{}", drain.logs());
    assert_eq!(env.pending().await, 0);
    assert!(
        drain.logs().contains("giving it up"),
        "the stream was stuck on a frozen connection, and given up"
    );
}

/// `fga-relay drain --timeout 10s` through `proxy`, on five rows whose first Write OpenFGA
/// answers 429 with `Retry-After: 3`: once the drain waits that out with nothing else to do (its
/// connections idle), `freeze` is called. Returns the drain's exit status, waited for up to 40 s
/// (its timeout, the few seconds its last count may take after it, and a wide margin), and its
/// log. A count of drain's own that waits on a frozen connection is not bounded by anything else
/// (the proxy's kernel acknowledges every byte: neither keepalives nor `tcp_user_timeout` fire),
/// so without its bounds the drain never exits.
async fn drain_frozen_while_it_waits(
    env: &Env,
    freeze: impl FnOnce(&crate::common::proxy::FreezingProxy),
) -> (std::process::ExitStatus, String) {
    let proxy = proxy_for(env).await;
    let url = tcp_url(proxy.port());
    env.fga.push_fault(FaultRule::once(Fault::rate_limited(3)));
    let client = env.db.connect().await;
    for i in 0..5 {
        insert_with(
            &client,
            writes(&[tk(&format!("user:n{i}"), "viewer", "document:n")]),
        )
        .await;
    }
    let mut drain = env.command(&["drain", "--timeout", "10s"]);
    drain.env("DATABASE_URL", &url);
    let mut drain = RelayProc::spawn(drain);
    // Said just before the wait, after the 429 (the stream that got it did work, so it did not
    // wait): nothing runs on the drain's connections until the wait ends.
    drain
        .wait_for_log("nothing to do now; looking again after the wait")
        .await;
    freeze(&proxy);
    let t0 = Instant::now();
    let status = drain.wait_exit(Duration::from_secs(40)).await;
    println!("drain exited {status} {:?} after the freeze", t0.elapsed());
    (status, drain.logs())
}

/// `drain`'s idle pooled connections freeze (no byte passes, nothing is closed) while it waits
/// out a `Retry-After`; its LISTEN connection and new connections get through. Its next count
/// of the rows left, on a frozen connection, is asked again on a new one after a heartbeat (the
/// pool's idle connections dropped), and the drain delivers every row and exits 0. Without the
/// count's bounds it waits on the frozen connection forever, past its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_idle_pool_freezes_while_it_waits_out_a_retry_after_delivers_on_new_ones() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let (status, logs) = drain_frozen_while_it_waits(&env, |proxy| {
        assert!(
            proxy.freeze_named("fga-relay drain\0") >= 1,
            "the idle pool"
        );
    })
    .await;
    assert!(status.success(), "{status}; its log:\n{logs}");
    assert_eq!(env.pending().await, 0);
    assert!(
        logs.contains("asking again on a new connection"),
        "the count waited on a frozen connection; its log:\n{logs}"
    );
    assert!(env.fga.has("user:n4", "viewer", "document:n"));
}

/// As above, but no connection of the pool's gets through any more, new ones included (their
/// TCP connect succeeds, nothing after it passes): the drain gives its count up at its timeout,
/// and its last count after a short grace, and exits 1 saying what happened and what to do.
/// Without the bounds it never exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_pool_freezes_for_good_while_it_waits_exits_1_by_its_timeout_saying_why() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let (status, logs) = drain_frozen_while_it_waits(&env, |proxy| {
        assert!(proxy.freeze_named_from_now_on("fga-relay drain\0") >= 1);
    })
    .await;
    assert_eq!(status.code(), Some(1), "{status}; its log:\n{logs}");
    for said in [
        "PostgreSQL did not answer",
        "stopped passing bytes",
        "run `fga-relay drain` again",
    ] {
        assert!(logs.contains(said), "{said:?} not said; its log:\n{logs}");
    }
    assert_eq!(env.pending().await, 5);
}

/// As above, but what freezes for good is the LISTEN connection, new ones included: the session
/// is lost while the drain waits, and its new one never opens (the connect timeout covers only
/// the TCP connect, which succeeds). The drain gives that up at its timeout, counts the rows left
/// on its pool, and exits 1 saying how many. Without the bound on the connect it never exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_new_session_never_opens_exits_1_by_its_timeout() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let (status, logs) = drain_frozen_while_it_waits(&env, |proxy| {
        assert_eq!(
            proxy.freeze_named_from_now_on("fga-relay drain listener"),
            1
        );
    })
    .await;
    assert_eq!(status.code(), Some(1), "{status}; its log:\n{logs}");
    for said in [
        "gave up connecting to PostgreSQL",
        "5 row(s) still pending after 10s",
    ] {
        assert!(logs.contains(said), "{said:?} not said; its log:\n{logs}");
    }
    assert_eq!(env.pending().await, 5);
}

/// `fga-relay drain --timeout 8s` whose pooled connections freeze for good in the middle of its
/// rows (new ones too: their TCP connect succeeds, nothing after it passes), while its LISTEN
/// connection stays healthy, so that its session is never lost. Its stream waits on a frozen
/// connection; told to stop at the timeout, it is given up twice the request timeout and 1 s
/// later (5 s), and the
/// drain exits 1 by its timeout, its last count's grace and a margin. Without that bound it waits
/// on the frozen connection for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_pool_freezes_for_good_mid_stream_exits_1_by_its_timeout() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(300)),
        1_000_000,
    ));
    let client = env.db.connect().await;
    insert_viewers(&client, "m", "document:m", 20).await;
    let mut drain = env.command(&["drain", "--timeout", "8s"]);
    drain.envs([
        ("DATABASE_URL", url.as_str()),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
    ]);
    let started = Instant::now();
    let mut drain = RelayProc::spawn(drain);
    wait_for_writes(&env.fga, 2, "the drain is in the middle of its rows").await;
    assert!(proxy.freeze_named_from_now_on("fga-relay drain\0") >= 1);
    let t0 = Instant::now();
    let status = drain.wait_exit(Duration::from_secs(40)).await;
    println!("drain exited {status} {:?} after the freeze", t0.elapsed());
    let logs = drain.logs();
    assert_eq!(status.code(), Some(1), "{status}; its log:\n{logs}");
    // Its timeout, the give-up's 5 s, its last count's 5 s, and a margin.
    assert!(
        started.elapsed() < Duration::from_secs(8 + 3 + 5 + 6),
        "exited {:?} after it started; its log:\n{logs}",
        started.elapsed()
    );
    assert!(
        logs.contains("did not stop when told to"),
        "the stream was not given up; its log:\n{logs}"
    );
    assert!(env.pending().await > 0);
    // A given-up stream's term ends without a clean release: the next leader waits for the
    // fence its renewals set, whatever became of the given-up stream's Writes.
    let (released, fenced): (bool, bool) = {
        let r = client
            .query_one(
                "SELECT released_at IS NOT NULL, not_before > clock_timestamp() \
                 FROM fga_outbox_leader",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(
        !released && fenced,
        "released {released}, the next leader fenced {fenced}; its log:\n{logs}"
    );
}

/// A leader stopped with SIGSTOP (its kernel keeps the TCP sessions, so PostgreSQL sees nothing
/// wrong) in the middle of a page, with one standby: the standby ends the stopped leader's
/// session once its lease has run out and delivers rows inserted after the stop within 30 s.
/// Continued, the old leader sends no Write at all. With `freeze`, the old leader's database
/// connections also go silent, so that on waking it cannot even see that it was replaced: only
/// its own clock can stop it.
async fn stopped_leader(freeze: bool) {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let slow = 1_000_000;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(200)),
        slow,
    ));
    let old = env.spawn_relay(&[
        ("DATABASE_URL", url.as_str()),
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "5s"),
        ("FGA_RELAY_LEADER_LEASE", "15s"),
        ("FGA_API_TOKEN", "old-leader"),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
    ]);
    old.wait_for_log("delivering (leader)").await;
    let standby = env.spawn_relay(&[
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "5s"),
        ("FGA_RELAY_LEADER_LEASE", "15s"),
        ("FGA_API_TOKEN", "standby"),
    ]);
    standby.wait_for_log("standing by").await;
    let client = env.db.connect().await;
    let page = insert_viewers(&client, "p", "document:p", 30).await;
    stop_after_writes(&env.fga, &old, "old-leader", 3).await;
    if freeze {
        proxy.freeze_open_connections();
    }
    let t0 = Instant::now();
    env.fga.clear_faults();
    let after = insert_with(&client, writes(&[tk("user:after", "viewer", "document:a")])).await;
    wait_until(
        RECOVERY,
        "a row inserted after the leader stopped is delivered",
        || async { env.row(after).await.delivered },
    )
    .await;
    println!("delivered {:?} after the leader stopped", t0.elapsed());
    wait_until(
        PROMPTLY,
        "the stopped leader's page is delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    // Counted from the moment it is continued: a Write whose bytes left just before the stop
    // took hold (several are in flight) may be read by the proxy a moment after it; that
    // one is the fence's to cover, not a Write of the continued process.
    let continued = Instant::now();
    old.signal(libc::SIGCONT);
    old.wait_for_log("standing by").await;
    let last = env
        .insert(writes(&[tk("user:last", "viewer", "document:a")]))
        .await;
    env.wait_delivered(last).await;
    assert_sent_nothing_after(&env.fga, "old-leader", continued);
    for id in page {
        assert!(env.row(id).await.delivered);
    }
    drop(standby);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_is_replaced_within_30s_and_sends_nothing_once_continued() {
    stopped_leader(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_cut_off_from_postgres_sends_nothing_once_continued() {
    stopped_leader(true).await;
}

/// Short timings, so that the fence (request timeout + 1 s after the end of the lease) is a few
/// seconds, and a Write that OpenFGA applies late (`LATE`, within the request timeout) lands well
/// after a standby could take over without it.
const FENCE_VARS: [(&str, &str); 3] = [
    ("FGA_RELAY_REQUEST_TIMEOUT", "4s"),
    ("FGA_RELAY_LEADER_LEASE", "5s"),
    ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
];
const LATE: Duration = Duration::from_millis(3800);

/// What happens to the next leader between the old leader's death and its first Write.
#[derive(Clone, Copy, PartialEq)]
enum Meanwhile {
    Nothing,
    /// The next leader gets SIGTERM while it waits; a third relay takes over.
    Sigterm,
    /// The next leader's LISTEN session is ended while it waits; it takes leadership again.
    SessionLost,
}

/// The proxy has OpenFGA apply the leader's Write of a tuple late; the leader is killed meanwhile,
/// and a later row deletes that tuple. Whoever delivers the delete must send it after the late
/// write landed: OpenFGA ends without the tuple.
async fn late_write_then(meanwhile: Meanwhile) {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::once(Fault::Delay(LATE)));
    let mut old = env.spawn_relay(&FENCE_VARS);
    old.wait_for_log("delivering (leader)").await;
    let mut next: Vec<RelayProc> = (0..if meanwhile == Meanwhile::Sigterm {
        2
    } else {
        1
    })
        .map(|_| env.spawn_relay(&FENCE_VARS))
        .collect();
    for r in &next {
        r.wait_for_log("standing by").await;
    }
    let client = env.db.connect().await;
    insert_with(&client, writes(&[tk("user:late", "viewer", "document:f")])).await;
    wait_for_writes(&env.fga, 1, "OpenFGA received the Write").await;
    old.kill9();
    let delete = insert_with(&client, deletes(&[tk("user:late", "viewer", "document:f")])).await;
    match meanwhile {
        Meanwhile::Nothing => {}
        Meanwhile::Sigterm => {
            let mut waiting = None;
            wait_until(PROMPTLY, "a standby takes over and waits", || {
                waiting = next
                    .iter()
                    .position(|r| r.logs().contains("did not let go cleanly"));
                let found = waiting.is_some();
                async move { found }
            })
            .await;
            let mut stopped = next.remove(waiting.unwrap());
            stopped.term();
            stopped.wait_exit(PROMPTLY).await;
        }
        Meanwhile::SessionLost => {
            next[0].wait_for_log("did not let go cleanly").await;
            end_sessions(&env, "fga-relay run listener").await;
            next[0].wait_for_log("LISTEN connection reconnected").await;
        }
    }
    wait_until(
        Duration::from_secs(60),
        "the delete is delivered",
        || async { env.row(delete).await.delivered },
    )
    .await;
    // The late Write lands LATE after it was received, whether anyone waits for it or not.
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
        "the delete must be applied after the late write"
    );
    assert!(!env.fga.has("user:late", "viewer", "document:f"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_applied_late_lands_before_the_next_leaders_operation_on_its_tuple() {
    late_write_then(Meanwhile::Nothing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_leader_stopped_while_it_waits_leaves_the_wait_to_the_one_after() {
    late_write_then(Meanwhile::Sigterm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_leader_that_loses_its_session_while_it_waits_still_waits() {
    late_write_then(Meanwhile::SessionLost).await;
}

/// A server whose `idle_in_transaction_session_timeout` and `statement_timeout` are 1 s, and an
/// OpenFGA that takes 1.5 s per Write: the page's claim transaction stays open across three
/// such Writes, and each row is sent exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_timeouts_of_one_second_do_not_make_a_slow_page_be_sent_again() {
    let db = TestDb::start_with(PgOptions {
        settings: vec![
            ("idle_in_transaction_session_timeout".into(), "1s".into()),
            ("statement_timeout".into(), "1s".into()),
        ],
        ..PgOptions::default()
    });
    let env = Env::with(db, Fga::start()).await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(1500)),
        3,
    ));
    let client = env.db.connect().await;
    insert_viewers(&client, "s", "document:s", 3).await;
    let _relay = env.spawn_relay(&[("FGA_MAX_TUPLES_PER_WRITE", "1")]);
    wait_until(
        Duration::from_secs(30),
        "every row is delivered",
        || async { env.pending().await == 0 },
    )
    .await;
    let sent = accepted_writes(&env.fga).len();
    assert_eq!(sent, 3, "each row is sent once, none again");
}

/// How many statements the relay's sessions ran, from pg_stat_statements (the test's own
/// statements mention pg_stat_statements and are left out).
async fn relay_statements(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat_statements%' \
               AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A writer's transaction that inserted into the outbox holds the wake lock (shared) for as
/// long as it stays open: the relay looks again every 1–2 s meanwhile, not every few
/// milliseconds, and runs at most 5 statements a second. The row is delivered once the
/// transaction commits. (`FGA_RELAY_TEST_WRITER_WINDOW=60` measures a whole minute from the
/// writer's insert on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_writer_transaction_does_not_make_the_relay_spin() {
    let window: u64 = std::env::var("FGA_RELAY_TEST_WRITER_WINDOW")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let (env, admin) = Env::with_statement_stats().await;
    // The writer inserts while the relay is busy (its Write is slow), so that the writer takes
    // the wake lock shared and skips NOTIFY, and keeps it while its transaction stays open. The
    // first row is there before the relay starts: its first pass, which runs without the wake
    // lock, sends it (a row found by the last look before sleeping would be sent with the lock
    // still held). The writer is connected and in its transaction beforehand, so that its
    // insert comes well within the slow Write.
    env.fga
        .push_fault(FaultRule::once(Fault::Delay(Duration::from_millis(1500))));
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:w")]))
        .await;
    let writer = env.db.connect().await;
    writer.batch_execute("BEGIN").await.unwrap();
    // One Write in flight at most: with it in flight, the relay's window is full, and it lets
    // the wake lock go (with room, it would hold it, and the writer would notify instead).
    let _relay = env.spawn_relay(&[("FGA_RELAY_MAX_IN_FLIGHT", "1")]);
    _relay.wait_for_log("delivering (leader)").await;
    wait_for_writes(&env.fga, 1, "the relay is busy").await;
    let id = insert_with(&writer, writes(&[tk("user:long", "viewer", "document:w")])).await;
    let shared: i64 = writer
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = 1718051121 AND mode = 'ShareLock' AND pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(shared, 1, "the writer holds the wake lock shared");
    env.wait_delivered(first).await;
    // The relay backs off over its first few seconds of looking; a shorter window than the
    // 60 s one measures the rate it settles at.
    if window < 60 {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let before = relay_statements(&admin).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(window)).await;
    let ran = relay_statements(&admin).await - before;
    let rate = ran as f64 / started.elapsed().as_secs_f64();
    println!(
        "{ran} statements in {:?} with a writer's transaction open: {rate:.2}/s",
        started.elapsed()
    );
    writer.batch_execute("COMMIT").await.unwrap();
    env.wait_delivered(id).await;
    assert!(rate <= 5.0, "{rate:.2} statements/s");
}

/// `fga-relay retry` wakes the relay: the row it sends back is delivered at once, not at the
/// next sweep (an hour away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_wakes_the_relay() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::once(Fault::status(
        400,
        "validation_error",
        "refused once",
    )));
    let relay = env.start_relay().await;
    let id = env
        .insert(writes(&[tk("user:retried", "viewer", "document:r")]))
        .await;
    wait_until(PROMPTLY, "the row is dead", || async {
        env.row(id).await.dead
    })
    .await;
    relay.wait_for_log("row dead-lettered").await;
    let out = env.command(&["retry", "--dead"]).output().unwrap();
    crate::common::relay::assert_success(&out, "retry");
    env.wait_delivered(id).await;
}

/// A row another session holds when the relay passes over it is looked at again soon: no
/// notification says when it is let go, and it must not wait for the sweep (an hour away here),
/// nor be counted as found by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_another_session_held_is_delivered_without_the_sweep() {
    let env = Env::start().await;
    let id = env
        .insert(writes(&[tk("user:held", "viewer", "document:h")]))
        .await;
    let holder = env.hold_row(id).await;
    let _relay = env.start_relay().await;
    let admin = env.db.connect().await;
    // The relay has passed over the row and gone to sleep: it holds the wake lock.
    wait_until(PROMPTLY, "the relay sleeps", || relay_sleeps(&admin, true)).await;
    assert!(!env.row(id).await.delivered);
    holder.batch_execute("COMMIT").await.unwrap();
    env.wait_delivered(id).await;
}

/// `drain` lets go of leadership when it fails (here: the table is renamed away while it
/// delivers, which no waiting fixes; a lost connection it waits out): the relay that comes next
/// need not wait out a lease (30 s here) it did not need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_go_of_leadership_when_it_fails() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(300)),
        1_000_000,
    ));
    let client = env.db.connect().await;
    insert_viewers(&client, "d", "document:d", 40).await;
    let lease = [
        ("FGA_RELAY_LEADER_LEASE", "30s"),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
    ];
    let mut drain = env.command(&["drain", "--timeout", "60s"]);
    drain.envs(lease).stderr(std::process::Stdio::piped());
    let drain = drain.spawn().unwrap();
    wait_for_writes(&env.fga, 2, "the drain delivers").await;
    client
        .batch_execute("ALTER TABLE fga_outbox RENAME TO fga_outbox_away")
        .await
        .unwrap();
    let out = drain.wait_with_output().unwrap();
    client
        .batch_execute("ALTER TABLE fga_outbox_away RENAME TO fga_outbox")
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.fga.clear_faults();
    let relay = env.spawn_relay(&lease);
    relay.wait_for_log("delivering (leader)").await;
    env.wait_drained().await;
    assert!(
        !relay.logs().contains("did not let go cleanly"),
        "{}",
        relay.logs()
    );
}

/// `drain` whose every ask for leadership fails (here a trigger refuses the leader's record, as
/// a maintenance rule or a missing privilege would) says why, with the cause, instead of waiting
/// for "another relay" that does not exist, and exits 1 by its timeout with the rows pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_cannot_ask_for_leadership_says_why() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    client
        .batch_execute(
            "CREATE FUNCTION refuse_leader() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'leader record frozen for maintenance'; END $$; \
             CREATE TRIGGER refuse_leader BEFORE INSERT OR UPDATE ON fga_outbox_leader \
             FOR EACH ROW EXECUTE FUNCTION refuse_leader();",
        )
        .await
        .unwrap();
    insert_viewers(&client, "d", "document:d", 3).await;
    let out = env.command(&["drain", "--timeout", "3s"]).output().unwrap();
    let logs = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}; its log:\n{logs}",
        out.status
    );
    for said in [
        "cannot ask for leadership",
        "leader record frozen for maintenance",
    ] {
        assert!(logs.contains(said), "{said:?} not said; its log:\n{logs}");
    }
    assert!(
        !logs.contains("another relay is delivering"),
        "no other relay runs; its log:\n{logs}"
    );
    assert_eq!(env.pending().await, 3);
}

/// `drain` while the leader is stopped (SIGSTOP: its session still open on the server, holding
/// the leadership lock) ends that session once its lease has run out, as a standby `run` does,
/// and delivers the rows after the fence, exiting 0. Without it, the drain waited for "another
/// relay" until its timeout and exited 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ends_a_stopped_leader_whose_lease_ran_out_and_delivers() {
    let env = Env::start().await;
    let old = env.spawn_relay(&FENCE_VARS);
    old.wait_for_log("delivering (leader)").await;
    old.signal(libc::SIGSTOP);
    let client = env.db.connect().await;
    insert_viewers(&client, "d", "document:d", 3).await;
    let out = env
        .command(&["drain", "--timeout", "25s"])
        .envs(FENCE_VARS)
        .output()
        .unwrap();
    old.signal(libc::SIGCONT);
    let logs = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}; its log:\n{logs}",
        out.status
    );
    assert!(
        logs.contains("ended the session holding leadership"),
        "its log:\n{logs}"
    );
    assert_eq!(env.pending().await, 0);
}

/// The OIDC token a Write needs is fetched before it, as a step of its own under its own request
/// timeout, and the Write's deadline starts after it: a token that takes 1.5 s and a Write that
/// takes 1.5 s more (each within the 2 s request timeout) deliver the row at the first try. The
/// fence needs no more: the Write's body leaves only while the lease holds, and its call (with the
/// retry after a 401 and the token fetch that needs) ends within one deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_fetch_and_the_write_after_it_each_run_under_a_deadline_of_their_own() {
    const SLOW: Duration = Duration::from_millis(1500);
    // Tokens live 1 s: the relay fetches a new one for every Write.
    let app = axum::Router::new().route(
        "/oauth/token",
        axum::routing::post(|| async {
            tokio::time::sleep(SLOW).await;
            axum::Json(serde_json::json!({"access_token": "token", "expires_in": 1}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let env = Env::with_fga(Fga::builder().accept_bearer(|t| t == "token").start()).await;
    let relay = env.spawn_relay(&[
        ("FGA_CLIENT_ID", "relay"),
        ("FGA_CLIENT_SECRET", "secret"),
        ("FGA_API_TOKEN_ISSUER", issuer.as_str()),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    env.fga.push_fault(FaultRule::once(Fault::Delay(SLOW)));
    let id = env
        .insert(writes(&[tk("user:deadline", "viewer", "document:t")]))
        .await;
    wait_until(Duration::from_secs(30), "the row is delivered", || async {
        env.row(id).await.delivered
    })
    .await;
    let row = env.row(id).await;
    assert_eq!(
        row.attempts,
        0,
        "the token's time was taken from the Write's deadline: {row:?}; relay log:\n{}",
        relay.logs()
    );
    server.abort();
}

/// A leader stopped (SIGSTOP) whose LISTEN connection also went silent, while its pooled
/// connections and OpenFGA still work. A standby replaces it once its lease has run out.
/// Continued, the old leader finds work at once (rows nobody has claimed), and nothing yet tells
/// it that its session is gone (its heartbeat waits a whole interval for an answer): only its
/// own clock, which says its lease ran out, keeps it from sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continued_leader_whose_lease_ran_out_sends_nothing_before_it_learns_it_was_replaced() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let timings = [
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
        ("FGA_RELAY_LEADER_LEASE", "3s"),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
    ];
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(300)),
        1_000_000,
    ));
    let old = env.spawn_relay(
        &[
            &timings[..],
            &[
                ("DATABASE_URL", url.as_str()),
                ("FGA_API_TOKEN", "old-leader"),
            ],
        ]
        .concat(),
    );
    old.wait_for_log("delivering (leader)").await;
    let standby = env.spawn_relay(&[&timings[..], &[("FGA_API_TOKEN", "standby")]].concat());
    standby.wait_for_log("standing by").await;
    let client = env.db.connect().await;
    let insert = |prefix: &'static str, n: usize| {
        let client = &client;
        async move {
            for i in 0..n {
                let t = tk(&format!("user:{prefix}{i}"), "viewer", "document:c");
                insert_with(client, writes(&[t])).await;
            }
        }
    };
    insert("p", 20).await;
    stop_after_writes(&env.fga, &old, "old-leader", 3).await;
    assert_eq!(proxy.freeze_named("fga-relay run listener"), 1);
    wait_until(
        RECOVERY,
        "the standby delivers the stopped leader's page",
        || async { env.pending().await == 0 },
    )
    .await;
    // Keep the standby busy with a page of its own, then add rows nobody has claimed.
    insert("b", 10).await;
    let busy = writes_by(&env.fga, "standby").len() + 1;
    wait_until(PROMPTLY, "the standby is in the middle of a page", || {
        let n = writes_by(&env.fga, "standby").len();
        async move { n >= busy }
    })
    .await;
    insert("q", 10).await;
    // Counted from the moment it is continued, as in the test above: a Write whose bytes left
    // just before the stop took hold may be read by the proxy a moment after it.
    let continued = Instant::now();
    old.signal(libc::SIGCONT);
    old.wait_for_log("standing by").await;
    env.wait_drained().await;
    assert_sent_nothing_after(&env.fga, "old-leader", continued);
}

/// A leader stopped (SIGSTOP) while one of its Writes waits for its rows' lock: PostgreSQL has
/// locked them, and the answer reaches the relay only once it is continued, after its lease ran
/// out and a standby took over. The Write is asked once more whether it may go, after its lock
/// and before its request: it opens no request at all (the request body's own lease check
/// would only cut it short once its head had reached OpenFGA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_while_it_locks_a_write_opens_no_request_once_continued() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let timings = [
        ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
        ("FGA_RELAY_LEADER_LEASE", "3s"),
    ];
    let old = env.spawn_relay(
        &[
            &timings[..],
            &[
                ("DATABASE_URL", url.as_str()),
                ("FGA_API_TOKEN", "old-leader"),
            ],
        ]
        .concat(),
    );
    old.wait_for_log("delivering (leader)").await;
    // Each answer to the old leader's pooled connections takes a second: time to see a lock
    // taken on the server and stop the relay before it hears of it.
    assert!(proxy.delay_answers_named("fga-relay run\0", Duration::from_secs(1)) >= 1);
    let standby = env.spawn_relay(&[&timings[..], &[("FGA_API_TOKEN", "standby")]].concat());
    standby.wait_for_log("standing by").await;
    // A grant and a revoke of one tuple, over and over: they are read together, and the read's
    // own lock cannot carry the first Write (it holds more than that Write's rows), so each
    // Write locks its rows on its own.
    let client = env.db.connect().await;
    let t = tk("user:locked", "viewer", "document:l");
    for i in 0..6 {
        let ops = if i % 2 == 0 {
            writes(std::slice::from_ref(&t))
        } else {
            deletes(std::slice::from_ref(&t))
        };
        insert_with(&client, ops).await;
    }
    wait_until(PROMPTLY, "PostgreSQL locked a Write's rows", || {
        let client = &client;
        async move {
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE application_name = 'fga-relay run' \
                       AND state = 'idle in transaction' \
                       AND query LIKE '%Locks the rows of one Write%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            n > 0
        }
    })
    .await;
    old.signal(libc::SIGSTOP);
    standby.wait_for_log("delivering (leader)").await;
    let continued = Instant::now();
    old.signal(libc::SIGCONT);
    old.wait_for_log("standing by").await;
    env.wait_drained().await;
    // No Write of the old leader's was in flight when it was stopped: its rows are all on one
    // tuple, and the one it was about to send had not left.
    assert_began_nothing_after(&env.fga, "old-leader", continued);
    // The standby delivered every row, in order: the tuple ends revoked.
    assert!(!env.fga.has("user:locked", "viewer", "document:l"));
}
