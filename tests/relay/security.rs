//! Operating it safely, each part done for real: PostgreSQL over TLS (a cluster with `ssl=on` and
//! a CA made here), OpenFGA over https (a TLS front before OpenFGA's proxy), OIDC client
//! credentials (OpenFGA with `--authn-method oidc`, trusting an issuer of the test's own), store
//! names, and the least-privilege roles of `sql/roles.sql` (the relay and a writer logged in as
//! those roles).

use crate::common::fga::Fga;
use crate::common::oidc::{AUDIENCE, CLIENT_SECRET, OTHER_AUDIENCE, OidcIssuer};
use crate::common::pg::{PROMPTLY, PgOptions, TestDb};
use crate::common::relay::{Env, RelayProc, assert_success, tk, wait_until, writes};
use crate::common::tls::{HttpsFront, TempDir, TestCa};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The first line of `logs` that contains `needle`.
fn log_line<'a>(logs: &'a str, needle: &str) -> &'a str {
    logs.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{logs}"))
}

fn a_row(n: usize) -> Value {
    writes(&[tk("user:anne", "viewer", &format!("document:{n}"))])
}

// ------------------------------------------------------------------------------------------------
// PostgreSQL over TLS
// ------------------------------------------------------------------------------------------------

/// A cluster with TLS on, whose certificate (from a CA made here) names `db.test` only,
/// listening on 127.0.0.1 where it accepts TLS connections and refuses the others; the role
/// `certuser` must show a client certificate from the same CA. Its Unix socket stays open
/// (trust) for the test's own look inside. The schema is migrated over verify-full TLS: `migrate`
/// uses the same dedicated connection as the LISTEN session.
struct TlsDb {
    env: Env,
    ca: TestCa,
    files: TempDir,
    ca_file: PathBuf,
    port: u16,
}

impl TlsDb {
    async fn start() -> TlsDb {
        let ca = TestCa::new("fga-relay test CA");
        let server = ca.server_cert(&["db.test"]);
        let db = TestDb::start_with(PgOptions {
            tcp: true,
            settings: [
                ("ssl", "on"),
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "ca.crt"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .to_vec(),
            hba: [
                "local all all trust",
                "hostssl all certuser 127.0.0.1/32 cert",
                "hostssl all all 127.0.0.1/32 trust",
                "hostnossl all all 127.0.0.1/32 reject",
            ]
            .map(str::to_owned)
            .to_vec(),
            files: vec![
                ("server.crt".to_owned(), server.cert_pem.into_bytes()),
                ("server.key".to_owned(), server.key_pem.into_bytes()),
                ("ca.crt".to_owned(), ca.pem().as_bytes().to_vec()),
            ],
            ..PgOptions::default()
        });
        let port = db.tcp_port().expect("listens on TCP");
        let files = TempDir::new();
        let ca_file = files.file("ca.pem", ca.pem());
        let t = TlsDb {
            env: Env {
                db,
                fga: Fga::start(),
            },
            ca,
            files,
            ca_file,
            port,
        };
        let out = t
            .command(&["migrate"], &t.verify_full("db.test"))
            .output()
            .unwrap();
        assert_success(&out, "fga-relay migrate over TLS");
        t
    }

    /// A key=value `DATABASE_URL` reaching the server at 127.0.0.1 under the name `host` (which
    /// is what the certificate is checked against).
    fn url(&self, host: &str, tls: &str) -> String {
        format!(
            "host={host} hostaddr=127.0.0.1 port={} user=postgres dbname=postgres {tls}",
            self.port
        )
    }

    fn verify_full(&self, host: &str) -> String {
        self.url(
            host,
            &format!("sslmode=verify-full sslrootcert={}", self.ca_file.display()),
        )
    }

    fn command(&self, args: &[&str], url: &str) -> std::process::Command {
        let mut c = self.env.command(args);
        c.env("DATABASE_URL", url);
        c
    }

    /// `fga-relay drain` with this `DATABASE_URL`, and these variables.
    fn drain(&self, url: &str, vars: &[(&str, &str)]) -> Output {
        self.command(&["drain", "--timeout", "20s"], url)
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    }

    /// Inserts a row, drains it with `url` (and `vars`), and checks it was delivered.
    async fn delivers_with(&self, url: &str, vars: &[(&str, &str)], n: usize) {
        let id = self.env.insert(a_row(n)).await;
        assert_success(
            &self.drain(url, vars),
            &format!("drain with {url} {vars:?}"),
        );
        assert!(self.env.row(id).await.delivered, "{url} {vars:?}");
    }

    /// Given roots from another CA, `sslmode` refuses the server's certificate, saying why.
    fn refuses_another_ca(&self, sslmode: &str) {
        let other_ca = self
            .files
            .file("other-ca.pem", TestCa::new("another CA").pem());
        let err = self.cannot_connect(&self.url(
            "db.test",
            &format!("sslmode={sslmode} sslrootcert={}", other_ca.display()),
        ));
        assert!(
            err.contains("invalid peer certificate: UnknownIssuer"),
            "{err}"
        );
    }

    /// `drain` with `url` fails to connect; returns what it said.
    fn cannot_connect(&self, url: &str) -> String {
        let out = self.drain(url, &[]);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{url}: {err}");
        assert!(err.contains("cannot connect to PostgreSQL"), "{url}: {err}");

        err
    }
}

/// verify-full: the relay's every session (pool and LISTEN) runs over TLS, delivers, and wakes
/// on notifications; the URL form of `DATABASE_URL` works the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_delivers_over_tls() {
    let t = TlsDb::start().await;
    let url = t.verify_full("db.test");
    let mut relay = t.env.spawn_relay(&[("DATABASE_URL", &url)]);
    relay.wait_for_log("delivering (leader)").await;
    relay.wait_for_log("listening").await;
    let id = t.env.insert(a_row(1)).await;
    wait_until(PROMPTLY, "the row is delivered", || async {
        t.env.row(id).await.delivered
    })
    .await;

    let client = t.env.db.connect().await;
    let sessions: Vec<(String, bool, String)> = client
        .query(
            "SELECT a.application_name, s.ssl, coalesce(s.version, '') \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name LIKE 'fga-relay%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        sessions.iter().any(|s| s.0 == "fga-relay run listener")
            && sessions.iter().any(|s| s.0 == "fga-relay run"),
        "{sessions:?}"
    );
    assert!(
        sessions
            .iter()
            .all(|(_, ssl, v)| *ssl && v.starts_with("TLS")),
        "every session of the relay uses TLS: {sessions:?}"
    );
    relay.term();
    assert!(relay.wait_exit(PROMPTLY).await.success());

    let url = format!(
        "postgres://postgres@db.test:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full\
         &sslrootcert={}&application_name=fga-relay%20drain",
        t.port,
        t.ca_file.display()
    );
    t.delivers_with(&url, &[], 2).await;
}

/// require (and the default, prefer) encrypt without verifying, as libpq: the certificate's CA
/// is unknown to the relay and its name is not the host's, yet it delivers, through a server
/// that refuses unencrypted connections. With roots given, require verifies the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_require_and_prefer_encrypt_without_verifying() {
    let t = TlsDb::start().await;
    let require = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require",
        t.port
    );
    t.delivers_with(&require, &[], 1).await;
    let prefer = format!("postgres://postgres@127.0.0.1:{}/postgres", t.port);
    t.delivers_with(&prefer, &[], 2).await;

    t.refuses_another_ca("require");
}

/// verify-full refuses a certificate that names another host, and one from another CA, and
/// says why; verify-ca checks the chain only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_refuses_the_wrong_certificate() {
    let t = TlsDb::start().await;
    let err = t.cannot_connect(&t.verify_full("other.test"));
    assert!(
        err.contains("invalid peer certificate: certificate not valid for name \"other.test\""),
        "{err}"
    );
    assert!(err.contains("db.test"), "{err}");

    t.refuses_another_ca("verify-full");
    t.refuses_another_ca("verify-ca");

    let verify_ca = t.url(
        "other.test",
        &format!("sslmode=verify-ca sslrootcert={}", t.ca_file.display()),
    );
    t.delivers_with(&verify_ca, &[], 1).await;
}

/// Roots without a file named in `DATABASE_URL`: `sslrootcert=system` (here the test's CA,
/// through `SSL_CERT_FILE`, which the system store honours) makes verify-full the default and
/// refuses a weaker mode; verify-full without `sslrootcert` uses the system's roots too, and
/// verify-ca refuses to; libpq's `~/.postgresql/root.crt` is used when it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_roots_from_the_system_and_home() {
    let t = TlsDb::start().await;
    let ca = t.ca_file.display().to_string();
    let other_ca = t
        .files
        .file("other-ca.pem", TestCa::new("another CA").pem());
    let url = |tls: &str| t.url("db.test", tls);
    t.delivers_with(&url("sslrootcert=system"), &[("SSL_CERT_FILE", &ca)], 1)
        .await;
    t.delivers_with(&url("sslmode=verify-full"), &[("SSL_CERT_FILE", &ca)], 2)
        .await;
    let out = t.drain(
        &url("sslmode=verify-full"),
        &[("SSL_CERT_FILE", &other_ca.display().to_string())],
    );
    let err = stderr_of(&out);
    assert!(
        err.contains("invalid peer certificate: UnknownIssuer"),
        "{err}"
    );

    let home_dir = TempDir::new();
    let root_crt = home_dir.path().join(".postgresql/root.crt");
    std::fs::create_dir(root_crt.parent().unwrap()).unwrap();
    std::fs::copy(&t.ca_file, &root_crt).unwrap();
    let home = home_dir.path().display().to_string();
    t.delivers_with(&url("sslmode=verify-full"), &[("HOME", &home)], 3)
        .await;
    t.delivers_with(&url("sslmode=verify-ca"), &[("HOME", &home)], 4)
        .await;
    // With a root.crt, require verifies the chain too.
    std::fs::copy(&other_ca, &root_crt).unwrap();
    let err = stderr_of(&t.drain(&url("sslmode=require"), &[("HOME", &home)]));
    assert!(
        err.contains("invalid peer certificate: UnknownIssuer"),
        "{err}"
    );

    for (tls, says) in [
        (
            "sslmode=require sslrootcert=system",
            "weak sslmode \"require\" may not be used with sslrootcert=system",
        ),
        (
            "sslmode=verify-ca",
            "sslmode=verify-ca needs root certificates",
        ),
    ] {
        let out = t.drain(&url(tls), &[]);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{tls}: {err}");
        assert!(
            err.contains("DATABASE_URL") && err.contains(says),
            "{tls}: {err}"
        );
    }
}

/// `sslcert` and `sslkey`: a role the server lets in only with a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_client_certificates() {
    let t = TlsDb::start().await;
    let owner = t.env.db.connect().await;
    owner
        .batch_execute("CREATE ROLE certuser LOGIN SUPERUSER")
        .await
        .unwrap();
    let client = t.ca.client_cert("certuser");
    let cert = t.files.file("client.crt", &client.cert_pem);
    let key = t.files.file("client.key", &client.key_pem);
    let as_certuser = |tls: &str| {
        t.verify_full("db.test")
            .replace("user=postgres", "user=certuser")
            + " "
            + tls
    };
    let err = t.cannot_connect(&as_certuser(""));
    assert!(
        err.contains("connection requires a valid client certificate"),
        "{err}"
    );
    let with_cert = as_certuser(&format!(
        "sslcert={} sslkey={}",
        cert.display(),
        key.display()
    ));
    t.delivers_with(&with_cert, &[], 1).await;
}

/// sslmode=disable reaches the server, which refuses an unencrypted connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_sslmode_disable() {
    let t = TlsDb::start().await;
    let err = t.cannot_connect(&t.url("db.test", "sslmode=disable"));
    assert!(
        err.contains("pg_hba.conf rejects connection") && err.contains("no encryption"),
        "{err}"
    );
}

// ------------------------------------------------------------------------------------------------
// OpenFGA over https
// ------------------------------------------------------------------------------------------------

/// OpenFGA behind an https front whose certificate comes from a CA of the test's own.
struct HttpsFga {
    env: Env,
    front: HttpsFront,
    ca_file: PathBuf,
    _files: TempDir,
}

impl HttpsFga {
    async fn start() -> HttpsFga {
        let env = Env::start().await;
        let ca = TestCa::new("fga-relay test CA");
        let front = HttpsFront::start(&ca.server_cert(&["127.0.0.1"]), env.fga.addr());
        let files = TempDir::new();
        let ca_file = files.file("ca.pem", ca.pem());
        HttpsFga {
            env,
            front,
            ca_file,
            _files: files,
        }
    }
}

/// With `--ca-file`, the relay checks the store and delivers over https.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openfga_over_https_with_the_ca_file() {
    let h = HttpsFga::start().await;
    let ca = h.ca_file.display().to_string();
    let relay = h
        .env
        .spawn_relay(&[("FGA_API_URL", &h.front.url()), ("FGA_CA_FILE", &ca)]);
    relay.wait_for_log("OpenFGA store found").await;
    relay.wait_for_log("delivering (leader)").await;
    let id = h.env.insert(a_row(1)).await;
    wait_until(PROMPTLY, "the row is delivered over https", || async {
        h.env.row(id).await.delivered
    })
    .await;
    assert!(h.env.fga.has("user:anne", "viewer", "document:1"));
    assert_eq!(h.front.failed_handshakes(), 0);
}

/// Without it (the CA is in no system's roots) the relay cannot: it says it is a certificate
/// error, keeps retrying, and dead-letters nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openfga_over_https_without_the_ca_is_a_certificate_error() {
    let h = HttpsFga::start().await;
    let relay = h.env.spawn_relay(&[("FGA_API_URL", &h.front.url())]);
    relay.wait_for_log("delivering (leader)").await;
    let id = h.env.insert(a_row(1)).await;
    relay.wait_for_log_count("write failed", 2).await;
    let logs = relay.logs();
    let start = log_line(&logs, "cannot check the OpenFGA store now");
    assert!(
        start.contains("invalid peer certificate: UnknownIssuer"),
        "{start}"
    );
    let failures: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("write failed"))
        .collect();
    assert!(
        failures
            .iter()
            .all(|l| l.contains("invalid peer certificate: UnknownIssuer")),
        "{failures:#?}"
    );
    let row = h.env.row(id).await;
    assert!(!row.delivered && !row.dead, "{row:?}");
    assert!(row.attempts >= 2, "{row:?}");
    assert_eq!(h.env.dead().await, 0);
    assert_eq!(h.env.fga.write_count(), 0);
    assert!(h.front.failed_handshakes() >= 2);
}

// ------------------------------------------------------------------------------------------------
// OIDC client credentials
// ------------------------------------------------------------------------------------------------

// A real OpenFGA with `--authn-method oidc`, trusting an issuer of the test's own
// (`tests/common/oidc.rs`), which signs the tokens the relay fetches with client credentials.

async fn oidc_env(issuer: &OidcIssuer) -> Env {
    Env::with_fga(issuer.openfga().start()).await
}

fn spawn_with(env: &Env, vars: &[(&'static str, String)]) -> RelayProc {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.spawn_relay(&vars)
}

/// Inserts `n` rows, one at a time, each delivered before the next, `gap` apart.
async fn deliver_one_by_one(env: &Env, n: usize, gap: Duration) {
    for i in 0..n {
        let id = env.insert(a_row(i)).await;
        env.wait_delivered(id).await;
        tokio::time::sleep(gap).await;
    }
}

/// The Writes the proxy passed on: (the bearer token, OpenFGA's status).
fn write_answers(env: &Env) -> Vec<(Option<String>, u16)> {
    env.fga
        .writes()
        .into_iter()
        .map(|w| (w.authorization, w.status))
        .collect()
}

fn bearer(token: &str) -> Option<String> {
    Some(format!("Bearer {token}"))
}

/// The token is fetched once and sent with every request: ListStores (the store is given by
/// name), GetStore and every Write, all accepted by OpenFGA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_token_is_fetched_once_and_sent() {
    let issuer = OidcIssuer::start(3600);
    let env = oidc_env(&issuer).await;
    let mut vars = issuer.vars(AUDIENCE, CLIENT_SECRET);
    vars.push(("FGA_STORE_ID", String::new()));
    vars.push(("FGA_STORE_NAME", env.fga.store_name().to_owned()));
    let relay = spawn_with(&env, &vars);
    relay.wait_for_log("OpenFGA store found").await;
    relay.wait_for_log("delivering (leader)").await;
    deliver_one_by_one(&env, 5, Duration::ZERO).await;
    let issued = issuer.state().issued.clone();
    assert_eq!(issuer.state().requests, 1, "one token for everything");
    assert_eq!(issued.len(), 1);
    assert_eq!(write_answers(&env), vec![(bearer(&issued[0].0), 200); 5]);
    assert!(!relay.logs().contains(CLIENT_SECRET));
}

/// `FGA_API_SCOPES` and `--api-scopes` reach the issuer as the token request's `scope`,
/// space-separated as the fga CLI sends them; the client secret may be a file (`_FILE`, or the
/// systemd credential `fga-client-secret`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_scopes_are_sent_and_the_secret_may_be_a_file() {
    let issuer = OidcIssuer::start(3600);
    let env = oidc_env(&issuer).await;
    let dir = std::env::temp_dir().join(format!("oidc-scopes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("fga-client-secret");
    std::fs::write(&secret_file, format!("{CLIENT_SECRET}\n")).unwrap();
    let mut vars = issuer.vars(AUDIENCE, CLIENT_SECRET);
    vars.retain(|(k, _)| *k != "FGA_CLIENT_SECRET");

    let mut with_file = vars.clone();
    with_file.push(("FGA_CLIENT_SECRET_FILE", secret_file.display().to_string()));
    with_file.push(("FGA_API_SCOPES", "read:tuples  write:tuples".to_owned()));
    let relay = spawn_with(&env, &with_file);
    relay.wait_for_log("delivering (leader)").await;
    deliver_one_by_one(&env, 1, Duration::ZERO).await;
    assert_eq!(
        issuer.state().scopes,
        [Some("read:tuples write:tuples".to_owned())]
    );
    drop(relay);

    let id = env.insert(a_row(1)).await;
    let mut c = env.command(&[
        "drain",
        "--timeout",
        "20s",
        "--api-scopes",
        "a",
        "--api-scopes",
        "b c",
    ]);
    c.envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("CREDENTIALS_DIRECTORY", &dir);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(env.row(id).await.delivered);
    assert_eq!(
        issuer.state().scopes.last(),
        Some(&Some("a b c".to_owned()))
    );
    assert!(!stderr_of(&out).contains(CLIENT_SECRET));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A token that lives 2 s is replaced at half its life: across 5 s of writes OpenFGA refuses
/// no Write for an expired token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_token_is_refreshed_before_it_expires() {
    let issuer = OidcIssuer::start(2);
    let env = oidc_env(&issuer).await;
    let relay = spawn_with(&env, &issuer.vars(AUDIENCE, CLIENT_SECRET));
    relay.wait_for_log("delivering (leader)").await;
    deliver_one_by_one(&env, 10, Duration::from_millis(500)).await;
    let requests = issuer.state().requests;
    assert!(requests >= 3, "{requests} token requests");
    let answers = write_answers(&env);
    assert!(
        answers.iter().all(|(_, status)| *status == 200),
        "{answers:?}"
    );
    let tokens: std::collections::BTreeSet<_> = answers.into_iter().map(|(t, _)| t).collect();
    assert!(tokens.len() >= 3, "{tokens:?}");
}

/// SIGTERM while a Write waits for a client-credentials token (the issuer slowed to 1.5 s, the
/// token due for refresh): no Write leaves after the signal. The token is fetched before the
/// Write's last look at whether to go on, as what it asks OpenFGA first is; the relay exits 0
/// with the row pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_sigterm_while_a_write_waits_for_its_token_sends_no_write_after_it() {
    let issuer = OidcIssuer::start(2);
    let env = oidc_env(&issuer).await;
    let mut relay = spawn_with(&env, &issuer.vars(AUDIENCE, CLIENT_SECRET));
    relay.wait_for_log("delivering (leader)").await;
    deliver_one_by_one(&env, 1, Duration::ZERO).await;
    let (_, exp) = issuer.state().issued[0].clone();
    // Replaced at half its life: due by the time it expires.
    let expired = std::time::UNIX_EPOCH + Duration::from_secs(exp);
    wait_until(Duration::from_secs(10), "the token is due", || async {
        std::time::SystemTime::now() > expired
    })
    .await;
    issuer.state().delay = Duration::from_millis(1500);
    let asked = issuer.state().requests;
    let id = env.insert(a_row(1)).await;
    wait_until(PROMPTLY, "the Write waits for its token", || async {
        issuer.state().requests > asked
    })
    .await;
    relay.term();
    let signalled = std::time::Instant::now();
    let status = relay.wait_exit(PROMPTLY).await;
    assert!(status.success(), "{status}; its log:\n{}", relay.logs());
    let after = env
        .fga
        .write_heads()
        .into_iter()
        .filter(|(at, _)| *at > signalled)
        .count();
    assert_eq!(
        after,
        0,
        "Write(s) left after SIGTERM; relay log:\n{}",
        relay.logs()
    );
    assert!(!env.row(id).await.delivered);
}

/// A token that expires long before the issuer said it would (`expires_in` an hour, `exp` two
/// seconds): OpenFGA refuses the next Write with 401, and the relay fetches a new token, sends
/// the Write again, and delivers; nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_a_token_that_expires_mid_run_is_fetched_anew() {
    let issuer = OidcIssuer::start(3600);
    issuer.state().lifetime = 2;
    let env = oidc_env(&issuer).await;
    let mut relay = spawn_with(&env, &issuer.vars(AUDIENCE, CLIENT_SECRET));
    relay.wait_for_log("delivering (leader)").await;
    deliver_one_by_one(&env, 1, Duration::ZERO).await;
    let (first, exp) = issuer.state().issued[0].clone();
    let expired = std::time::UNIX_EPOCH + Duration::from_secs(exp) + Duration::from_millis(50);
    wait_until(
        Duration::from_secs(10),
        "the first token expired",
        || async { std::time::SystemTime::now() > expired },
    )
    .await;
    deliver_one_by_one(&env, 1, Duration::ZERO).await;
    let issued = issuer.state().issued.clone();
    assert_eq!(issued.len(), 2, "{} tokens", issued.len());
    assert_eq!(
        write_answers(&env),
        vec![
            (bearer(&first), 200),
            (bearer(&first), 401),
            (bearer(&issued[1].0), 200)
        ]
    );
    assert_eq!(env.dead().await, 0);
    assert!(relay.is_running(), "{}", relay.logs());
}

/// A token for another API the issuer knows (`FGA_API_AUDIENCE` wrong): the issuer hands it
/// out, OpenFGA refuses it (401 `invalid_claims`), and the relay says so as a configuration
/// error, loudly, fetches tokens anew, and dead-letters nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_a_token_for_another_audience_is_loud_and_dead_letters_nothing() {
    let issuer = OidcIssuer::start(3600);
    let env = oidc_env(&issuer).await;
    let relay = spawn_with(&env, &issuer.vars(OTHER_AUDIENCE, CLIENT_SECRET));
    let id = env.insert(a_row(1)).await;
    relay
        .wait_for_log_count("OpenFGA refused the relay's writes", 2)
        .await;
    let logs = relay.logs();
    let line = log_line(&logs, "OpenFGA refused the relay's writes");
    assert!(
        line.contains("ERROR")
            && line.contains("class=\"configuration\"")
            && line.contains("401")
            && line.contains("invalid_claims"),
        "{line}"
    );
    let row = env.row(id).await;
    assert!(!row.delivered && !row.dead && row.attempts >= 2, "{row:?}");
    assert_eq!(env.dead().await, 0);
    let answers = write_answers(&env);
    assert!(
        !answers.is_empty() && answers.iter().all(|(_, status)| *status == 401),
        "{answers:?}"
    );
    assert!(issuer.state().requests >= 2, "a new token after a 401");
    assert!(!env.fga.has("user:anne", "viewer", "document:1"));
}

/// A wrong client secret: the issuer refuses it, the relay logs it as a configuration error
/// (naming the settings to check, never the secret), retries, and dead-letters nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_wrong_client_secret_is_loud_and_dead_letters_nothing() {
    let issuer = OidcIssuer::start(3600);
    let env = oidc_env(&issuer).await;
    let relay = spawn_with(&env, &issuer.vars(AUDIENCE, "not-the-secret"));
    relay.wait_for_log("delivering (leader)").await;
    let id = env.insert(a_row(1)).await;
    relay
        .wait_for_log_count("OpenFGA refused the relay's writes", 2)
        .await;
    let logs = relay.logs();
    let line = log_line(&logs, "OpenFGA refused the relay's writes");
    assert!(
        line.contains("ERROR")
            && line.contains("class=\"configuration\"")
            && line.contains("answered 401 Unauthorized")
            && line.contains("invalid_client")
            && line.contains("FGA_CLIENT_SECRET"),
        "{line}"
    );
    assert!(!logs.contains("not-the-secret"), "{logs}");
    let row = env.row(id).await;
    assert!(!row.delivered && !row.dead && row.attempts >= 2, "{row:?}");
    assert_eq!(env.dead().await, 0);
    assert_eq!(env.fga.write_count(), 0, "no Write without a token");
}

// ------------------------------------------------------------------------------------------------
// Store names
// ------------------------------------------------------------------------------------------------

/// `FGA_STORE_NAME` resolves through ListStores; an unknown name is bad configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_names_resolve_and_an_unknown_one_exits_2() {
    let env = Env::start().await;
    let id = env.insert(a_row(1)).await;
    let out = env
        .command(&["drain", "--timeout", "20s"])
        .env_remove("FGA_STORE_ID")
        .env("FGA_STORE_NAME", env.fga.store_name())
        .output()
        .unwrap();
    assert_success(&out, "drain with FGA_STORE_NAME");
    assert!(env.row(id).await.delivered);

    let out = env
        .command(&["run"])
        .env_remove("FGA_STORE_ID")
        .env("FGA_STORE_NAME", "no-such-store")
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.lines().last().unwrap_or_default(),
        "fga-relay: --store-name (FGA_STORE_NAME): no OpenFGA store is named \"no-such-store\""
    );
}

// ------------------------------------------------------------------------------------------------
// Least-privilege roles
// ------------------------------------------------------------------------------------------------

const ROLES_SQL: &str = include_str!("../../sql/roles.sql");
/// `insufficient_privilege`
const DENIED: &str = "42501";
/// The wake lock's first key (sql/schema/0002_wakeup.sql).
const WAKE_LOCK_CLASS: i32 = 1_718_051_121;

/// A cluster of our own (roles belong to the cluster), migrated by its owner, with
/// `sql/roles.sql` applied (twice: it is idempotent) and a login in each group: `app` writes,
/// `relay` relays.
async fn roles_env() -> Env {
    let env = Env {
        db: TestDb::start_with(PgOptions::default()),
        fga: Fga::start(),
    };
    assert_success(
        &env.command(&["migrate"]).output().unwrap(),
        "fga-relay migrate",
    );
    let owner = env.db.connect().await;
    owner.batch_execute(ROLES_SQL).await.unwrap();
    owner.batch_execute(ROLES_SQL).await.unwrap();
    owner
        .batch_execute(
            "CREATE ROLE app LOGIN IN ROLE fga_outbox_writer; \
             CREATE ROLE relay LOGIN IN ROLE fga_outbox_relay;",
        )
        .await
        .unwrap();
    env
}

fn url_as(env: &Env, user: &str) -> String {
    env.db
        .url()
        .replace("user=postgres", &format!("user={user}"))
}

async fn connect_as(env: &Env, user: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url_as(env, user), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Runs each statement and checks PostgreSQL refused it for want of privilege.
async fn all_denied(client: &tokio_postgres::Client, who: &str, statements: &[&str]) {
    for sql in statements {
        let e = client
            .batch_execute(sql)
            .await
            .expect_err(&format!("{who} may not: {sql}"));
        let code = e.as_db_error().map(|d| d.code().code().to_owned());
        assert_eq!(code.as_deref(), Some(DENIED), "{who}: {sql}: {e:?}");
    }
}

/// The writer inserts, and its trigger notifies a waiting relay; it can read, change or remove
/// nothing, nor forge a row's delivery columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_role_inserts_and_nothing_more() {
    let env = roles_env().await;
    // Stand in for a waiting relay: listen, and hold the wake lock, so the trigger must NOTIFY.
    let (waiter, mut conn) = tokio_postgres::connect(env.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.channel().to_owned());
            }
        }
    });
    waiter
        .batch_execute(&format!(
            "LISTEN fga_outbox; \
             SELECT pg_advisory_lock({WAKE_LOCK_CLASS}, 'fga_outbox'::regclass::oid::integer)"
        ))
        .await
        .unwrap();

    let app = connect_as(&env, "app").await;
    app.execute("INSERT INTO fga_outbox (payload) VALUES ($1)", &[&a_row(1)])
        .await
        .expect("the writer inserts");
    let channel = tokio::time::timeout(PROMPTLY, notifications.recv())
        .await
        .expect("the trigger notified the waiting relay");
    assert_eq!(channel.as_deref(), Some("fga_outbox"));

    all_denied(
        &app,
        "the writer",
        &[
            "SELECT payload FROM fga_outbox",
            "SELECT count(*) FROM fga_outbox",
            "INSERT INTO fga_outbox (payload) VALUES ('{}') RETURNING id",
            "INSERT INTO fga_outbox (payload, processed_at) VALUES ('{}', now())",
            "INSERT INTO fga_outbox (id, payload) VALUES (1000, '{}')",
            "UPDATE fga_outbox SET failed_at = now()",
            "DELETE FROM fga_outbox",
            "TRUNCATE fga_outbox",
            "ALTER TABLE fga_outbox DISABLE TRIGGER fga_outbox_notify",
            "SELECT * FROM fga_outbox_leader",
            "DELETE FROM fga_outbox_leader",
        ],
    )
    .await;
}

/// The writer waits for its own row with `fga_outbox_wait`, which needs no more than the writer
/// role: EXECUTE on it, and the row's id from `lastval()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_role_waits_for_its_rows() {
    let env = roles_env().await;
    let _relay = env.start_relay().await;
    let app = connect_as(&env, "app").await;
    app.execute("INSERT INTO fga_outbox (payload) VALUES ($1)", &[&a_row(1)])
        .await
        .unwrap();
    let id: i64 = app.query_one("SELECT lastval()", &[]).await.unwrap().get(0);
    let answer = crate::common::relay::wait_for(&app, &[id], "10s")
        .await
        .unwrap();
    assert_eq!(answer, "delivered");
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
    // Not granted to everyone: a role outside fga_outbox_writer may not call it.
    let owner = env.db.connect().await;
    owner
        .batch_execute("CREATE ROLE other LOGIN")
        .await
        .unwrap();
    all_denied(
        &connect_as(&env, "other").await,
        "a role that is not a writer",
        &["SELECT fga_outbox_wait('{1}', '0s')"],
    )
    .await;
}

/// The relay's login runs the real `run`, `drain`, `status` and `retry`, and delivers; it
/// cannot delete (so `prune` fails), change a payload, or alter the schema (so `migrate` fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_role_delivers_and_cannot_delete_or_alter() {
    let env = roles_env().await;
    let relay_url = url_as(&env, "relay");
    let as_relay = |args: &[&str]| {
        let mut c = env.command(args);
        c.env("DATABASE_URL", &relay_url);
        c.output().unwrap()
    };
    let app = connect_as(&env, "app").await;
    let insert = |payload: Value| {
        let app = &app;
        async move {
            app.execute("INSERT INTO fga_outbox (payload) VALUES ($1)", &[&payload])
                .await
                .unwrap();
        }
    };

    let mut relay = env.spawn_relay(&[("DATABASE_URL", &relay_url)]);
    relay.wait_for_log("delivering (leader)").await;
    for n in 1..=3 {
        insert(a_row(n)).await;
    }
    insert(json!({"writes": [{"user": "user:anne"}]})).await;
    wait_until(PROMPTLY, "three delivered, one dead", || async {
        env.pending().await == 0 && env.dead().await == 1
    })
    .await;
    assert!((1..=3).all(|n| env.fga.has("user:anne", "viewer", &format!("document:{n}"))));
    relay.term();
    assert!(relay.wait_exit(PROMPTLY).await.success());

    let out = as_relay(&["status", "--json"]);
    assert_success(&out, "status as the relay");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (status["delivered"].as_i64(), status["dead"].as_i64()),
        (Some(3), Some(1))
    );
    let out = as_relay(&["retry", "--dead"]);
    assert_success(&out, "retry as the relay");
    assert_eq!(env.dead().await, 0);
    insert(a_row(4)).await;
    // The row that is no payload dies again: a gate's choice to let that through.
    let out = as_relay(&["drain", "--timeout", "20s", "--allow-dead"]);
    assert_success(&out, "drain as the relay");
    assert!(env.fga.has("user:anne", "viewer", "document:4"));

    let out = as_relay(&["prune", "--older-than", "1h"]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("permission denied for table fga_outbox"),
        "{err}"
    );
    let out = as_relay(&["migrate"]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("migrate failed") && err.contains(&format!("({DENIED})")),
        "{err}"
    );

    let relay = connect_as(&env, "relay").await;
    all_denied(
        &relay,
        "the relay",
        &[
            "DELETE FROM fga_outbox",
            "TRUNCATE fga_outbox",
            "UPDATE fga_outbox SET payload = '{}'",
            "INSERT INTO fga_outbox (payload) VALUES ('{}')",
            "ALTER TABLE fga_outbox ADD COLUMN x integer",
            "DROP TABLE fga_outbox_leader",
            "DELETE FROM fga_outbox_leader",
        ],
    )
    .await;
}

/// `fga-relay sql --roles` prints `sql/roles.sql`, for the configured table.
#[test]
fn roles_sql_is_printed_for_the_table() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::common::relay::BIN)
            .args(args)
            .env_remove("FGA_OUTBOX_TABLE")
            .env_remove("FGA_RELAY_OUTBOX_TABLE")
            .output()
            .unwrap();
        assert_success(&out, "fga-relay sql --roles");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(run(&["sql", "--roles"]), ROLES_SQL);
    let renamed = run(&["sql", "--roles", "--table", "acl_outbox"]);
    assert!(!renamed.contains("fga_outbox"), "{renamed}");
    assert!(
        renamed.contains("CREATE ROLE acl_outbox_writer NOLOGIN")
            && renamed.contains("GRANT INSERT (payload) ON acl_outbox TO acl_outbox_writer")
            && renamed.contains("ON acl_outbox_leader TO acl_outbox_relay"),
        "{renamed}"
    );
}

/// `fga-relay sql --roles | psql -v ON_ERROR_STOP=1`, as the docs show it, with a real psql: the
/// owner of a database, without CREATEROLE, is stopped at the first error while the roles do not
/// exist (psql exits non-zero); once they exist (made for another database of the cluster), it
/// runs without an error, and again, changing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_sql_through_psql_stops_at_its_first_error_and_runs_again_where_the_roles_exist() {
    let db = TestDb::start_with(PgOptions::default());
    let admin = db.connect().await;
    for sql in [
        "CREATE ROLE app_owner LOGIN",
        "CREATE DATABASE app OWNER app_owner",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    let app_url = db.url().replace("dbname=postgres", "dbname=app");
    let owner_url = app_url.replace("user=postgres", "user=app_owner");
    let relay = |url: &str, args: &[&str]| {
        let out =
            crate::common::relay::command(std::path::Path::new(crate::common::relay::BIN), args)
                .env("DATABASE_URL", url)
                .output()
                .unwrap();
        assert_success(&out, &format!("fga-relay {args:?}"));
        out.stdout
    };
    relay(&owner_url, &["migrate"]);
    let roles = relay(&owner_url, &["sql", "--roles"]);
    let psql = |url: &str| {
        let mut child = crate::common::pg::psql(url, &["-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run psql");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&roles).unwrap();
        }
        child.wait_with_output().unwrap()
    };

    // No roles yet, and no right to make them: psql stops at the first error, and says so.
    let out = psql(&owner_url);
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("ERROR").count(), 1, "{err}");
    assert!(err.contains("permission denied to create role"), "{err}");

    // The roles made, for the cluster's first database, by a role that may.
    relay(db.url(), &["migrate"]);
    let out = psql(db.url());
    assert_success(&out, "roles.sql as a superuser");

    // The second database's owner grants on its own table, without a word from PostgreSQL, and
    // a second run changes nothing.
    let (app, conn) = tokio_postgres::connect(&app_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    const STATE: &str = "SELECT concat_ws(' | ', \
          (SELECT relacl::text FROM pg_class WHERE relname = 'fga_outbox'), \
          (SELECT string_agg(attname || '=' || attacl::text, ',' ORDER BY attnum) \
             FROM pg_attribute WHERE attrelid = 'fga_outbox'::regclass AND attacl IS NOT NULL), \
          (SELECT relacl::text FROM pg_class WHERE relname = 'fga_outbox_leader'), \
          (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'public'), \
          shobj_description('fga_outbox_writer'::regrole, 'pg_authid'), \
          shobj_description('fga_outbox_relay'::regrole, 'pg_authid'))";
    let state = || async { app.query_one(STATE, &[]).await.unwrap().get::<_, String>(0) };
    let before = state().await;
    for run in ["first", "second"] {
        let out = psql(&owner_url);
        let err = stderr_of(&out);
        assert_success(
            &out,
            &format!("roles.sql as the owner without CREATEROLE ({run} run)"),
        );
        assert!(
            !err.contains("ERROR") && !err.contains("WARNING"),
            "{run} run:\n{err}"
        );
    }
    let after = state().await;
    assert_ne!(before, after, "the owner's run granted on its table");
    assert!(after.contains("fga_outbox_relay"), "{after}");
    let out = psql(&owner_url);
    assert_success(&out, "roles.sql as the owner, a third time");
    assert_eq!(state().await, after, "running it again changes nothing");
    let comment: Option<String> = app
        .query_one(
            "SELECT shobj_description('fga_outbox_relay'::regrole, 'pg_authid')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        comment.is_some_and(|c| c.starts_with("fga-relay:")),
        "the roles are commented as they are made"
    );
}
