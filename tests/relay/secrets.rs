//! Credentials in OpenFGA's URLs: userinfo in `FGA_API_URL` (sent as Basic credentials) and in
//! `FGA_API_TOKEN_ISSUER` reaches no log line at any level, and no row's `last_error`, which
//! `fga_outbox_wait` returns to writers. Each form is run where it would show: at start, and in
//! the errors of a Write that cannot reach OpenFGA or its token issuer.

use crate::common::relay::{Env, tk, writes};
use std::process::Output;

/// A `drain` of `id` at `RUST_LOG=trace` with `vars` on top of the test's; its log.
async fn drain_with(env: &Env, vars: &[(&str, &str)], timeout: &str) -> (Output, String) {
    let mut c = env.command(&["drain", "--timeout", timeout]);
    c.env("RUST_LOG", "trace").envs(vars.iter().copied());
    let out = c.output().expect("run drain");
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out, logs)
}

/// Asserts that none of `secrets` is in `logs` nor in row `id`'s `last_error`, and that the
/// error was recorded and says `names` (so that the check looked at a real error).
async fn assert_unseen(env: &Env, id: i64, logs: &str, secrets: &[&str], names: &str) {
    let row = env.row(id).await;
    let error = row.last_error.clone().unwrap_or_default();
    for s in secrets {
        assert!(!logs.contains(s), "{s:?} logged:\n{logs}");
        assert!(!error.contains(s), "{s:?} in last_error {error:?}");
    }
    assert!(
        error.contains(names),
        "last_error {error:?} should say {names:?}"
    );
}

/// `FGA_API_URL` with userinfo (plain and percent-encoded): not at start, not in the errors of
/// Writes to an OpenFGA that refuses connections, and rows are delivered with those credentials
/// once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userinfo_in_the_api_url_reaches_no_log_line_and_no_last_error() {
    let env = Env::start().await;
    let addr = env.fga.addr();
    // (FGA_API_URL, what must never be seen)
    let forms = [
        (
            format!("http://fgauser1:apiSecret1@{addr}"),
            vec!["fgauser1", "apiSecret1"],
        ),
        (
            format!("http://fgauser2:api%40Secret%3A2@{addr}/"),
            vec!["fgauser2", "api%40Secret%3A2", "api@Secret:2", "Secret%3A2"],
        ),
    ];
    for (i, (url, secrets)) in forms.iter().enumerate() {
        let id = env
            .insert(writes(&[tk(&format!("user:u{i}"), "viewer", "document:1")]))
            .await;
        env.fga.set_refusing(true);
        let (_, refused) = drain_with(&env, &[("FGA_API_URL", url)], "3s").await;
        assert_unseen(&env, id, &refused, secrets, "cannot connect to OpenFGA").await;
        assert!(
            refused.contains("[redacted]@"),
            "form {i}: the URL is shown, without its userinfo:\n{refused}"
        );
        env.fga.set_refusing(false);
        let (out, delivered) = drain_with(&env, &[("FGA_API_URL", url)], "20s").await;
        assert!(out.status.success(), "form {i}:\n{delivered}");
        assert!(env.row(id).await.delivered, "form {i}");
        assert_unseen(&env, id, &delivered, secrets, "cannot connect to OpenFGA").await;
    }
}

/// `FGA_API_TOKEN_ISSUER` with userinfo: an issuer that refuses the credentials (its answer
/// names the issuer) and one that cannot be reached (the request's error does) show it nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userinfo_in_the_token_issuer_reaches_no_log_line_and_no_last_error() {
    let app = axum::Router::new().route(
        "/oauth/token",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({"error": "invalid_client"})),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refusing = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let env = Env::start().await;
    // (issuer, what the error says, what must never be seen)
    let forms = [
        (
            format!("http://issuer1:issuerSecret1@{refusing}/oauth/token"),
            "answered 401",
            vec!["issuer1", "issuerSecret1"],
        ),
        (
            format!("http://issuer2:issuer%2FSecret2@{closed}"),
            "token request to",
            vec!["issuer2", "issuer%2FSecret2", "issuer/Secret2"],
        ),
    ];
    for (i, (issuer, says, secrets)) in forms.iter().enumerate() {
        let id = env
            .insert(writes(&[tk(&format!("user:t{i}"), "viewer", "document:1")]))
            .await;
        let (_, logs) = drain_with(
            &env,
            &[
                ("FGA_CLIENT_ID", "relay"),
                ("FGA_CLIENT_SECRET", "clientSecret"),
                ("FGA_API_TOKEN_ISSUER", issuer),
            ],
            "3s",
        )
        .await;
        assert!(logs.contains(says), "form {i}:\n{logs}");
        assert_unseen(&env, id, &logs, secrets, "[redacted]@").await;
    }
    server.abort();
}

/// Variables given to a command: name, value.
type Vars = Vec<(&'static str, String)>;

/// Every command's output (stdout and stderr, at `RUST_LOG=trace`), `--help` included (clap
/// shows the environment's values there), with a secret in each setting that can hold one: none
/// shows it. Each setting is given alone on top of the test's, with a pending row for `drain`
/// and a dead row for `status` and `retry`, so that each command has something to say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_shows_a_secret_of_any_setting() {
    let env = Env::start().await;
    let dead = env.insert(serde_json::json!({"writes": "nope"})).await;
    // A port nothing listens on, for a token issuer that cannot be reached.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let addr = env.fga.addr();
    let db_uri = env
        .db
        .uri()
        .replacen("postgres@", "postgres:dbSecretUri@", 1);
    // The secrets given as files: the connection string, the preshared key, libpq's password
    // file (private, as libpq wants it).
    let dir = std::env::temp_dir().join(format!("fga-relay-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        path.display().to_string()
    };
    let url_file = file(
        "database-url",
        &format!("{} password=dbSecretFile\n", env.db.url()),
    );
    let token_file = file("fga-api-token", "apiSecretTokenFile\n");
    let pgpass = file("pgpass", "*:*:*:*:dbSecretPgpass\n");
    // (the settings, the secrets in them)
    let settings: Vec<(Vars, Vec<&str>)> = vec![
        (
            vec![(
                "DATABASE_URL",
                format!("{} password=dbSecretKv", env.db.url()),
            )],
            vec!["dbSecretKv"],
        ),
        (vec![("DATABASE_URL", db_uri)], vec!["dbSecretUri"]),
        (
            vec![("PGPASSWORD", "dbSecretEnv".to_owned())],
            vec!["dbSecretEnv"],
        ),
        // An empty value is unset: the file is then the only source.
        (
            vec![
                ("DATABASE_URL", String::new()),
                ("DATABASE_URL_FILE", url_file),
            ],
            vec!["dbSecretFile"],
        ),
        (vec![("PGPASSFILE", pgpass)], vec!["dbSecretPgpass"]),
        (
            vec![("FGA_API_TOKEN_FILE", token_file)],
            vec!["apiSecretTokenFile"],
        ),
        (
            vec![("FGA_API_URL", format!("http://fgauser:apiSecretUrl@{addr}"))],
            vec!["fgauser", "apiSecretUrl"],
        ),
        (
            vec![("FGA_API_TOKEN", "apiSecretToken".to_owned())],
            vec!["apiSecretToken"],
        ),
        (
            vec![
                ("FGA_CLIENT_ID", "relay".to_owned()),
                ("FGA_CLIENT_SECRET", "clientSecretValue".to_owned()),
                (
                    "FGA_API_TOKEN_ISSUER",
                    format!("http://issuer:issuerSecret@{closed}"),
                ),
            ],
            vec!["clientSecretValue", "issuerSecret"],
        ),
    ];
    let dead_id = dead.to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["check"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["drain", "--timeout", "3s"],
        vec!["retry", "--dead", "--dry-run"],
        vec!["retry", &dead_id],
        vec!["reconcile"],
        vec!["sql"],
        vec!["sql", "--roles"],
        vec!["migrate", "--check"],
        vec!["prune", "--older-than", "1h"],
    ];
    let helps = [
        "check",
        "run",
        "drain",
        "status",
        "retry",
        "reconcile",
        "sql",
    ];
    let mut seen = 0;
    for (vars, secrets) in &settings {
        // Dead again (the `retry` before sent it back, and a drain may have dead-lettered it),
        // and a row for `drain` to deliver.
        env.db
            .connect()
            .await
            .execute(
                "UPDATE fga_outbox SET failed_at = now() WHERE id = $1",
                &[&dead],
            )
            .await
            .unwrap();
        env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
            .await;
        let helps = helps.iter().map(|c| vec![*c, "--help"]);
        for args in commands.iter().cloned().chain(helps) {
            let out = env
                .command(&args)
                .env("RUST_LOG", "trace")
                .envs(vars.iter().map(|(k, v)| (k, v)))
                .output()
                .unwrap();
            let all = crate::common::relay::said(&out);
            for s in secrets {
                assert!(
                    !all.contains(s),
                    "`fga-relay {}` with {:?} shows {s:?}:\n{all}",
                    args.join(" "),
                    vars.iter().map(|(k, _)| k).collect::<Vec<_>>()
                );
            }
            // The settings were taken, not refused before anything was shown: `status` reads
            // the database's, `check` all of them.
            let named = vars.iter().map(|(k, _)| k).collect::<Vec<_>>();
            if args == ["status"] {
                assert!(out.status.success(), "status with {named:?}:\n{all}");
            }
            if args == ["check"] {
                assert_ne!(out.status.code(), Some(2), "check with {named:?}:\n{all}");
            }
            seen += all.len();
        }
    }
    assert!(seen > 0);
    let _ = std::fs::remove_dir_all(&dir);
    // The URL is shown where it was given, without its userinfo.
    let out = env
        .command(&["check"])
        .env("FGA_API_URL", format!("http://fgauser:apiSecretUrl@{addr}"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("OpenFGA http://[redacted]@{addr}")),
        "{stdout}"
    );
}
