//! An OpenID Connect issuer of the test's own, on loopback, for a real OpenFGA started with
//! `--authn-method oidc` (`FgaBuilder::oidc`): the discovery document OpenFGA reads at start
//! (`/.well-known/openid-configuration`), its key set (`/jwks.json`), and a token endpoint
//! (`/oauth/token`) answering the client-credentials grant the relay uses, with RS256 tokens it
//! signs with an RSA key made here. OpenFGA checks them as it would an identity provider's: the
//! signature against the key set, `iss`, `aud`, `exp` and `iat`.
//!
//! A token's `exp` and the `expires_in` the endpoint answers are set apart, so that a test can
//! hand out a token that expires well before the relay thinks it does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rcgen::SigningKey;
use serde_json::{Value, json};

use super::fga::{Fga, FgaBuilder};
use super::tls::{Background, bind_local};

/// The client the issuer knows, and its secret.
pub const CLIENT_ID: &str = "fga-relay-test";
pub const CLIENT_SECRET: &str = "s3cret-client-secret";
/// OpenFGA's audience: the tokens OpenFGA accepts name it in `aud`.
pub const AUDIENCE: &str = "https://fga.example/";
/// Another API the issuer knows: it hands out tokens for it, which OpenFGA refuses.
pub const OTHER_AUDIENCE: &str = "https://billing.example/";

const KEY_ID: &str = "test-key-1";

/// What the issuer has done, and how it hands out tokens.
#[derive(Default)]
pub struct IssuerState {
    /// `expires_in` in the token endpoint's answers, in seconds.
    pub expires_in: u64,
    /// How long a token really lives (its `exp`), in seconds: `expires_in` unless set apart.
    pub lifetime: u64,
    /// Token requests received, good or bad.
    pub requests: usize,
    /// The `scope` of each token request, as received.
    pub scopes: Vec<Option<String>>,
    /// Tokens handed out to the client, in order, with their `exp` (seconds since the epoch).
    pub issued: Vec<(String, u64)>,
    /// How long the token endpoint waits before it answers (a slow issuer).
    pub delay: Duration,
}

/// The issuer: its URL (the `iss` of its tokens), its key, and what it did.
pub struct OidcIssuer {
    url: String,
    key: Arc<rcgen::KeyPair>,
    state: Arc<Mutex<IssuerState>>,
    _server: Background,
}

#[derive(Clone)]
struct Shared {
    url: String,
    key: Arc<rcgen::KeyPair>,
    state: Arc<Mutex<IssuerState>>,
}

impl OidcIssuer {
    /// An issuer whose tokens say and last `expires_in` seconds.
    pub fn start(expires_in: u64) -> OidcIssuer {
        let key = Arc::new(
            rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key pair"),
        );
        let state = Arc::new(Mutex::new(IssuerState {
            expires_in,
            lifetime: expires_in,
            ..IssuerState::default()
        }));
        let (listener, addr) = bind_local();
        let url = format!("http://{addr}");
        let shared = Shared {
            url: url.clone(),
            key: key.clone(),
            state: state.clone(),
        };
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(discovery),
            )
            .route("/jwks.json", axum::routing::get(jwks))
            .route("/oauth/token", axum::routing::post(token))
            .with_state(shared);
        let server = Background::spawn("oidc-issuer", move || async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(listener, app).await;
        });
        OidcIssuer {
            url,
            key,
            state,
            _server: server,
        }
    }

    /// The token endpoint, the relay's `FGA_API_TOKEN_ISSUER`.
    pub fn token_endpoint(&self) -> String {
        format!("{}/oauth/token", self.url)
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, IssuerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A token for `audience`, living `lifetime`, for the harness's own calls (not counted as
    /// the client's).
    pub fn mint(&self, audience: &str, lifetime: Duration) -> String {
        sign(
            &self.key,
            &self.url,
            "test-harness",
            audience,
            lifetime.as_secs(),
        )
        .0
    }

    /// A real OpenFGA of its own that trusts this issuer, for tokens naming [`AUDIENCE`].
    pub fn openfga(&self) -> FgaBuilder {
        Fga::builder().oidc(
            &self.url,
            AUDIENCE,
            self.mint(AUDIENCE, Duration::from_secs(24 * 3600)),
        )
    }

    /// The relay's settings for this issuer, with `audience` and `secret`.
    pub fn vars(&self, audience: &str, secret: &str) -> Vec<(&'static str, String)> {
        vec![
            ("FGA_CLIENT_ID", CLIENT_ID.to_owned()),
            ("FGA_CLIENT_SECRET", secret.to_owned()),
            ("FGA_API_TOKEN_ISSUER", self.token_endpoint()),
            ("FGA_API_AUDIENCE", audience.to_owned()),
        ]
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs()
}

/// A JWT signed with RS256: (the token, its `exp`). `exp` is a whole second at least
/// `lifetime` from now.
fn sign(
    key: &rcgen::KeyPair,
    issuer: &str,
    subject: &str,
    audience: &str,
    lifetime: u64,
) -> (String, u64) {
    let now = now_secs();
    let exp = now + 1 + lifetime;
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": KEY_ID});
    let claims = json!({
        "iss": issuer,
        "sub": subject,
        "azp": subject,
        "aud": audience,
        "iat": now,
        "exp": exp,
        // Unique even for two tokens of the same second.
        "jti": format!("{:x}", fastrand::u64(..)),
    });
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = key.sign(signed.as_bytes()).expect("sign with RS256");
    (
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)),
        exp,
    )
}

/// The discovery document: OpenFGA reads `issuer` and `jwks_uri` from it at start.
async fn discovery(axum::extract::State(s): axum::extract::State<Shared>) -> axum::Json<Value> {
    axum::Json(json!({
        "issuer": s.url,
        "jwks_uri": format!("{}/jwks.json", s.url),
        "token_endpoint": format!("{}/oauth/token", s.url),
        "grant_types_supported": ["client_credentials"],
        "id_token_signing_alg_values_supported": ["RS256"],
    }))
}

/// The key set: the RSA public key's modulus and exponent, from its PKCS#1 DER.
async fn jwks(axum::extract::State(s): axum::extract::State<Shared>) -> axum::Json<Value> {
    let (n, e) = rsa_public_numbers(s.key.public_key_raw());
    axum::Json(json!({"keys": [{
        "kty": "RSA",
        "use": "sig",
        "alg": "RS256",
        "kid": KEY_ID,
        "n": URL_SAFE_NO_PAD.encode(n),
        "e": URL_SAFE_NO_PAD.encode(e),
    }]}))
}

/// `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`: the two integers'
/// bytes, without the sign byte DER puts before a high bit.
fn rsa_public_numbers(der: &[u8]) -> (Vec<u8>, Vec<u8>) {
    /// One DER element at `at`: (its tag, its contents, where the next one starts).
    fn element(der: &[u8], at: usize) -> (u8, &[u8], usize) {
        let tag = der[at];
        let (len, start) = match der[at + 1] {
            short if short < 0x80 => (usize::from(short), at + 2),
            long => {
                let bytes = usize::from(long & 0x7f);
                let len = der[at + 2..at + 2 + bytes]
                    .iter()
                    .fold(0, |acc, b| acc << 8 | usize::from(*b));
                (len, at + 2 + bytes)
            }
        };
        (tag, &der[start..start + len], start + len)
    }
    let (tag, sequence, _) = element(der, 0);
    assert_eq!(tag, 0x30, "an RSAPublicKey is a SEQUENCE");
    let (_, n, next) = element(sequence, 0);
    let (_, e, _) = element(sequence, next);
    let unsigned = |i: &[u8]| i.strip_prefix(&[0]).unwrap_or(i).to_vec();
    (unsigned(n), unsigned(e))
}

/// `POST /oauth/token` as an OAuth2 server answers the client-credentials grant (RFC 6749
/// §4.4): for its client, and an audience it knows.
async fn token(
    axum::extract::State(s): axum::extract::State<Shared>,
    axum::Form(form): axum::Form<HashMap<String, String>>,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    use axum::http::StatusCode;
    let delay = {
        let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
        state.requests += 1;
        state.delay
    };
    tokio::time::sleep(delay).await;
    let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
    let field = |k: &str| form.get(k).map(String::as_str);
    state.scopes.push(field("scope").map(str::to_owned));
    if field("grant_type") != Some("client_credentials") {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "unsupported_grant_type"})),
        );
    }
    if field("client_id") != Some(CLIENT_ID) || field("client_secret") != Some(CLIENT_SECRET) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "invalid_client"})),
        );
    }
    let Some(audience) = field("audience").filter(|a| [AUDIENCE, OTHER_AUDIENCE].contains(a))
    else {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(json!({"error": "access_denied"})),
        );
    };
    let (token, exp) = sign(&s.key, &s.url, CLIENT_ID, audience, state.lifetime);
    state.issued.push((token.clone(), exp));
    (
        StatusCode::OK,
        axum::Json(
            json!({"access_token": token, "token_type": "Bearer", "expires_in": state.expires_in}),
        ),
    )
}
