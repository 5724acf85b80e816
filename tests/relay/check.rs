//! `fga-relay check`, the preflight, and `migrate --check`, the deploy gate: each exit path,
//! and each check failing on what it is there to find.

use crate::common::fga::Fga;
use crate::common::pg::TestDb;
use crate::common::pgbouncer::{PgBouncer, PoolMode};
use crate::common::proxy::tcp_db;
use crate::common::relay::{Env, assert_success, tk, writes};
use std::process::Output;

const CHECKS: [&str; 9] = [
    "settings",
    "http",
    "postgres",
    "pooler",
    "schema",
    "privileges",
    "openfga",
    "store",
    "model",
];

fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `fga-relay check` with the test's environment and `vars`: its exit status and stdout.
fn check(env: &Env, vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = env
        .command(&["check"])
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    (out.status.code(), stdout_of(&out))
}

/// The line of one check: `ok`, `FAIL` or `skip`, and the rest.
fn line<'a>(stdout: &'a str, name: &str) -> (&'a str, &'a str) {
    stdout
        .lines()
        .find_map(|l| {
            let (verdict, rest) = l.split_once(char::is_whitespace)?;
            let rest = rest.trim_start().strip_prefix(name)?.strip_prefix(": ")?;
            Some((verdict, rest))
        })
        .unwrap_or_else(|| panic!("no {name} line in:\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_all_nine_with_exit_0_and_changes_nothing() {
    let env = Env::start().await;
    let (code, out) = check(&env, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.lines().count(),
        CHECKS.len(),
        "one line per check:\n{out}"
    );
    for name in CHECKS {
        assert_eq!(line(&out, name).0, "ok", "{name}:\n{out}");
    }
    assert!(line(&out, "schema").1.contains("current"), "{out}");
    // The model check's Write was refused; nothing was applied.
    assert!(env.fga.tuples().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_exit_2_with_one_line() {
    let env = Env::start().await;
    let out = env
        .command(&["check"])
        .env_remove("FGA_STORE_ID")
        .output()
        .unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let (verdict, rest) = line(&stdout, "settings");
    assert_eq!(verdict, "FAIL");
    assert!(rest.contains("FGA_STORE_ID"), "{stdout}");
}

/// `check` reads `run`'s own settings, checked by the same code: what `run` refuses (exit 2),
/// `check` refuses, naming the setting; it takes `run`'s flags; and it says whether `run` could
/// listen on the endpoint's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_what_run_refuses_and_tries_the_http_address() {
    let env = Env::start().await;
    for (var, value) in [
        ("FGA_RELAY_HTTP_ADDR", "bogus"),
        ("FGA_RELAY_LIVENESS_TIMEOUT", "1s"),
        ("FGA_RELAY_PENDING_AGE_WARN", "xyz"),
        ("FGA_RELAY_SUMMARY_INTERVAL", "0s"),
    ] {
        let run = env.command(&["run"]).env(var, value).output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            run.status.code(),
            Some(2),
            "run with {var}={value}:\n{stderr}"
        );
        assert!(stderr.contains(var), "{stderr}");
        let (code, out) = check(&env, &[(var, value)]);
        assert_eq!(code, Some(2), "check with {var}={value}:\n{out}");
        assert_eq!(out.lines().count(), 1, "{out}");
        let (verdict, rest) = line(&out, "settings");
        assert_eq!(verdict, "FAIL", "{out}");
        assert!(rest.contains(var), "{out}");
    }

    // `run`'s flags, and an address that can be listened on.
    let out = env
        .command(&[
            "check",
            "--http-addr",
            "127.0.0.1:0",
            "--liveness-timeout",
            "5m",
        ])
        .output()
        .unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(line(&stdout, "http").0, "ok", "{stdout}");

    // An address something already listens on: `run` could not serve there.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, out) = check(&env, &[("FGA_RELAY_HTTP_ADDR", &addr)]);
    assert_eq!(code, Some(1), "{out}");
    let (verdict, rest) = line(&out, "http");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(rest.contains(&addr), "{out}");
    assert_eq!(
        line(&out, "postgres").0,
        "ok",
        "the other checks go on:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openfga_down_refusing_credentials_or_without_store_or_model_exits_1() {
    // Down.
    let env = Env::start().await;
    env.fga.set_refusing(true);
    let (code, out) = check(&env, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(line(&out, "openfga").0, "FAIL", "{out}");
    assert_eq!(line(&out, "store").0, "skip", "{out}");
    assert_eq!(line(&out, "model").0, "skip", "{out}");
    assert_eq!(line(&out, "postgres").0, "ok", "{out}");
    env.fga.set_refusing(false);

    // A store that does not exist.
    let (code, out) = check(&env, &[("FGA_STORE_ID", "01HZZZZZZZZZZZZZZZZZZZZZZZ")]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(line(&out, "openfga").0, "ok", "{out}");
    let (verdict, rest) = line(&out, "store");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(rest.contains("01HZZZZZZZZZZZZZZZZZZZZZZZ"), "{out}");

    // Credentials refused.
    let env = Env::with_fga(Fga::builder().preshared_key("right").start()).await;
    let (code, out) = check(&env, &[("FGA_API_TOKEN", "wrong")]);
    assert_eq!(code, Some(1), "{out}");
    let (verdict, rest) = line(&out, "openfga");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(rest.contains("credentials"), "{out}");
    assert!(!out.contains("wrong"), "the token is never shown:\n{out}");
    let (code, out) = check(&env, &[("FGA_API_TOKEN", "right")]);
    assert_eq!(code, Some(0), "{out}");

    // A store without a model, and a model id the store does not have.
    let env = Env::with_fga(Fga::builder().no_model().start()).await;
    let (code, out) = check(&env, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(line(&out, "store").0, "ok", "{out}");
    let (verdict, rest) = line(&out, "model");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(rest.contains("no authorization model"), "{out}");
    let env = Env::start().await;
    let (code, out) = check(&env, &[("FGA_MODEL_ID", "01HZZZZZZZZZZZZZZZZZZZZZZZ")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        line(&out, "model").1.contains("01HZZZZZZZZZZZZZZZZZZZZZZZ"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_exits_1_and_skips_what_needs_it() {
    let env = Env::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("host=127.0.0.1 port={closed} user=postgres dbname=postgres");
    let (code, out) = check(&env, &[("DATABASE_URL", &url)]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(line(&out, "postgres").0, "FAIL", "{out}");
    for name in ["pooler", "schema", "privileges"] {
        assert_eq!(line(&out, name).0, "skip", "{name}:\n{out}");
    }
    assert_eq!(
        line(&out, "model").0,
        "ok",
        "OpenFGA is still checked:\n{out}"
    );
}

/// Through PgBouncer in transaction mode, LISTEN and the session's advisory locks would
/// silently fail: the check sees two connections share a backend, or one move between two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_fails_the_pooler_check_and_a_session_pooler_passes() {
    let env = Env::with(tcp_db(&[]), Fga::start()).await;
    let port = env.db.tcp_port().expect("a cluster on TCP");
    let transaction = PgBouncer::start(port, PoolMode::Transaction);
    let (code, out) = check(&env, &[("DATABASE_URL", &transaction.url())]);
    assert_eq!(code, Some(1), "{out}\n{}", transaction.log());
    let (verdict, rest) = line(&out, "pooler");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(rest.contains("transaction pooler"), "{out}");
    assert_eq!(line(&out, "postgres").0, "ok", "{out}");
    drop(transaction);

    let session = PgBouncer::start(port, PoolMode::Session);
    let (code, out) = check(&env, &[("DATABASE_URL", &session.url())]);
    assert_eq!(code, Some(0), "{out}\n{}", session.log());
}

/// A role without the grants fails the privileges check naming what is missing; with
/// `sql --roles`' grants it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_grants_fails_the_privileges_check() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    admin
        .batch_execute("CREATE ROLE checker LOGIN")
        .await
        .unwrap();
    let url = env.db.url().replace("user=postgres", "user=checker");
    let (code, out) = check(&env, &[("DATABASE_URL", &url)]);
    assert_eq!(code, Some(1), "{out}");
    let (verdict, rest) = line(&out, "privileges");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(
        rest.contains("SELECT on fga_outbox") && rest.contains("fga_outbox_leader"),
        "{out}"
    );
    let roles = env.command(&["sql", "--roles"]).output().unwrap();
    assert_success(&roles, "sql --roles");
    admin
        .batch_execute(&String::from_utf8(roles.stdout).unwrap())
        .await
        .unwrap();
    admin
        .batch_execute("GRANT fga_outbox_relay TO checker")
        .await
        .unwrap();
    let (code, out) = check(&env, &[("DATABASE_URL", &url)]);
    assert_eq!(code, Some(0), "{out}");
}

/// `migrate --check` exits 1 while `migrate` would change something (no schema, a schema an
/// older fga-relay made, a dropped trigger), 0 once it would not, and 2 for a table `migrate`
/// cannot fix; `check` says the same in its schema line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_check_exits_1_when_migrate_would_change_something() {
    let env = Env::with(TestDb::start(), Fga::builder().start()).await;
    let gate = || {
        let out = env.command(&["migrate", "--check"]).output().unwrap();
        (out.status.code(), stdout_of(&out))
    };
    let migrate = || assert_success(&env.command(&["migrate"]).output().unwrap(), "migrate");
    let admin = env.db.connect().await;
    assert_eq!(gate().0, Some(0), "{}", gate().1);

    // An older fga-relay's schema: no version recorded.
    admin
        .batch_execute("DROP FUNCTION fga_outbox_schema_version()")
        .await
        .unwrap();
    let (code, out) = gate();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("record schema version"), "{out}");
    let (code, c) = check(&env, &[]);
    assert_eq!(code, Some(1), "{c}");
    assert_eq!(line(&c, "schema").0, "FAIL", "{c}");
    assert_eq!(line(&c, "privileges").0, "ok", "{c}");
    migrate();
    assert_eq!(gate().0, Some(0));

    // A version recorded below this binary's.
    admin
        .batch_execute(
            "CREATE OR REPLACE FUNCTION fga_outbox_schema_version() RETURNS integer \
             LANGUAGE sql AS 'SELECT 3'",
        )
        .await
        .unwrap();
    let (code, out) = gate();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("from version 3"), "{out}");
    migrate();
    assert_eq!(gate().0, Some(0));

    // The wake-up trigger dropped.
    admin
        .batch_execute("DROP TRIGGER fga_outbox_notify ON fga_outbox")
        .await
        .unwrap();
    let (code, out) = gate();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("fga_outbox_notify"), "{out}");
    migrate();
    assert_eq!(gate().0, Some(0));

    // No table at all.
    admin
        .batch_execute("DROP TABLE fga_outbox, fga_outbox_leader CASCADE")
        .await
        .unwrap();
    let (code, out) = gate();
    assert_eq!(code, Some(1), "{out}");
    let (code, c) = check(&env, &[]);
    assert_eq!(code, Some(1), "{c}");
    assert_eq!(line(&c, "schema").0, "FAIL", "{c}");
    assert_eq!(line(&c, "privileges").0, "skip", "{c}");

    // A column of another type: no migrate can fix it (it keeps an adopted table's columns).
    migrate();
    admin
        .batch_execute("ALTER TABLE fga_outbox ALTER COLUMN attempts TYPE bigint")
        .await
        .unwrap();
    let out = env.command(&["migrate", "--check"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pending rows naming a type or relation the model lacks would be dead-lettered: `check` names
/// them before `run` starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_check_names_what_pending_rows_need_and_the_model_lacks() {
    let env = Env::start().await;
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let (code, out) = check(&env, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(line(&out, "model").1.contains("knows the 1 type"), "{out}");

    env.insert(writes(&[
        tk("user:anne", "approver", "document:1"),
        tk("user:anne", "viewer", "folder:1"),
    ]))
    .await;
    let (code, out) = check(&env, &[]);
    assert_eq!(code, Some(1), "{out}");
    let (verdict, rest) = line(&out, "model");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(
        rest.contains("document#approver") && rest.contains("type folder"),
        "{out}"
    );
    assert!(!rest.contains("document#viewer"), "{out}");
}
