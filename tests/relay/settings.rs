//! Bad settings stop the binary at once with exit status 2 and one line naming the setting;
//! secrets never reach a log line.

use crate::common::pg::TestDb;
use crate::common::relay::{BIN, Env, assert_success, tk, writes};
use std::process::Command;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The heartbeat, the lease and the request timeout must make the fence sound together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_that_cannot_make_the_fence_sound_exit_2_naming_them() {
    let env = Env::start().await;
    for (vars, named) in [
        (
            [
                ("FGA_RELAY_HEARTBEAT_INTERVAL", "10s"),
                ("FGA_RELAY_LEADER_LEASE", "15s"),
            ],
            ["FGA_RELAY_HEARTBEAT_INTERVAL", "FGA_RELAY_LEADER_LEASE"],
        ),
        (
            [
                ("FGA_RELAY_REQUEST_TIMEOUT", "20s"),
                ("FGA_RELAY_LEADER_LEASE", "15s"),
            ],
            ["FGA_RELAY_REQUEST_TIMEOUT", "FGA_RELAY_LEADER_LEASE"],
        ),
    ] {
        for command in ["run", "drain"] {
            let mut c = env.command(&[command]);
            c.envs(vars)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            let mut child = c.spawn().unwrap();
            // A relay that accepted these timings would run on: stop it and fail.
            let deadline = std::time::Instant::now() + crate::common::pg::PROMPTLY;
            while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let err = stderr_of(&out);
            assert_eq!(out.status.code(), Some(2), "{command} {vars:?}: {err}");
            for n in named {
                assert!(err.contains(n), "{command} {vars:?} names {n}: {err}");
            }
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_exit_2_naming_the_setting() {
    let env = Env::start().await;
    let cases: [(&str, Option<&str>, &str); 8] = [
        ("FGA_STORE_ID", None, "FGA_STORE_ID"),
        ("FGA_STORE_ID", Some("not-a-store"), "FGA_STORE_ID"),
        ("FGA_API_URL", Some("localhost:8080"), "FGA_API_URL"),
        (
            "FGA_RELAY_SWEEP_INTERVAL",
            Some("soon"),
            "FGA_RELAY_SWEEP_INTERVAL",
        ),
        ("FGA_RELAY_LINGER", Some("5s"), "FGA_RELAY_LINGER"),
        (
            "FGA_MAX_TUPLES_PER_WRITE",
            Some("0"),
            "FGA_MAX_TUPLES_PER_WRITE",
        ),
        ("DATABASE_URL", Some("postgres://[bad"), "DATABASE_URL"),
        (
            "FGA_OUTBOX_TABLE",
            Some("no such table"),
            "FGA_OUTBOX_TABLE",
        ),
    ];
    for (var, value, named) in cases {
        let mut c = env.command(&["run"]);
        match value {
            Some(v) => c.env(var, v),
            None => c.env_remove(var),
        };
        let out = c.output().unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{var}={value:?}: {err}");
        let line = err.lines().last().unwrap_or_default();
        assert!(line.contains(named), "{var}={value:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_says_to_run_migrate() {
    let db = TestDb::start();
    let out = Command::new(BIN)
        .args(["run"])
        .env("DATABASE_URL", db.url())
        .env("FGA_STORE_ID", "01HZZZZZZZZZZZZZZZZZZZZZZZ")
        .env("FGA_RELAY_HTTP_ADDR", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(
        err.contains("fga_outbox does not exist") && err.contains("fga-relay migrate"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_store_is_bad_configuration() {
    let env = Env::start().await;
    let out = env
        .command(&["run"])
        .env("FGA_STORE_ID", "01HZZZZZZZZZZZZZZZZZZZZZZZ")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("no store 01HZZZZZZZZZZZZZZZZZZZZZZZ"),
        "{}",
        stderr_of(&out)
    );
}

/// OpenFGA down at start is not bad configuration: the relay starts, and delivers once it is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openfga_down_at_start_is_not_bad_configuration() {
    let env = Env::start().await;
    env.fga.set_refusing(true);
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    relay.wait_for_log("write failed").await;
    env.fga.set_refusing(false);
    env.wait_delivered(id).await;
}

/// The startup line shows the effective configuration, with every secret redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_logs() {
    let env = Env::with_fga(
        crate::common::fga::Fga::builder()
            .preshared_key("s3cret-token")
            .start(),
    )
    .await;
    let client = env.db.connect().await;
    client
        .batch_execute("CREATE ROLE relay LOGIN PASSWORD 'pa55word' SUPERUSER")
        .await
        .unwrap();
    let url = format!(
        "{} user=relay password=pa55word",
        env.db.url().replace("user=postgres", "")
    );
    let relay = env.spawn_relay(&[("FGA_API_TOKEN", "s3cret-token"), ("DATABASE_URL", &url)]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    let logs = relay.logs();
    assert!(logs.contains("fga-relay starting"), "{logs}");
    assert!(logs.contains("user=relay"), "{logs}");
    assert!(!logs.contains("s3cret-token"), "{logs}");
    assert!(!logs.contains("pa55word"), "{logs}");
}

/// A relay started before its database (boot order, a restart) waits for it instead of exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_before_postgres_waits_for_it() {
    let env = Env::start().await;
    env.db.stop_immediately();
    let relay = env.spawn_relay(&[]);
    relay.wait_for_log("waiting for PostgreSQL").await;
    env.db.restart_after_stop();
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
}

/// Every form libpq takes a password in (URL user info, `%`-encoded, `?password=`, key=value
/// with spaces around `=`, quoted with a space inside) connects (the server checks the password)
/// and never puts it in any log line, at any level: the logs say where, not how.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_form_of_database_url_puts_its_password_in_a_log_line() {
    let (env, port) = crate::libpq::password_checked(crate::common::fga::Fga::start()).await;
    let admin = env.db.connect().await;
    let base = format!("host=127.0.0.1 port={port} user=relay dbname=postgres");
    // (DATABASE_URL, the password the server knows, what must never be logged)
    let forms: Vec<(String, &str, Vec<&str>)> = vec![
        (
            format!("postgresql://relay:urlSecret1@127.0.0.1:{port}/postgres"),
            "urlSecret1",
            vec!["urlSecret1"],
        ),
        (
            format!("postgres://relay:p%40ss%3Aw%2Frd%202@127.0.0.1:{port}/postgres"),
            "p@ss:w/rd 2",
            vec!["p%40ss%3Aw%2Frd%202", "p@ss:w/rd 2", "ss:w/rd", "w%2Frd"],
        ),
        (
            format!("postgresql://relay@127.0.0.1:{port}/postgres?password=querySecret3"),
            "querySecret3",
            vec!["querySecret3"],
        ),
        (
            format!("{base} password = kvSecret4"),
            "kvSecret4",
            vec!["kvSecret4"],
        ),
        (
            format!("{base} password='quoted Secret 5'"),
            "quoted Secret 5",
            vec!["quoted Secret 5", "Secret 5"],
        ),
    ];
    for (i, (url, password, secrets)) in forms.iter().enumerate() {
        admin
            .batch_execute(&format!("ALTER ROLE relay PASSWORD '{password}'"))
            .await
            .unwrap();
        let id = env
            .insert(writes(&[tk(&format!("user:f{i}"), "viewer", "document:1")]))
            .await;
        let out = env
            .command(&["drain", "--timeout", "20s"])
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        assert_success(&out, &format!("drain with form {i}"));
        assert!(env.row(id).await.delivered, "form {i}");
        let logs = format!(
            "{}{}",
            stderr_of(&out),
            String::from_utf8_lossy(&out.stdout)
        );
        for secret in secrets {
            assert!(!logs.contains(secret), "form {i}: {secret:?} logged");
        }
        assert!(
            logs.contains("user=relay"),
            "form {i}: where, not how:\n{logs}"
        );
    }
    // The long-running relay too, at trace, with the last form.
    let (url, _, secrets) = forms.last().unwrap();
    let relay = env.spawn_relay(&[("DATABASE_URL", url), ("RUST_LOG", "trace")]);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:run", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    let logs = relay.logs();
    for secret in secrets {
        assert!(!logs.contains(secret), "{secret:?} logged by run");
    }
}
