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
    let cases: [(&str, Option<&str>, &str); 10] = [
        ("FGA_STORE_ID", None, "FGA_STORE_ID"),
        // Long enough to overflow a clock once multiplied (three heartbeats make the shortest
        // lease): refused, not a panic.
        (
            "FGA_RELAY_HEARTBEAT_INTERVAL",
            Some("200000000000y"),
            "FGA_RELAY_HEARTBEAT_INTERVAL",
        ),
        (
            "FGA_RELAY_SWEEP_INTERVAL",
            Some("200000000000y"),
            "FGA_RELAY_SWEEP_INTERVAL",
        ),
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

/// A request timeout whose double (the idle limit of a delivering transaction, which PostgreSQL
/// takes in milliseconds in an int) would not fit is refused at start, with a lease long enough
/// for it: before, `check` passed it and every delivering connection would have failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_timeout_past_an_hour_exits_2() {
    let env = Env::start().await;
    let out = env
        .command(&["check"])
        .envs([
            ("FGA_RELAY_REQUEST_TIMEOUT", "20d"),
            ("FGA_RELAY_LEADER_LEASE", "60d"),
        ])
        .output()
        .unwrap();
    // `check` says it on stdout, among its other findings.
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr_of(&out)
    );
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("FGA_RELAY_REQUEST_TIMEOUT") && l.contains("longer than 1h")),
        "{said}"
    );
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

/// The three settings that moved under `FGA_RELAY_`: the new name is read, the former one still
/// is (with a warning), and with both set the new one wins (with a warning that the former is
/// ignored); a flag beats both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_settings_are_read_under_both_names_and_the_new_one_wins() {
    // The table, through `sql` (what it prints names the table it took).
    let sql = |vars: &[(&str, &str)], args: &[&str]| {
        let mut c = crate::common::relay::command(std::path::Path::new(BIN), &["sql"]);
        c.args(args).envs(vars.iter().copied());
        let out = c.output().unwrap();
        assert_success(&out, "sql");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr_of(&out),
        )
    };
    let creates = |s: &str, t: &str| s.contains(&format!("CREATE TABLE IF NOT EXISTS {t} ("));
    let (out, err) = sql(&[("FGA_RELAY_OUTBOX_TABLE", "new_outbox")], &[]);
    assert!(
        creates(&out, "new_outbox") && !err.contains("deprecated"),
        "{err}"
    );
    let (out, err) = sql(&[("FGA_OUTBOX_TABLE", "old_outbox")], &[]);
    assert!(creates(&out, "old_outbox"), "{out}");
    assert!(
        err.contains("FGA_OUTBOX_TABLE is deprecated") && err.contains("FGA_RELAY_OUTBOX_TABLE"),
        "{err}"
    );
    let both = [
        ("FGA_RELAY_OUTBOX_TABLE", "new_outbox"),
        ("FGA_OUTBOX_TABLE", "old_outbox"),
    ];
    let (out, err) = sql(&both, &[]);
    assert!(creates(&out, "new_outbox") && !out.contains("old_outbox"));
    assert!(
        err.contains("FGA_OUTBOX_TABLE is deprecated and ignored"),
        "{err}"
    );
    let (out, _) = sql(&both, &["--table", "flag_outbox"]);
    assert!(creates(&out, "flag_outbox"), "{out}");

    // Tuples per Write, by what OpenFGA received: a row of three tuples in Writes of one, or in
    // one Write of three.
    let env = Env::start().await;
    let tuples_per_write = |vars: Vec<(&'static str, &'static str)>, n: usize| {
        let env = &env;
        async move {
            let before = env.fga.writes().len();
            let tag = format!("document:{n}");
            env.insert(writes(&[
                tk("user:a", "viewer", &tag),
                tk("user:b", "viewer", &tag),
                tk("user:c", "viewer", &tag),
            ]))
            .await;
            let out = env
                .command(&["drain", "--timeout", "20s"])
                .envs(vars)
                .output()
                .unwrap();
            assert_success(&out, "drain");
            let sizes: Vec<usize> = env.fga.writes()[before..]
                .iter()
                .filter(|w| w.status == 200)
                .map(|w| crate::common::relay::write_tuple_keys(&w.body).len())
                .collect();
            (sizes, stderr_of(&out))
        }
    };
    let (sizes, err) = tuples_per_write(vec![("FGA_RELAY_MAX_TUPLES_PER_WRITE", "1")], 1).await;
    assert_eq!(sizes, [1, 1, 1], "{err}");
    assert!(!err.contains("deprecated"), "{err}");
    let (sizes, err) = tuples_per_write(vec![("FGA_MAX_TUPLES_PER_WRITE", "1")], 2).await;
    assert_eq!(sizes, [1, 1, 1], "{err}");
    assert!(
        err.contains("FGA_MAX_TUPLES_PER_WRITE is deprecated"),
        "{err}"
    );
    let (sizes, err) = tuples_per_write(
        vec![
            ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "3"),
            ("FGA_MAX_TUPLES_PER_WRITE", "1"),
        ],
        3,
    )
    .await;
    assert_eq!(sizes, [3], "{err}");
    assert!(
        err.contains("FGA_MAX_TUPLES_PER_WRITE is deprecated and ignored"),
        "{err}"
    );

    // A bad value is named by the name it came from.
    for (var, value) in [
        ("FGA_RELAY_CA_FILE", "/nonexistent/ca.pem"),
        ("FGA_CA_FILE", "/nonexistent/ca.pem"),
        ("FGA_RELAY_MAX_TUPLES_PER_WRITE", "0"),
        ("FGA_RELAY_OUTBOX_TABLE", "Not A Table"),
    ] {
        let out = env.command(&["drain"]).env(var, value).output().unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{var}: {err}");
        let line = err.lines().last().unwrap_or_default();
        assert!(
            line.contains(&format!("({var})")) || line.starts_with(&format!("fga-relay: {var} ")),
            "{var}: {err}"
        );
    }
}

/// Every variable the binary reads, from the source: `env = "..."` on its flags, and the former
/// names of the renamed settings.
fn every_setting() -> Vec<String> {
    let mut names = vec![
        "FGA_OUTBOX_TABLE".to_owned(),
        "FGA_CA_FILE".to_owned(),
        "FGA_MAX_TUPLES_PER_WRITE".to_owned(),
    ];
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for piece in text.split("env = \"").skip(1) {
                    if let Some(name) = piece.split('"').next() {
                        names.push(name.to_owned());
                    }
                }
            }
        }
    }
    names.sort();
    names.dedup();
    assert!(names.len() > 20, "the settings moved? {names:?}");
    names
}

/// A compose or Helm template leaves a variable it has no value for as "": that is unset, the
/// default, for every setting (durations, counts, addresses and the rest), and `run` delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_value_is_unset_for_every_setting() {
    let env = Env::start().await;
    // Those the test needs to reach its database and OpenFGA; the HTTP address's default port
    // may be taken on a machine running tests side by side.
    let kept = [
        "DATABASE_URL",
        "FGA_API_URL",
        "FGA_STORE_ID",
        "FGA_RELAY_HTTP_ADDR",
    ];
    let empty: Vec<(String, String)> = every_setting()
        .into_iter()
        .filter(|n| !kept.contains(&n.as_str()))
        .map(|n| (n, String::new()))
        .collect();
    assert!(empty.iter().any(|(n, _)| n == "FGA_RELAY_LINGER"));
    let mut c = env.command(&["run"]);
    c.envs(empty.iter().map(|(k, v)| (k, v)));
    let relay = crate::common::relay::RelayProc::spawn(c);
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
    assert!(!relay.logs().contains("deprecated"), "{}", relay.logs());
    // `migrate`, `status` and `sql` read their settings the same way.
    for args in [&["migrate"][..], &["status"], &["sql"]] {
        let mut c = env.command(args);
        c.envs(empty.iter().map(|(k, v)| (k, v)));
        assert_success(&c.output().unwrap(), args[0]);
    }
}
