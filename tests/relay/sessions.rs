//! The relay's PostgreSQL sessions among other sessions and settings: a row another session
//! holds or corrects, a role whose transactions default to SERIALIZABLE, a session that fails as
//! soon as it is open, a pass longer than systemd's watchdog, `migrate` on a live outbox, a
//! `drain` that loses a connection, two schemas' relays on one channel. Each test failed before
//! its fix.

use crate::common::fga::{Fault, FaultRule, Fga};
use crate::common::pg::{PROMPTLY, count};
use crate::common::procs::cpu_time;
use crate::common::relay::{Env, accepted_writes, deletes, insert_with, tk, wait_until, writes};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Each tuple's operations as OpenFGA applied them, in order: "+" a write, "-" a delete.
fn applied_per_tuple(fga: &Fga) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for w in accepted_writes(fga) {
        for (p, sign) in [("writes", "+"), ("deletes", "-")] {
            for k in w.body[p]["tuple_keys"].as_array().into_iter().flatten() {
                let key = format!(
                    "{}#{}@{}",
                    k["object"].as_str().unwrap_or(""),
                    k["relation"].as_str().unwrap_or(""),
                    k["user"].as_str().unwrap_or("")
                );
                out.entry(key).or_default().push(sign.to_owned());
            }
        }
    }
    out
}

/// Inserts a row with no tuples (dead-lettered as soon as the relay reads it); returns its id.
async fn insert_malformed(client: &tokio_postgres::Client) -> i64 {
    crate::common::relay::insert_text(client, r#"{"writes": []}"#)
        .await
        .expect("insert a malformed row")
}

/// A malformed row that another session holds (an operator fixing it by hand, a script
/// correcting payloads) bars the later rows of its store, since which tuples it will touch once
/// corrected is not known, and no other store's: a row of another store is delivered at once.
/// Corrected into a revoke of a tuple that a later row grants, it goes first: OpenFGA ends
/// holding the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_malformed_row_bars_its_store_and_no_other() {
    a_held_malformed_row_bars_the_configured_store(r#"{"writes": []}"#).await;
}

/// As above, for a row naming the store `""`: the relay's reads count it among the rows naming
/// none (`coalesce(payload->>'store_id', '')`), and so does the bar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_malformed_row_naming_the_empty_store_bars_the_rows_naming_none() {
    a_held_malformed_row_bars_the_configured_store(r#"{"writes": [], "store_id": ""}"#).await;
}

/// A held row of `text`, which cannot be decoded, bars the configured store's later rows (a
/// grant of `user:anne viewer document:a`) until it is corrected into a revoke of that tuple,
/// and no other store's.
async fn a_held_malformed_row_bars_the_configured_store(text: &str) {
    let env = Env::start().await;
    let elsewhere = env.fga.add_store();
    let admin = env.db.connect().await;
    let bad = crate::common::relay::insert_text(&admin, text)
        .await
        .expect("insert a malformed row");
    let holder = env.hold_row(bad).await;
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("delivering (leader)").await;
    let grant = env
        .insert(writes(&[tk("user:anne", "viewer", "document:a")]))
        .await;
    let other = env
        .insert(crate::stores::in_store(
            writes(&[tk("user:other", "viewer", "document:o")]),
            &elsewhere,
        ))
        .await;
    wait_until(PROMPTLY, "another store's row is delivered", || async {
        env.row(other).await.delivered
    })
    .await;
    // The relay has looked at the held row twice since: a relay that let the grant go would
    // have sent it by then.
    relay
        .wait_for_log_count("not dead-lettered: another session holds the row", 2)
        .await;
    let overtaken = env.row(grant).await.delivered;
    holder
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&bad, &deletes(&[tk("user:anne", "viewer", "document:a")])],
        )
        .await
        .unwrap();
    holder.batch_execute("COMMIT").await.unwrap();
    env.wait_drained().await;
    assert!(
        !overtaken && env.fga.has("user:anne", "viewer", "document:a"),
        "the grant went before the corrected revoke (overtaken: {overtaken}); relay log:\n{}",
        relay.logs()
    );
    assert!(env.row(bad).await.delivered);
}

/// A held malformed row whose `store_id` is not a string (`123`, `true`, an object) names no
/// store the configured one could be: the relay's reads count it in the lane of that value's
/// text (`payload->>'store_id'`), and so does its bar. The configured store's rows, which are
/// not in that lane, are delivered while it is held. It used to bar them as a row naming none
/// does, for as long as the other session held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_malformed_row_naming_a_store_by_a_number_bars_none_of_the_configured_stores_rows() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let mut held = Vec::new();
    for text in [
        r#"{"writes": [], "store_id": 123}"#,
        r#"{"writes": [], "store_id": {"id": "x"}}"#,
    ] {
        let bad = crate::common::relay::insert_text(&admin, text)
            .await
            .expect("insert a malformed row");
        held.push((bad, env.hold_row(bad).await));
    }
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("delivering (leader)").await;
    let grant = env
        .insert(writes(&[tk("user:anne", "viewer", "document:a")]))
        .await;
    wait_until(
        PROMPTLY,
        "the configured store's row is delivered",
        || async { env.row(grant).await.delivered },
    )
    .await;
    for (bad, holder) in held {
        let state = env.row(bad).await;
        assert!(!state.delivered && !state.dead, "row {bad}: {state:?}");
        holder.batch_execute("ROLLBACK").await.unwrap();
        wait_until(PROMPTLY, "the malformed row is dead-lettered", || async {
            env.row(bad).await.dead
        })
        .await;
    }
    assert!(env.fga.has("user:anne", "viewer", "document:a"));
}

/// Each tuple's operations in id order, for the outbox `faults::fill` makes of `n` rows (row i
/// writes `user:u{i} viewer document:{i % 100}`; every tenth also deletes the tuple written
/// five rows before).
fn fill_order(n: i64) -> HashMap<String, Vec<String>> {
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..n {
        expected
            .entry(format!("document:{}#viewer@user:u{i}", i % 100))
            .or_default()
            .push("+".into());
        if i % 10 == 9 {
            expected
                .entry(format!("document:{}#viewer@user:u{}", (i - 5) % 100, i - 5))
                .or_default()
                .push("-".into());
        }
    }
    expected
}

/// `faults::fill`, and each tuple's operations in id order.
async fn fill(env: &Env, n: i64) -> HashMap<String, Vec<String>> {
    crate::faults::fill(env, n).await;
    fill_order(n)
}

/// Asserts that each tuple's applied operations, repeats of the same operation in a row
/// folded (at least once), are its operations in id order; returns the operations applied
/// beyond the outbox's own.
fn assert_order(fga: &Fga, expected: &HashMap<String, Vec<String>>) -> usize {
    let applied = applied_per_tuple(fga);
    let mut extra = 0;
    for (k, want) in expected {
        let got = applied.get(k).cloned().unwrap_or_default();
        extra += got.len().saturating_sub(want.len());
        let mut folded = got.clone();
        folded.dedup();
        assert_eq!(
            &folded, want,
            "tuple {k}: applied {got:?}, outbox order {want:?}"
        );
    }
    extra
}

/// The connection string with another user.
fn as_user(url: &str, user: &str) -> String {
    url.replace("user=postgres", &format!("user={user}"))
}

/// A role the relay connects as, with `settings` (ALTER ROLE … SET), superuser so that no
/// grant is in the way.
async fn role_with(env: &Env, name: &str, settings: &[&str]) -> String {
    let admin = env.db.connect().await;
    admin
        .batch_execute(&format!("CREATE ROLE {name} LOGIN SUPERUSER"))
        .await
        .unwrap();
    for s in settings {
        admin
            .batch_execute(&format!("ALTER ROLE {name} SET {s}"))
            .await
            .unwrap();
    }
    as_user(env.db.url(), name)
}

/// A role whose transactions default to SERIALIZABLE (some shops set it database-wide): a
/// drain of 2,000 rows with several Writes in flight ends within a minute (under a second
/// with the server's default isolation), in order, nothing dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_default_isolation_still_drains_in_order() {
    let env = Env::start().await;
    let url = role_with(
        &env,
        "relay_ser",
        &["default_transaction_isolation = 'serializable'"],
    )
    .await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(20)),
        1_000_000,
    ));
    let expected = fill(&env, 2000).await;
    let started = Instant::now();
    let relay = env.spawn_relay(&[("DATABASE_URL", &url), ("FGA_MAX_TUPLES_PER_WRITE", "10")]);
    let cpu0 = cpu_time(relay.pid());
    let drained = crate::common::relay::poll_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { env.pending().await == 0 },
    )
    .await;
    let took = started.elapsed();
    let left = env.pending().await;
    let cpu = cpu_time(relay.pid()) - cpu0;
    let logs = relay.logs();
    let serialization = logs.matches("could not serialize").count();
    println!(
        "serializable: {left} rows pending after {took:?}, cpu {cpu:?}, {} Writes, \
         {serialization} serialization failures logged",
        accepted_writes(&env.fga).len()
    );
    assert!(drained.is_some(), "{left} rows still pending after 60 s");
    assert_order(&env.fga, &expected);
    assert_eq!(env.dead().await, 0, "dead rows:\n{logs}");
    assert_eq!(serialization, 0, "serialization failures; log:\n{logs}");
}

/// A malformed row an operator is correcting (an UPDATE of its payload, not yet committed when
/// the relay reads the row) ends delivered with the corrected payload, not dead-lettered for
/// what it no longer says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_row_corrected_meanwhile_is_not_dead_lettered() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let bad = insert_malformed(&admin).await;
    let fixer = env.db.connect().await;
    fixer.batch_execute("BEGIN").await.unwrap();
    fixer
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&bad, &writes(&[tk("user:fixed", "viewer", "document:f")])],
        )
        .await
        .unwrap();
    let _other = env
        .insert(writes(&[tk("user:other", "viewer", "document:o")]))
        .await;
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("delivering (leader)").await;
    // The relay has read the committed (malformed) version, and found the fixer's lock on it.
    relay
        .wait_for_log("not dead-lettered: another session holds the row")
        .await;
    fixer.batch_execute("COMMIT").await.unwrap();
    wait_until(PROMPTLY, "the row is delivered or dead", || async {
        let r = env.row(bad).await;
        r.delivered || r.dead
    })
    .await;
    let r = env.row(bad).await;
    assert!(
        r.delivered && env.fga.has("user:fixed", "viewer", "document:f"),
        "the corrected row ended {r:?}; relay log:\n{}",
        relay.logs()
    );
}

/// A relay whose LISTEN session connects but then fails at every turn (here the role's
/// `search_path` changed under it, so the leader table is not found; a revoked grant or a
/// dropped table does the same) must back off between reconnects, not open a new
/// connection every few milliseconds and spin; and it delivers once the setting is undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_fails_after_connecting_is_not_reconnected_in_a_busy_loop() {
    let env = Env::start().await;
    let url = role_with(&env, "relay_sp", &[]).await;
    let relay = env.spawn_relay(&[("DATABASE_URL", &url)]);
    relay.wait_for_log("delivering (leader)").await;
    let admin = env.db.connect().await;
    admin
        .batch_execute(
            "ALTER ROLE relay_sp SET search_path = nowhere; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'relay_sp'",
        )
        .await
        .unwrap();
    let id = env
        .insert(writes(&[tk("user:x", "viewer", "document:x")]))
        .await;
    relay.wait_for_log("cannot ask for leadership").await;
    let sessions = "SELECT sessions FROM pg_stat_database WHERE datname = current_database()";
    let (cpu0, s0) = (cpu_time(relay.pid()), count(&admin, sessions, &[]).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu = cpu_time(relay.pid()) - cpu0;
    let opened = count(&admin, sessions, &[]).await - s0;
    println!("in 10 s: relay cpu {cpu:?}, {opened} sessions opened");
    admin
        .batch_execute("ALTER ROLE relay_sp RESET search_path")
        .await
        .unwrap();
    env.wait_delivered(id).await;
    assert!(
        opened < 50 && cpu < Duration::from_secs(1),
        "{opened} sessions opened and {cpu:?} of CPU in 10 s; log tail:\n{}",
        relay
            .logs()
            .lines()
            .rev()
            .take(6)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Under systemd (`WatchdogSec=`, 30 s in the shipped unit), a pass that takes longer than the
/// watchdog and the liveness timeout (a backlog behind a slow OpenFGA) must still feed the
/// watchdog: otherwise systemd kills the relay with SIGABRT, and again after each restart, in
/// the middle of the very backlog it is working through. Each Write answered is progress. Here
/// WatchdogSec=4s, a liveness timeout of 6 s, and a pass of 30 Writes of 500 ms, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_longer_than_the_systemd_watchdog_still_feeds_it() {
    let env = Env::start().await;
    let socket = crate::common::systemd::NotifySocket::bind("wd");
    // WatchdogSec=4s.
    let watchdog = Duration::from_secs(4);
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(500)),
        1_000_000,
    ));
    fill(&env, 30).await;
    let relay = env.spawn_relay(&[
        ("NOTIFY_SOCKET", socket.path()),
        ("WATCHDOG_USEC", &watchdog.as_micros().to_string()),
        ("FGA_MAX_TUPLES_PER_WRITE", "1"),
        ("FGA_RELAY_MAX_IN_FLIGHT", "1"),
        ("FGA_RELAY_LIVENESS_TIMEOUT", "6s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    wait_until(PROMPTLY, "Writes flow", || async {
        accepted_writes(&env.fga).len() >= 2
    })
    .await;
    let started = Instant::now();
    wait_until(Duration::from_secs(60), "drained", || async {
        env.pending().await == 0
    })
    .await;
    // Until the drain ended: a watchdog no longer fed is a gap to then.
    let mut fed = socket.times_of("WATCHDOG=1");
    fed.push(Instant::now());
    let during: Vec<Duration> = fed
        .windows(2)
        .filter(|w| w[1] > started)
        .map(|w| w[1] - w[0])
        .collect();
    let longest = during.iter().max().copied().unwrap_or_default();
    println!(
        "{} watchdog feeds; longest gap during a {:?} drain: {longest:?}",
        fed.len() - 1,
        started.elapsed()
    );
    assert!(
        longest < watchdog,
        "the watchdog went unfed for {longest:?} (WatchdogSec {watchdog:?}): systemd would \
         have killed the relay"
    );
}

/// `fga-relay migrate` (idempotent, run by a deploy while the old relay still runs) against a
/// live outbox with a slow OpenFGA (5 s a Write): an application's INSERT into the outbox
/// meanwhile should not wait for the relay's Write in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_on_a_live_outbox_does_not_stall_writers_for_a_write_in_flight() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(5000)),
        1_000_000,
    ));
    let relay = env.spawn_relay(&[
        ("FGA_RELAY_REQUEST_TIMEOUT", "8s"),
        ("FGA_RELAY_LEADER_LEASE", "12s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let first = env
        .insert(writes(&[tk("user:first", "viewer", "document:m")]))
        .await;
    wait_until(PROMPTLY, "a Write in flight", || async {
        env.fga.write_count() >= 1
    })
    .await;
    let mut command = env.command(&["migrate"]);
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let migrate = tokio::task::spawn_blocking(move || command.status());
    let admin = env.db.connect().await;
    wait_until(PROMPTLY, "migrate has run, or waits for a lock", || async {
        let queued: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'fga-relay migrate' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        queued > 0 || migrate.is_finished()
    })
    .await;
    let writer = env.db.connect().await;
    insert_with(&writer, writes(&[tk("user:app", "viewer", "document:m2")])).await;
    // Not a timing: the INSERT returned while the relay's Write (5 s) was still in flight, its
    // row not yet marked. Queued behind migrate's lock, it returns only after that Write's
    // transaction ends.
    let first_pending_then = !env.row(first).await.delivered;
    let status = migrate.await.unwrap().unwrap();
    env.wait_delivered(first).await;
    assert!(status.success());
    assert!(
        first_pending_then,
        "an application INSERT waited behind migrate, behind the relay's Write in flight; \
         relay log:\n{}",
        relay.logs()
    );
}

/// `fga-relay drain --timeout 60s` whose pooled backend is ended once mid-way (a failover, an
/// operator's pg_terminate_backend): it goes on and delivers every row, exiting 0, rather
/// than giving up at the first lost connection long before its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_survives_one_lost_pooled_connection() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(
        Fault::Delay(Duration::from_millis(200)),
        1_000_000,
    ));
    let expected = fill(&env, 300).await;
    let drain = env
        .command(&["drain", "--timeout", "60s"])
        .env("FGA_MAX_TUPLES_PER_WRITE", "3")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPTLY, "Writes flow", || async {
        accepted_writes(&env.fga).len() >= 20
    })
    .await;
    let admin = env.db.connect().await;
    let ended = count(
        &admin,
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'fga-relay drain' LIMIT 1) t",
        &[],
    )
    .await;
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || drain.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "ended {ended}; drain exited {:?} after {:?} more, {} pending",
        out.status,
        started.elapsed(),
        env.pending().await
    );
    assert!(
        out.status.success() && env.pending().await == 0,
        "drain exited {:?} with {} rows pending; its log tail:\n{}",
        out.status,
        env.pending().await,
        stderr.lines().rev().take(8).collect::<Vec<_>>().join("\n")
    );
    assert_order(&env.fga, &expected);
}

/// Two relays on one database, each on the outbox of its own schema (chosen by its role's
/// `search_path`), each with its own OpenFGA: each delivers its own rows only, one's writers do
/// not wake the other, and their metrics say which table they are about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_two_schemas_of_one_database_keep_apart() {
    let env = Env::start().await;
    let fga_b = Fga::start();
    let admin = env.db.connect().await;
    admin.batch_execute("CREATE SCHEMA b").await.unwrap();
    let url_b = role_with(&env, "relay_b", &["search_path = b"]).await;
    let out = env
        .command(&["migrate"])
        .env("DATABASE_URL", &url_b)
        .output()
        .unwrap();
    crate::common::relay::assert_success(&out, "migrate b");
    let relay_a = env.spawn_relay(&[("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0")]);
    relay_a.wait_for_log("delivering (leader)").await;
    let relay_b = env.spawn_relay(&[
        ("DATABASE_URL", &url_b),
        ("FGA_API_URL", &fga_b.url()),
        ("FGA_STORE_ID", fga_b.store_id()),
        ("FGA_RELAY_HTTP_ADDR", "127.0.0.1:0"),
    ]);
    relay_b.wait_for_log("delivering (leader)").await;
    let base_a = relay_a.endpoint().await;
    let base_b = relay_b.endpoint().await;
    let notified = |m: &HashMap<String, f64>| {
        m.iter()
            .filter(|(k, _)| k.starts_with("fga_relay_notifications"))
            .map(|(_, v)| *v)
            .sum::<f64>()
    };
    let a0 = notified(&crate::common::metrics::scrape(&base_a).await);
    for i in 0..20 {
        admin
            .execute(
                "INSERT INTO b.fga_outbox (payload) VALUES ($1)",
                &[&writes(&[tk(
                    &format!("user:b{i}"),
                    "viewer",
                    "document:b",
                )])],
            )
            .await
            .unwrap();
        let want = i + 1;
        wait_until(PROMPTLY, "b's row delivered", || async {
            fga_b.tuples().len() == want
        })
        .await;
    }
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:a")]))
        .await;
    env.wait_delivered(id).await;
    let a1 = notified(&crate::common::metrics::scrape(&base_a).await);
    let b1 = notified(&crate::common::metrics::scrape(&base_b).await);
    println!(
        "relay a woken {} times by 1 row of its own and 20 of b's; b {b1}",
        a1 - a0
    );
    assert_eq!(env.fga.tuples().len(), 1, "a delivered only its own row");
    assert_eq!(fga_b.tuples().len(), 20);
    // Their metrics tell the two outboxes apart: every series names its table, schema first.
    for (base, table) in [(&base_a, "public.fga_outbox"), (&base_b, "b.fga_outbox")] {
        let text = crate::common::metrics::scrape_text(base).await;
        assert_eq!(
            crate::common::metrics::tables(&text),
            [table.to_owned()].into(),
            "{text}"
        );
    }
    assert!(
        a1 - a0 <= 2.0,
        "relay a woken {} times by b's rows",
        a1 - a0
    );
}
