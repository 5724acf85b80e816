//! libpq's environment (`PGHOST`, `PGPORT`, ...) and password file fill what `DATABASE_URL`
//! leaves out and stand alone without it, in libpq's order, against a server that checks
//! passwords; no password reaches a log line.

use crate::common::fga::Fga;
use crate::common::pg::{PgOptions, TestDb};
use crate::common::relay::{Env, tk, wait_until, writes};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

pub(crate) const PASSWORD: &str = "pa:ss\\Word7";

/// A cluster that checks passwords on TCP, with a role `relay` whose password is [`PASSWORD`].
pub(crate) async fn password_checked(fga: Fga) -> (Env, u16) {
    let db = TestDb::start_with(PgOptions {
        tcp: true,
        hba: vec![
            "local all all trust".to_owned(),
            "host all all 127.0.0.1/32 scram-sha-256".to_owned(),
        ],
        ..PgOptions::default()
    });
    let port = db.tcp_port().expect("a TCP port");
    let env = Env::with(db, fga).await;
    env.db
        .connect()
        .await
        .batch_execute(&format!(
            "CREATE ROLE relay LOGIN SUPERUSER PASSWORD '{}'",
            PASSWORD.replace('\'', "''")
        ))
        .await
        .unwrap();
    (env, port)
}

/// Runs `drain` without the harness's `DATABASE_URL`, with `vars` instead, at trace; returns
/// its exit status and logs, which must not hold any of `secrets`.
pub(crate) fn drain_without_url(
    env: &Env,
    vars: &[(&str, &str)],
    secrets: &[&str],
) -> (std::process::ExitStatus, String) {
    let mut c = env.command(&["drain", "--timeout", "20s"]);
    c.env_remove("DATABASE_URL").env("RUST_LOG", "trace");
    c.envs(vars.iter().copied());
    let out = c.output().unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    for secret in secrets {
        assert!(!logs.contains(secret), "{secret:?} in a log line:\n{logs}");
    }
    (out.status, logs)
}

/// Runs `drain` with `DATABASE_URL` (None: unset) and `vars`; returns whether it delivered a
/// fresh row, and its logs.
async fn drain(env: &Env, url: Option<&str>, vars: &[(&str, &str)]) -> (bool, String) {
    let id = env
        .insert(writes(&[tk("user:x", "viewer", "document:1")]))
        .await;
    let mut all: Vec<(&str, &str)> = vars.to_vec();
    if let Some(url) = url {
        all.push(("DATABASE_URL", url));
    }
    let (status, logs) = drain_without_url(env, &all, &[PASSWORD, "wrong-pw"]);
    let delivered = status.success() && env.row(id).await.delivered;
    (delivered, logs)
}

pub(crate) fn write_private(path: &Path, contents: &str, mode: u32) {
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_libpq_environment_stands_alone_and_fills_what_the_url_leaves_out() {
    let (env, port) = password_checked(Fga::start()).await;
    let port_s = port.to_string();
    let all = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port_s.as_str()),
        ("PGUSER", "relay"),
        ("PGPASSWORD", PASSWORD),
        ("PGDATABASE", "postgres"),
        ("PGCONNECT_TIMEOUT", "10"),
    ];
    // Alone, without DATABASE_URL.
    let (ok, logs) = drain(&env, None, &all).await;
    assert!(ok, "the environment alone:\n{logs}");
    assert!(
        logs.contains(&format!(
            "host=127.0.0.1 port={port} dbname=postgres user=relay"
        )),
        "the logs say where:\n{logs}"
    );
    // Each variable is read: changing it alone changes the outcome.
    for (var, value, why) in [
        ("PGHOST", "127.0.0.2", "another host"),
        ("PGPORT", "1", "another port"),
        ("PGUSER", "nobody", "another user"),
        ("PGPASSWORD", "wrong-pw", "another password"),
        ("PGDATABASE", "template0", "another database"),
        ("PGSSLMODE", "require", "TLS the server does not offer"),
        (
            "PGSSLROOTCERT",
            "/nonexistent/root.crt",
            "roots that cannot be read",
        ),
        ("PGCONNECT_TIMEOUT", "soon", "not a timeout"),
    ] {
        let vars: Vec<(&str, &str)> = all
            .iter()
            .copied()
            .filter(|(k, _)| *k != var)
            .chain(std::iter::once((var, value)))
            .collect();
        let (ok, logs) = drain(&env, None, &vars).await;
        assert!(!ok, "{var}={value} ({why}) was not read:\n{logs}");
    }
    // The URL wins over the environment; the environment fills what it leaves out.
    let url = format!("postgresql://127.0.0.1:{port}/postgres?sslmode=disable");
    let env_fills = [
        ("PGHOST", "127.0.0.2"),
        ("PGPORT", "1"),
        ("PGDATABASE", "template0"),
        ("PGSSLMODE", "require"),
        ("PGUSER", "relay"),
        ("PGPASSWORD", PASSWORD),
    ];
    let (ok, logs) = drain(&env, Some(&url), &env_fills).await;
    assert!(ok, "URL first, then the environment:\n{logs}");
    let full = format!(
        "postgresql://relay:{}@127.0.0.1:{port}/postgres",
        percent_encode(PASSWORD)
    );
    let (ok, logs) = drain(
        &env,
        Some(&full),
        &[("PGUSER", "nobody"), ("PGPASSWORD", "wrong-pw")],
    )
    .await;
    assert!(ok, "the URL's user and password win:\n{logs}");

    // PGAPPNAME names the relay's sessions (its own name is only the fallback).
    let mut run_vars: Vec<(&str, &str)> = all.to_vec();
    run_vars.push(("PGAPPNAME", "billing-relay"));
    let relay = {
        let mut c = env.command(&["run"]);
        c.env_remove("DATABASE_URL").env("RUST_LOG", "trace");
        for (k, v) in &run_vars {
            c.env(k, v);
        }
        crate::common::relay::RelayProc::spawn(c)
    };
    relay.wait_for_log("delivering (leader)").await;
    let admin = env.db.connect().await;
    wait_until(Duration::from_secs(20), "a session named by PGAPPNAME", || async {
        crate::common::pg::count(&admin, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'billing-relay listener'", &[]).await
            == 1
    })
    .await;
    assert!(!relay.logs().contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_file_gives_the_password_only_when_none_was_given() {
    let (env, port) = password_checked(Fga::start()).await;
    let home = std::env::temp_dir().join(format!("pgpass-home-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let escaped = PASSWORD.replace('\\', "\\\\").replace(':', "\\:");
    let pgpass = home.join(".pgpass");
    let lines = format!(
        "# host:port:database:user:password\n\
         127.0.0.1:{port}:template1:relay:wrong-pw\n\
         127.0.0.1:{port}:*:relay:{escaped}\n\
         *:*:*:*:wrong-pw\n"
    );
    write_private(&pgpass, &lines, 0o600);
    let home_s = home.display().to_string();
    let url = format!("host=127.0.0.1 port={port} user=relay dbname=postgres");

    let (ok, logs) = drain(&env, Some(&url), &[("HOME", &home_s)]).await;
    assert!(ok, "~/.pgpass:\n{logs}");
    let (ok, logs) = drain(&env, Some(&url), &[("HOME", "/nonexistent")]).await;
    assert!(!ok, "no password anywhere still connected:\n{logs}");
    // A password given (PGPASSWORD) means the file is not read.
    let (ok, logs) = drain(
        &env,
        Some(&url),
        &[("HOME", &home_s), ("PGPASSWORD", "wrong-pw")],
    )
    .await;
    assert!(
        !ok,
        "the file was used although a password was given:\n{logs}"
    );
    // PGPASSFILE names another file.
    let other = home.join("elsewhere");
    write_private(&other, &lines, 0o600);
    let (ok, logs) = drain(
        &env,
        Some(&url),
        &[
            ("HOME", "/nonexistent"),
            ("PGPASSFILE", &other.display().to_string()),
        ],
    )
    .await;
    assert!(ok, "PGPASSFILE:\n{logs}");
    // libpq ignores a file that others may read, with a warning.
    write_private(&pgpass, &lines, 0o644);
    let (ok, logs) = drain(&env, Some(&url), &[("HOME", &home_s)]).await;
    assert!(!ok, "a world-readable password file was used:\n{logs}");
    assert!(logs.contains("group or world access"), "{logs}");
    std::fs::remove_dir_all(&home).unwrap();
}

pub(crate) fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
