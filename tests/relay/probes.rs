//! The probes an orchestrator asks: `/livez` (the main loop makes progress; PostgreSQL is not
//! asked), `/readyz` (PostgreSQL and the LISTEN connection are up; `leader` or `standby`), and
//! `/healthz` (the LISTEN connection is up).

use crate::common::fga::{Fault, FaultRule, Fga, StoredTuple};
use crate::common::metrics::get;
use crate::common::pg::PROMPTLY;
use crate::common::proxy::{proxy_for, tcp_db, tcp_url};
use crate::common::relay::{Env, tk, wait_until, writes};
use crate::common::systemd::NotifySocket;
use std::time::{Duration, Instant};

/// The shortest `--liveness-timeout` the tests' settings allow is 5 s (a 2 s request timeout, its
/// 1 s margin, two 1 s heartbeats): a little above it.
const LIVENESS_TIMEOUT: &str = "6s";
const LIVENESS: Duration = Duration::from_secs(6);

/// Both relays' `/readyz` bodies, when both answer 200.
async fn roles(bases: &[&str]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for base in bases {
        let (status, body) = get(&format!("{base}/readyz")).await;
        if status != 200 {
            return None;
        }
        out.push(body.trim().to_owned());
    }
    out.sort();
    Some(out)
}

/// Samples each relay's probes through an outage longer than the liveness timeout: `/livez`
/// answers 200 throughout, `/readyz` and the path given 503.
async fn live_and_not_ready_through_an_outage(relays: &[(&str, &str)], logs: impl Fn() -> String) {
    let down = Instant::now();
    while down.elapsed() < LIVENESS + Duration::from_secs(2) {
        for (base, also_down) in relays {
            assert_eq!(
                get(&format!("{base}/livez")).await.0,
                200,
                "not live {:?} into a database outage; logs:\n{}",
                down.elapsed(),
                logs()
            );
            assert_eq!(get(&format!("{base}/readyz")).await.0, 503);
            assert_eq!(get(&format!("{base}{also_down}")).await.0, 503);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A leader and a standby say so on `/readyz`. PostgreSQL stopped for longer than the liveness
/// timeout: neither is ready, both stay live (the loop waits the outage out, and a restart would
/// not help); once it is back, both are ready again, one leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_leader_or_standby_and_a_database_outage_is_live_not_ready() {
    let env = Env::start().await;
    let vars = [("FGA_RELAY_LIVENESS_TIMEOUT", LIVENESS_TIMEOUT)];
    let (leader, base) = env.spawn_relay_with_endpoint(&vars).await;
    leader.wait_for_log("delivering (leader)").await;
    let (standby, standby_base) = env.spawn_relay_with_endpoint(&vars).await;
    standby.wait_for_log("standing by").await;
    assert_eq!(get(&format!("{base}/livez")).await, (200, "alive\n".into()));
    assert_eq!(
        get(&format!("{base}/readyz")).await,
        (200, "leader\n".into())
    );
    assert_eq!(
        get(&format!("{standby_base}/readyz")).await,
        (200, "standby\n".into())
    );

    env.db.stop_immediately();
    wait_until(PROMPTLY, "neither relay is ready", || async {
        get(&format!("{base}/readyz")).await.0 == 503
            && get(&format!("{standby_base}/readyz")).await.0 == 503
    })
    .await;
    live_and_not_ready_through_an_outage(
        &[(&base, "/healthz"), (&standby_base, "/healthz")],
        || leader.logs(),
    )
    .await;

    env.db.restart_after_stop();
    wait_until(PROMPTLY, "both ready again, one leading", || async {
        roles(&[&base, &standby_base]).await == Some(vec!["leader".into(), "standby".into()])
    })
    .await;
    let id = env
        .insert(writes(&[tk("user:after", "viewer", "document:1")]))
        .await;
    // The new leader first waits out the fence of the session the outage ended (7 s here).
    wait_until(PROMPTLY * 3, "a row delivered after the outage", || async {
        env.row(id).await.delivered
    })
    .await;
}

/// A relay started while PostgreSQL is down serves its probes at once: live throughout the wait
/// (longer than the liveness timeout), not ready, no metrics yet; ready and leading once
/// PostgreSQL is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_while_postgres_is_down_is_live_and_not_ready() {
    let env = Env::start().await;
    env.db.stop_immediately();
    let (relay, base) = env
        .spawn_relay_with_endpoint(&[("FGA_RELAY_LIVENESS_TIMEOUT", LIVENESS_TIMEOUT)])
        .await;
    relay.wait_for_log("waiting for PostgreSQL").await;
    live_and_not_ready_through_an_outage(&[(&base, "/metrics")], || relay.logs()).await;
    env.db.restart_after_stop();
    wait_until(PROMPTLY, "ready, leading", || async {
        get(&format!("{base}/readyz")).await == (200, "leader\n".into())
    })
    .await;
    assert_eq!(get(&format!("{base}/metrics")).await.0, 200);
}

/// The relay's pooled connections freeze (no byte passes, nothing is closed) while its LISTEN
/// connection stays healthy: the next pass waits forever for a claim. `/healthz` and `/readyz`
/// still say 200 (the LISTEN connection answers its heartbeats), `/livez` turns 503 once the
/// liveness timeout has passed without progress, the log says why, and systemd's watchdog
/// (`WatchdogSec=2s` here) is no longer fed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_main_loop_stuck_on_a_frozen_connection_is_not_live() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let systemd = NotifySocket::bind("stuck");
    let (relay, base) = env
        .spawn_relay_with_endpoint(&[
            ("DATABASE_URL", url.as_str()),
            ("FGA_RELAY_LIVENESS_TIMEOUT", LIVENESS_TIMEOUT),
            ("NOTIFY_SOCKET", systemd.path()),
            ("WATCHDOG_USEC", "2000000"),
        ])
        .await;
    relay.wait_for_log("delivering (leader)").await;
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:1")]))
        .await;
    env.wait_delivered(first).await;
    // Said once the Write has landed, so its connection is back in the pool: frozen below with
    // the others, rather than still held when the next read needs one, which the pool would
    // then open anew past the freeze.
    relay.wait_for_log("first rows delivered").await;
    // The pool's connections (the listener's application_name goes on with " listener").
    assert!(
        proxy.freeze_named("fga-relay run\0") >= 1,
        "a pooled connection"
    );
    let stuck = env
        .insert(writes(&[tk("user:stuck", "viewer", "document:2")]))
        .await;
    wait_until(LIVENESS * 3, "livez says 503", || async {
        get(&format!("{base}/livez")).await.0 == 503
    })
    .await;
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    assert_eq!(
        get(&format!("{base}/readyz")).await,
        (200, "leader\n".into())
    );
    assert!(!env.row(stuck).await.delivered);
    relay.wait_for_log("the main loop is stuck").await;
    // Fed while the loop made progress, not since: watched over two watchdog intervals.
    let stuck_seen = Instant::now();
    assert!(!systemd.times_of("READY=1").is_empty());
    assert!(!systemd.times_of("WATCHDOG=1").is_empty());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let late = systemd
        .times_of("WATCHDOG=1")
        .into_iter()
        .filter(|t| *t > stuck_seen + Duration::from_millis(500))
        .count();
    assert_eq!(late, 0, "the watchdog was fed while /livez said 503");
}

/// A Write whose answer came but whose mark waits on a pooled connection that froze, while the
/// LISTEN connection holds and the main loop turns: `/livez` turns 503 a liveness timeout after
/// that answer (with a margin for the probe), not up to twice that. A Write in flight keeps the
/// relay live only as of its last step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stuck_after_its_answer_is_found_stuck_a_liveness_timeout_later() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let proxy = proxy_for(&env).await;
    let url = tcp_url(proxy.port());
    let (relay, base) = env
        .spawn_relay_with_endpoint(&[
            ("DATABASE_URL", url.as_str()),
            ("FGA_RELAY_LIVENESS_TIMEOUT", LIVENESS_TIMEOUT),
        ])
        .await;
    relay.wait_for_log("delivering (leader)").await;
    let delay = Duration::from_secs(1);
    env.fga.push_fault(FaultRule::once(Fault::Delay(delay)));
    let id = env
        .insert(writes(&[tk("user:held", "viewer", "document:3")]))
        .await;
    wait_until(PROMPTLY, "the Write reached OpenFGA's proxy", || async {
        !env.fga.write_heads().is_empty()
    })
    .await;
    // The pool's connections, the Write's among them (it holds its rows' locks): its mark,
    // after OpenFGA's answer a second from now, waits for ever.
    assert!(
        proxy.freeze_named("fga-relay run\0") >= 1,
        "a pooled connection"
    );
    let answered = env.fga.write_heads()[0].0 + delay;
    wait_until(LIVENESS * 3, "livez says 503", || async {
        get(&format!("{base}/livez")).await.0 == 503
    })
    .await;
    let found = answered.elapsed();
    println!("found stuck {found:?} after the Write's answer");
    assert!(
        found < LIVENESS + Duration::from_secs(2),
        "found stuck {found:?} after the Write's answer, with a liveness timeout of {LIVENESS:?}; \
         relay log:\n{}",
        relay.logs()
    );
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    assert!(!env.row(id).await.delivered);
}

/// A liveness timeout shorter than a step the relay takes by design is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_liveness_timeout_below_the_longest_step_exits_2() {
    let env = Env::start().await;
    let out = env
        .command(&["run"])
        .env("FGA_RELAY_LIVENESS_TIMEOUT", "4s")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("FGA_RELAY_LIVENESS_TIMEOUT"), "{stderr}");
}

/// OpenFGA hung as a whole (every request: Writes, store lookups, reads) while a row is pending:
/// the relay, at the shortest liveness timeout its settings allow, stays live for more than twice
/// that timeout (it is waiting, bounded by its request timeout, not stuck), and delivers once
/// OpenFGA answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_waiting_on_a_hung_openfga_stays_live() {
    let env = Env::start().await;
    let (relay, base) = env
        .spawn_relay_with_endpoint(&[("FGA_RELAY_LIVENESS_TIMEOUT", "5s")])
        .await;
    relay.wait_for_log("delivering (leader)").await;
    env.fga.set_hanging(true);
    let id = env
        .insert(writes(&[tk("user:hung", "viewer", "document:h")]))
        .await;
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(12) {
        assert_eq!(
            get(&format!("{base}/livez")).await.0,
            200,
            "not live {:?} into OpenFGA hanging; relay log:\n{}",
            since.elapsed(),
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    env.fga.set_hanging(false);
    env.wait_delivered(id).await;
}

/// Settings under which one Write's steps, each a little under the request timeout, add up to
/// more than the shortest liveness timeout: a 5 s request timeout, its 1 s margin and two 1 s
/// heartbeats make 8 s.
const SLOW_STEPS: [(&str, &str); 4] = [
    ("FGA_RELAY_REQUEST_TIMEOUT", "5s"),
    ("FGA_RELAY_LEADER_LEASE", "8s"),
    ("FGA_RELAY_HEARTBEAT_INTERVAL", "1s"),
    ("FGA_RELAY_LIVENESS_TIMEOUT", "8s"),
];
const SLOW_LIVENESS: Duration = Duration::from_secs(8);
/// A little under the request timeout: each step answers, late.
const SLOW: Duration = Duration::from_millis(4_700);

/// Inserts one row while `faults` slow OpenFGA's answers down, and asks `/livez` every 100 ms
/// until the row is delivered, later than the liveness timeout: the relay, with only this
/// Write in flight, must stay live throughout, since each of its steps ends within a request
/// timeout.
async fn stays_live_through_slow_steps(env: &Env, faults: &[FaultRule]) {
    let (relay, base) = env.spawn_relay_with_endpoint(&SLOW_STEPS).await;
    relay.wait_for_log("delivering (leader)").await;
    for rule in faults {
        env.fga.push_fault(rule.clone());
    }
    let id = env
        .insert(writes(&[tk("user:slow", "viewer", "document:s")]))
        .await;
    let since = Instant::now();
    while !env.row(id).await.delivered {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "not delivered in 30 s; relay log:\n{}",
            relay.logs()
        );
        assert_eq!(
            get(&format!("{base}/livez")).await.0,
            200,
            "not live {:?} into a Write whose every step answered within the request timeout; \
             relay log:\n{}",
            since.elapsed(),
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        since.elapsed() > SLOW_LIVENESS,
        "delivered in {:?}: the steps did not outlast the liveness timeout",
        since.elapsed()
    );
}

/// The first Write to a store asks GetStore first: a slow answer to it, then a slow Write, are
/// two steps, each within the request timeout, and the relay stays live through both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_store_lookup_then_a_slow_write_keep_the_relay_live() {
    let env = Env::start().await;
    stays_live_through_slow_steps(
        &env,
        &[
            FaultRule::once(Fault::Delay(SLOW)).on_get_store(),
            FaultRule::once(Fault::Delay(SLOW)),
        ],
    )
    .await;
}

/// On OpenFGA before 1.10, a Write of a tuple it holds is answered "already exists", and the
/// relay reads the tuple back: a slow Write then a slow read-back are two steps, and the relay
/// stays live through both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_write_then_a_slow_read_back_keep_the_relay_live() {
    let env = Env::with_fga(Fga::builder().legacy().start()).await;
    env.fga
        .insert_tuple(StoredTuple::new("user:slow", "viewer", "document:s"));
    stays_live_through_slow_steps(
        &env,
        &[
            FaultRule::once(Fault::Delay(SLOW)),
            FaultRule::once(Fault::Delay(SLOW)).on_read(),
        ],
    )
    .await;
}
