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
