//! Secrets as files: `DATABASE_URL_FILE`, `FGA_API_TOKEN_FILE`, `FGA_CLIENT_SECRET_FILE` (Docker
//! and Kubernetes secrets) and systemd credentials (`$CREDENTIALS_DIRECTORY/database-url`, ...),
//! against a server that checks passwords and an OpenFGA that checks the token.

use crate::common::fga::Fga;
use crate::common::relay::{Env, accepted_writes, tk, writes};
use crate::libpq::{PASSWORD, drain_without_url, password_checked, percent_encode, write_private};
use std::path::Path;

const TOKEN: &str = "preshared-T0ken";

/// Runs `drain` with `vars` (and no DATABASE_URL of the harness); returns whether it delivered
/// a fresh row with the token, its exit status and its logs.
async fn drain(env: &Env, vars: &[(&str, &str)]) -> (bool, Option<i32>, String) {
    let id = env
        .insert(writes(&[tk("user:x", "viewer", "document:1")]))
        .await;
    let before = accepted_writes(&env.fga).len();
    let (status, logs) = drain_without_url(env, vars, &[PASSWORD, TOKEN]);
    let sent_token = accepted_writes(&env.fga)[before..]
        .iter()
        .all(|w| w.authorization.as_deref() == Some(&format!("Bearer {TOKEN}")[..]));
    let delivered = status.success() && env.row(id).await.delivered && sent_token;
    (delivered, status.code(), logs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_come_from_files_and_systemd_credentials() {
    let fga = Fga::builder().accept_bearer(|t| t == TOKEN).start();
    let (env, port) = password_checked(fga).await;
    let dir = std::env::temp_dir().join(format!("secret-files-{}-{port}", std::process::id()));
    let creds = dir.join("credentials");
    std::fs::create_dir_all(&creds).unwrap();
    let url = format!(
        "postgresql://relay:{}@127.0.0.1:{port}/postgres",
        percent_encode(PASSWORD)
    );
    // As `echo secret > file` writes them: with a trailing newline.
    let file = |name: &str, contents: &str| -> String {
        let path = dir.join(name);
        write_private(&path, &format!("{contents}\n"), 0o600);
        path.display().to_string()
    };
    let url_file = file("database-url", &url);
    let token_file = file("api-token", TOKEN);

    let (ok, _, logs) = drain(
        &env,
        &[
            ("DATABASE_URL_FILE", &url_file),
            ("FGA_API_TOKEN_FILE", &token_file),
        ],
    )
    .await;
    assert!(ok, "_FILE variables:\n{logs}");

    write_private(&creds.join("database-url"), &format!("{url}\n"), 0o600);
    write_private(&creds.join("fga-api-token"), &format!("{TOKEN}\n"), 0o600);
    let creds_s = creds.display().to_string();
    let (ok, _, logs) = drain(&env, &[("CREDENTIALS_DIRECTORY", &creds_s)]).await;
    assert!(ok, "systemd credentials:\n{logs}");
    // A variable given wins over a credential.
    let (ok, _, logs) = drain(
        &env,
        &[
            ("CREDENTIALS_DIRECTORY", &creds_s),
            ("FGA_API_TOKEN", "wrong-token"),
        ],
    )
    .await;
    assert!(
        !ok,
        "the credential was used although FGA_API_TOKEN was given:\n{logs}"
    );

    // A variable and its _FILE both: exit 2, naming both.
    for (var, value, file_var, file_value) in [
        (
            "DATABASE_URL",
            url.as_str(),
            "DATABASE_URL_FILE",
            url_file.as_str(),
        ),
        (
            "FGA_API_TOKEN",
            TOKEN,
            "FGA_API_TOKEN_FILE",
            token_file.as_str(),
        ),
        (
            "FGA_CLIENT_SECRET",
            "x",
            "FGA_CLIENT_SECRET_FILE",
            token_file.as_str(),
        ),
    ] {
        let (ok, code, logs) = drain(&env, &[(var, value), (file_var, file_value)]).await;
        let line = logs.trim().lines().last().unwrap_or_default();
        assert!(
            !ok && code == Some(2) && line.contains(&format!("({var})")) && line.contains(file_var),
            "{var} and {file_var}: exit {code:?}\n{logs}"
        );
    }
    // A _FILE that cannot be read: exit 2 naming it.
    let (_, code, logs) = drain(&env, &[("DATABASE_URL_FILE", "/nonexistent/url")]).await;
    assert_eq!(code, Some(2), "{logs}");
    assert!(logs.contains("DATABASE_URL_FILE"), "{logs}");
    // An empty _FILE is not "no secret" (libpq's defaults, no key): exit 2 naming it.
    let empty = file("empty", "");
    for vars in [
        [
            ("DATABASE_URL_FILE", empty.as_str()),
            ("FGA_API_TOKEN", TOKEN),
        ],
        [
            ("DATABASE_URL", url.as_str()),
            ("FGA_API_TOKEN_FILE", empty.as_str()),
        ],
    ] {
        let var = vars.iter().find(|(_, v)| *v == empty).unwrap().0;
        let (_, code, logs) = drain(&env, &vars).await;
        assert_eq!(code, Some(2), "{var}: {logs}");
        assert!(
            logs.contains(var) && logs.contains("is empty"),
            "{var}: {logs}"
        );
    }
    std::fs::remove_dir_all(Path::new(&dir)).unwrap();
}
