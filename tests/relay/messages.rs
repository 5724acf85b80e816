//! Messages that name the cause: what does not heal by itself while the relay retries (a missing
//! grant, a refused password, no database configured) is said at ERROR with the next step, once
//! while it recurs (said again a minute later at most), and the relay keeps retrying.

use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, RelayProc, tk, wait_until, writes};
use crate::libpq::{PASSWORD, password_checked};

/// The log's lines at ERROR that contain `needle`.
fn errors_with<'a>(logs: &'a str, needle: &str) -> Vec<&'a str> {
    logs.lines()
        .filter(|l| l.contains(" ERROR ") && l.contains(needle))
        .collect()
}

/// `run` as a role without the grants: an ERROR naming what the role lacks and the GRANT that
/// gives it, as `check` says it, once however often it retries, and not the misleading "LISTEN
/// connection lost"; once granted, it delivers. `status` says the database's error once, with the
/// same hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_grants_is_told_the_grant_once_and_the_relay_retries() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    admin
        .batch_execute("CREATE ROLE ungranted LOGIN")
        .await
        .unwrap();
    let url = env.db.url().replace("user=postgres", "user=ungranted");
    const GRANT: &str = "GRANT fga_outbox_relay TO ungranted";

    let out = env
        .command(&["status"])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("permission denied").count(), 1, "{err}");
    assert!(err.contains(GRANT) && err.contains("sql --roles"), "{err}");
    // The other commands, too, say the database's error once.
    let out = env
        .command(&["prune", "--older-than", "1h"])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("permission denied").count(), 1, "{err}");

    let relay = env.spawn_relay(&[("DATABASE_URL", &url)]);
    // It retries: each retry is a new LISTEN connection, said at debug.
    relay.wait_for_log_count("LISTEN connection up", 1).await;
    relay
        .wait_for_log_count("LISTEN connection reconnected", 3)
        .await;
    let logs = relay.logs();
    let said = errors_with(&logs, "cannot ask for leadership");
    assert_eq!(said.len(), 1, "said once, not at every retry:\n{logs}");
    assert!(
        said[0].contains("SELECT, INSERT, UPDATE on fga_outbox_leader") && said[0].contains(GRANT),
        "{}",
        said[0]
    );
    assert!(
        !logs.contains("LISTEN connection lost soon after it opened"),
        "{logs}"
    );

    let roles = env.command(&["sql", "--roles"]).output().unwrap();
    admin
        .batch_execute(&String::from_utf8(roles.stdout).unwrap())
        .await
        .unwrap();
    admin.batch_execute(GRANT).await.unwrap();
    relay.wait_for_log("delivering (leader)").await;
    let id = env
        .insert(writes(&[tk("user:a", "viewer", "document:1")]))
        .await;
    env.wait_delivered(id).await;
}

/// A wrong password: an ERROR naming the role (never the password, never the connection
/// string), once however often it retries; the relay keeps retrying, and starts once the
/// password is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_is_an_error_naming_the_role_and_the_relay_retries() {
    let (env, port) = password_checked(crate::common::fga::Fga::start()).await;
    const WRONG: &str = "wr0ng-Secret";
    let url = format!("postgresql://relay:{WRONG}@127.0.0.1:{port}/postgres");
    let mut c = env.command(&["run"]);
    c.env("DATABASE_URL", &url);
    let relay = RelayProc::spawn(c);
    // Three attempts, each refused.
    relay
        .wait_for_log_count("password authentication failed", 3)
        .await;
    let logs = relay.logs();
    let said = errors_with(&logs, "does not let the role relay in");
    assert_eq!(said.len(), 1, "said once, not at every retry:\n{logs}");
    assert!(said[0].contains("28P01"), "{}", said[0]);
    assert!(
        !logs.contains(WRONG) && !logs.contains(PASSWORD) && !logs.contains("postgresql://"),
        "{logs}"
    );

    env.db
        .connect()
        .await
        .batch_execute(&format!("ALTER ROLE relay PASSWORD '{WRONG}'"))
        .await
        .unwrap();
    wait_until(
        PROMPTLY * 2,
        "the relay leads with the password",
        || async { relay.logs().contains("delivering (leader)") },
    )
    .await;

    // The password changed under a running relay, its sessions ended: its reconnects are refused,
    // said once as it retries.
    let admin = env.db.connect().await;
    admin
        .batch_execute(
            "ALTER ROLE relay PASSWORD 'An0ther'; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE application_name LIKE 'fga-relay run%'",
        )
        .await
        .unwrap();
    let refused = relay
        .logs()
        .matches("password authentication failed")
        .count();
    relay
        .wait_for_log_count("password authentication failed", refused + 3)
        .await;
    let logs = relay.logs();
    let said = errors_with(&logs, "cannot open the LISTEN connection");
    assert_eq!(said.len(), 1, "said once, not at every retry:\n{logs}");
    assert!(
        said[0].contains("does not let the role relay in"),
        "{}",
        said[0]
    );
}

/// With no `DATABASE_URL`, no `PG*` variable and no server at libpq's default sockets: the
/// command says that no database is configured, and which sockets it tried.
#[test]
fn no_database_configured_is_said_with_the_sockets_tried() {
    const SOCKETS: [&str; 2] = ["/var/run/postgresql/.s.PGSQL.5432", "/tmp/.s.PGSQL.5432"];
    for socket in SOCKETS {
        assert!(
            !std::path::Path::new(socket).exists(),
            "a PostgreSQL of this machine listens at {socket}: this test needs libpq's default \
             sockets free"
        );
    }
    for command in [&["status"][..], &["migrate"]] {
        // Nothing but PATH: no DATABASE_URL, no PG* variable.
        let out =
            crate::common::relay::command(std::path::Path::new(crate::common::relay::BIN), command)
                .output()
                .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {err}");
        assert!(
            err.contains("no database is configured")
                && SOCKETS.iter().all(|s| err.contains(s))
                && err.contains("set DATABASE_URL"),
            "{command:?}: {err}"
        );
    }
}

/// An OpenFGA URL written as a listen address, `host:port`: exit 2, and the URL it was meant to
/// be.
#[test]
fn an_api_url_without_its_scheme_is_answered_with_the_url_it_meant() {
    for command in ["run", "check"] {
        let out = crate::common::relay::command(
            std::path::Path::new(crate::common::relay::BIN),
            &[command],
        )
        .env("FGA_API_URL", "127.0.0.1:18080")
        .env("FGA_STORE_ID", "01HZZZZZZZZZZZZZZZZZZZZZZZ")
        .output()
        .unwrap();
        let said = crate::common::relay::said(&out);
        assert_eq!(out.status.code(), Some(2), "{command}: {said}");
        assert!(
            said.contains("FGA_API_URL") && said.contains("\"http://127.0.0.1:18080\""),
            "{command}: {said}"
        );
    }
}

/// https:// against OpenFGA's plain-HTTP port: `check` and `run` say that the server did not
/// answer in TLS, not only rustls' "corrupt message"; and so for a token issuer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_against_a_plain_http_port_says_the_server_did_not_answer_in_tls() {
    let env = Env::start().await;
    let https = env.fga.url().replacen("http://", "https://", 1);
    const SAID: &str = "the server did not answer in TLS";
    let out = env
        .command(&["check"])
        .env("FGA_API_URL", &https)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains("openfga:"))
        .unwrap_or_else(|| panic!("no openfga line:\n{stdout}"));
    assert!(line.starts_with("FAIL") && line.contains(SAID), "{line}");

    let relay = env.spawn_relay(&[("FGA_API_URL", &https)]);
    relay.wait_for_log(SAID).await;

    // The token issuer is reached the same way.
    let out = env
        .command(&["check"])
        .envs([
            ("FGA_CLIENT_ID", "relay"),
            ("FGA_CLIENT_SECRET", "s3cret"),
            ("FGA_API_TOKEN_ISSUER", https.as_str()),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("openfga:"))
        .unwrap_or_else(|| panic!("no openfga line:\n{stdout}"));
    assert!(line.starts_with("FAIL") && line.contains(SAID), "{line}");
}

/// A store without an authorization model: `run` says so at start, at ERROR, in `check`'s words,
/// with no row to deliver yet (not only later, row by row), and starts anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_a_model_is_said_at_start() {
    let env = Env::with_fga(crate::common::fga::Fga::builder().no_model().start()).await;
    let mut relay = env.spawn_relay(&[]);
    relay
        .wait_for_log("the store has no authorization model: write one (fga model write)")
        .await;
    let logs = relay.logs();
    assert_eq!(
        errors_with(&logs, "no authorization model").len(),
        1,
        "{logs}"
    );
    relay.wait_for_log("delivering (leader)").await;
    assert!(relay.is_running());
    assert_eq!(env.fga.write_count(), 0, "a start writes nothing");

    let env = Env::start().await;
    let relay = env.spawn_relay(&[]);
    relay
        .wait_for_log("OpenFGA authorization model found")
        .await;
    assert!(!relay.logs().contains(" ERROR "), "{}", relay.logs());
}

/// A command run as a role that lacks what it needs says as which role to run it: `prune` (the
/// only DELETE), `migrate` (DDL) and `reconcile --repair` (a table lock and inserts), run as the
/// relay's own role, which may do none of them by design, name the table's owner (or a role
/// granted DELETE, for `prune`); `retry` and `prune` as a role with no grant at all name,
/// respectively, the GRANT the relay's commands need and the owner. Each says the database's
/// error once, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_run_as_a_role_lacking_its_privilege_says_which_role_may_run_it() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let roles = env.command(&["sql", "--roles"]).output().unwrap();
    admin
        .batch_execute(&String::from_utf8(roles.stdout).unwrap())
        .await
        .unwrap();
    admin
        .batch_execute(
            "CREATE ROLE relayer LOGIN; GRANT fga_outbox_relay TO relayer; \
             CREATE ROLE nobody LOGIN; \
             INSERT INTO fga_outbox (payload, processed_at) \
               VALUES ('{\"writes\": []}', now() - interval '2 hours'); \
             INSERT INTO fga_outbox (payload, failed_at, last_error) \
               VALUES ('{\"writes\": []}', now(), 'test')",
        )
        .await
        .unwrap();
    let as_role = |role: &str, args: &[&str]| {
        let url = env
            .db
            .url()
            .replace("user=postgres", &format!("user={role}"));
        let out = env.command(args).env("DATABASE_URL", url).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{role} {args:?}: {err}");
        assert_eq!(
            err.matches("permission denied").count() + err.matches("must be owner").count(),
            1,
            "{role} {args:?}: {err}"
        );
        err
    };
    for role in ["relayer", "nobody"] {
        let err = as_role(role, &["prune", "--older-than", "1h"]);
        assert!(
            err.contains(
                "run prune as the owner of fga_outbox, role postgres, or as a role granted \
                 DELETE on fga_outbox"
            ),
            "{role}: {err}"
        );
    }
    let err = as_role("relayer", &["migrate"]);
    assert!(
        err.contains("run migrate as the owner of fga_outbox, role postgres"),
        "{err}"
    );
    let err = as_role("nobody", &["retry", "--dead"]);
    assert!(err.contains("GRANT fga_outbox_relay TO nobody"), "{err}");
    // A delivered grant OpenFGA lacks: drift, which only the owner may repair.
    admin
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) VALUES ($1, now())",
            &[&writes(&[tk("user:anne", "viewer", "document:1")])],
        )
        .await
        .unwrap();
    let out = env
        .command(&["reconcile", "--repair"])
        .env(
            "DATABASE_URL",
            env.db.url().replace("user=postgres", "user=relayer"),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("permission denied")
            && err.contains("run reconcile --repair as the owner of fga_outbox, role postgres"),
        "{err}"
    );
    assert_eq!(
        crate::common::pg::count(
            &admin,
            "SELECT count(*) FROM fga_outbox WHERE failed_at IS NOT NULL",
            &[]
        )
        .await,
        1,
        "nothing changed"
    );
    assert_eq!(
        crate::common::pg::count(&admin, "SELECT count(*) FROM fga_outbox", &[]).await,
        3,
        "nothing deleted, nothing enqueued"
    );
    // A role that may not even read the outbox is told the grant reconcile needs.
    let out = env
        .command(&["reconcile"])
        .env(
            "DATABASE_URL",
            env.db.url().replace("user=postgres", "user=nobody"),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("permission denied")
            && err.contains("GRANT SELECT ON fga_outbox TO nobody, or run it as the relay's role"),
        "{err}"
    );
}

/// A malformed `DATABASE_URL` exits 2 with one line naming the setting and what is wrong with
/// it, as the parser found it, and never the string, its password, or a piece of it the parser
/// tripped on (a password holding `&` or a space, unescaped, is read as more options): the
/// option it could not take is named only when it is one of libpq's, and the value of a TLS
/// option the relay refuses is not shown.
#[test]
fn a_malformed_database_url_says_what_is_wrong_and_never_its_password() {
    // (DATABASE_URL, what the line must say, what it must never say)
    let cases: [(&str, &str, &[&str]); 9] = [
        (
            "postgresql://relay:urlSecret1@db.internal:54x2/app",
            "invalid value for option `port`",
            &["urlSecret1"],
        ),
        (
            "postgresql://relay@db.internal/app?password=Qx7&Secret2zz=1",
            "an option libpq does not know either",
            &["Qx7", "Secret2zz"],
        ),
        (
            "host=db.internal user=relay password=kv Secret3=x",
            "an option libpq does not know either",
            &["Secret3"],
        ),
        (
            "host=db.internal user=relay password=kv Sec4 Sec5=x",
            "expected `=`; a value holding",
            &["Sec4", "`S`"],
        ),
        (
            "host=db.internal user=relay password='unterminated Secret6",
            "unterminated quoted connection parameter value",
            &["Secret6"],
        ),
        (
            "postgresql://relay@db.internal/app?service=prod&password=Secret7",
            "libpq's option `service` is not one the relay takes",
            &["Secret7"],
        ),
        // What follows an unescaped `&` in a password may read as one of the TLS options.
        (
            "postgresql://relay@db.internal/app?password=Qx8&sslmode=Secret8",
            "sslmode is not one of",
            &["Secret8"],
        ),
        (
            "postgresql://relay@db.internal/app?password=Qx9&sslsni=Secret9",
            "sslsni is neither 0 nor 1",
            &["Secret9"],
        ),
        (
            "postgresql://relay@db.internal/app?password=Qx10&gssencmode=Secret10",
            "gssencmode is neither disable nor prefer",
            &["Secret10"],
        ),
    ];
    for (url, says, never) in cases {
        for command in ["status", "check"] {
            let out = crate::common::relay::command(
                std::path::Path::new(crate::common::relay::BIN),
                &[command],
            )
            .env("DATABASE_URL", url)
            .env("FGA_STORE_ID", "01HZZZZZZZZZZZZZZZZZZZZZZZ")
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
            let said = crate::common::relay::said(&out);
            assert_eq!(out.status.code(), Some(2), "{command} {url}: {said}");
            assert!(
                said.contains("DATABASE_URL") && said.contains(says),
                "{command} {url}: {said}"
            );
            for secret in never.iter().chain(&[url]) {
                assert!(
                    !said.contains(secret),
                    "{command} {url}: {secret:?} in {said}"
                );
            }
        }
    }
}
