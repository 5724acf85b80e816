//! Signals: SIGHUP rereads the settings' files and never kills the relay; a second SIGTERM during
//! the drain exits at once.

use crate::common::fga::{Fault, FaultRule, Fga, Route};
use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, RelayProc, accepted_writes, tk, wait_until, writes};
use crate::libpq::{PASSWORD, password_checked, percent_encode, write_private};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The directory of a test's secret files, named for the test.
fn secrets_dir(test: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("fga-relay-{test}-{}", std::process::id()))
}

/// A file of the test's own, mode 0600, in a directory named for the test (removed when the
/// test passes: [`remove_secrets`]).
fn secret_file(test: &str, name: &str, contents: &str) -> String {
    let dir = secrets_dir(test);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    write_private(&path, &format!("{contents}\n"), 0o600);
    path.display().to_string()
}

/// Removes the directory of `test`'s secret files (a failing test leaves it, to be looked at).
fn remove_secrets(test: &str) {
    let _ = std::fs::remove_dir_all(secrets_dir(test));
}

/// The preshared key rotated: OpenFGA takes only the new one once the file says it and the
/// relay got SIGHUP. The relay keeps running, sends the new key, and names the file it reread,
/// never a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_token_file_and_the_relay_keeps_delivering() {
    let accepted = Arc::new(Mutex::new("first-T0ken".to_owned()));
    let fga = {
        let accepted = accepted.clone();
        Fga::builder()
            .accept_bearer(move |t| *accepted.lock().unwrap() == t)
            .start()
    };
    let env = Env::with_fga(fga).await;
    let file = secret_file("sighup-token", "api-token", "first-T0ken");
    let mut relay = env.spawn_relay(&[("FGA_API_TOKEN_FILE", &file)]);
    relay.wait_for_log("delivering (leader)").await;
    let before = env
        .insert(writes(&[tk("user:before", "viewer", "document:1")]))
        .await;
    env.wait_delivered(before).await;

    *accepted.lock().unwrap() = "second-T0ken".to_owned();
    secret_file("sighup-token", "api-token", "second-T0ken");
    relay.signal(libc::SIGHUP);
    relay
        .wait_for_log("SIGHUP: reread the settings' files")
        .await;
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:2")]))
        .await;
    env.wait_delivered(after).await;
    assert!(relay.is_running());
    let last = accepted_writes(&env.fga).pop().unwrap();
    assert_eq!(last.authorization.as_deref(), Some("Bearer second-T0ken"));
    let logs = relay.logs();
    let line = logs.lines().find(|l| l.contains("SIGHUP: reread")).unwrap();
    assert!(
        line.contains("FGA_API_TOKEN_FILE") && line.contains("OpenFGA credentials"),
        "{line}"
    );
    assert!(!logs.contains("T0ken"), "a key in the log:\n{logs}");
    remove_secrets("sighup-token");
}

/// With nothing read from a file, SIGHUP is logged and ignored: the relay runs on and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_no_setting_from_a_file_is_ignored() {
    let env = Env::start().await;
    let mut relay = env.start_relay().await;
    relay.signal(libc::SIGHUP);
    relay.wait_for_log("signal ignored").await;
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    assert!(relay.is_running());
}

/// The database password rotated: after SIGHUP, new connections use the connection string the
/// file says now. The relay's sessions are ended, and it reconnects and delivers with the new
/// password (with the old one it could not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_database_url_file_for_new_connections() {
    let (env, port) = password_checked(Fga::start()).await;
    let url = |password: &str| {
        format!(
            "postgresql://relay:{}@127.0.0.1:{port}/postgres",
            percent_encode(password)
        )
    };
    let file = secret_file("sighup-url", "database-url", &url(PASSWORD));
    let mut command = env.command(&["run"]);
    command
        .env_remove("DATABASE_URL")
        .env("DATABASE_URL_FILE", &file);
    let mut relay = RelayProc::spawn(command);
    relay.wait_for_log("delivering (leader)").await;

    let admin = env.db.connect().await;
    admin
        .batch_execute("ALTER ROLE relay PASSWORD 'N3w-pass'")
        .await
        .unwrap();
    secret_file("sighup-url", "database-url", &url("N3w-pass"));
    relay.signal(libc::SIGHUP);
    relay.wait_for_log("the connection string").await;
    admin
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name LIKE 'fga-relay run%'",
        )
        .await
        .unwrap();
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    // A new leader first waits out the fence of the session it replaced (7 s here).
    wait_until(
        PROMPTLY * 3,
        "the row is delivered on new connections",
        || async { env.row(id).await.delivered },
    )
    .await;
    assert!(relay.is_running());
    let logs = relay.logs();
    assert!(
        !logs.contains("N3w-pass") && !logs.contains(PASSWORD),
        "{logs}"
    );
    remove_secrets("sighup-url");
}

/// A secret file found empty at SIGHUP (a rewrite that is not atomic, caught half-way) changes
/// nothing: the relay logs an error naming the files and keeps what it uses, so its Writes keep
/// their key (OpenFGA here refuses any other) and its new connections their server and password
/// (libpq's defaults would find no server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_an_empty_secret_file_keeps_what_is_in_use() {
    let fga = Fga::builder().accept_bearer(|t| t == "first-T0ken").start();
    let (env, port) = password_checked(fga).await;
    let url = format!(
        "postgresql://relay:{}@127.0.0.1:{port}/postgres",
        percent_encode(PASSWORD)
    );
    let url_file = secret_file("sighup-empty", "database-url", &url);
    let token_file = secret_file("sighup-empty", "api-token", "first-T0ken");
    let mut command = env.command(&["run"]);
    command
        .env_remove("DATABASE_URL")
        .env("DATABASE_URL_FILE", &url_file)
        .env("FGA_API_TOKEN_FILE", &token_file);
    let mut relay = RelayProc::spawn(command);
    relay.wait_for_log("delivering (leader)").await;

    for file in [&url_file, &token_file] {
        write_private(std::path::Path::new(file), "", 0o600);
    }
    relay.signal(libc::SIGHUP);
    relay
        .wait_for_log("SIGHUP: cannot reread the settings' files")
        .await;
    let logs = relay.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("SIGHUP: cannot reread"))
        .unwrap();
    assert!(
        line.contains("ERROR") && line.contains("is empty"),
        "{line}"
    );
    // New connections from here on: they must still go where the file said before.
    env.db
        .connect()
        .await
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name LIKE 'fga-relay run%'",
        )
        .await
        .unwrap();
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    // A new leader first waits out the fence of the session it replaced (7 s here).
    wait_until(
        PROMPTLY * 3,
        "the row is delivered with the key and connection string in use",
        || async { env.row(id).await.delivered },
    )
    .await;
    assert!(relay.is_running());
    let last = accepted_writes(&env.fga).pop().unwrap();
    assert_eq!(last.authorization.as_deref(), Some("Bearer first-T0ken"));
    assert!(
        env.fga.writes().iter().all(|w| w.authorization.is_some()),
        "a Write without the key"
    );
    remove_secrets("sighup-empty");
}

/// SIGTERM while a Write hangs: the relay waits for it (up to the request timeout, 20 s here). A
/// second SIGTERM exits at once, with status 143 and a line that says so; the row stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_drain_exits_at_once() {
    let env = Env::start().await;
    env.fga.push_fault(FaultRule::times(Fault::Hang, 1_000_000));
    let mut relay = env.spawn_relay(&[
        ("FGA_RELAY_REQUEST_TIMEOUT", "20s"),
        ("FGA_RELAY_LEADER_LEASE", "30s"),
    ]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    wait_until(PROMPTLY, "a Write in flight", || async {
        env.fga.write_count() >= 1
    })
    .await;
    relay.term();
    relay
        .wait_for_log("stopping: finishing the batch in flight")
        .await;
    assert!(relay.is_running(), "the drain waits for the Write");
    relay.term();
    let status = relay.wait_exit(PROMPTLY).await;
    assert_eq!(status.code(), Some(143), "{}", relay.logs());
    relay.wait_for_log("second signal: exiting at once").await;
    assert!(!env.row(id).await.delivered);
    // Not a timing: the Write was still in flight (20 s) when the relay exited.
    assert!(!relay.logs().contains("relay stopped"), "{}", relay.logs());
}

/// SIGTERM while a Write waits for OpenFGA to say whether its store exists (the first Write to a
/// store asks GetStore first, slowed to 1.5 s here): no Write leaves after the signal. What a
/// Write asks OpenFGA before it goes is asked before its last look at whether to go on, so the
/// look that follows the answer says stop; the relay exits 0 with the row pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_write_asks_whether_its_store_exists_sends_no_write_after_it() {
    let env = Env::start().await;
    let mut relay = env.start_relay().await;
    env.fga
        .push_fault(FaultRule::once(Fault::Delay(Duration::from_millis(1500))).on_get_store());
    let id = env
        .insert(writes(&[tk("user:t", "viewer", "document:t")]))
        .await;
    wait_until(
        PROMPTLY,
        "the Write's GetStore waits at the proxy",
        || async { env.fga.requests_of(Route::GetStore).contains(&0) },
    )
    .await;
    relay.term();
    let signalled = Instant::now();
    let status = relay.wait_exit(PROMPTLY).await;
    assert!(status.success(), "{status}; its log:\n{}", relay.logs());
    let after: Vec<_> = env
        .fga
        .write_heads()
        .into_iter()
        .filter(|(at, _)| *at > signalled)
        .collect();
    assert!(
        after.is_empty(),
        "{} Write(s) left after SIGTERM; relay log:\n{}",
        after.len(),
        relay.logs()
    );
    assert!(!env.row(id).await.delivered);
}
