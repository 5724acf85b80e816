//! The OpenFGA HTTP client: Write (and the store check at start), and what every answer means.
//!
//! Every failure is classified as [`WriteError`], using the exact answers OpenFGA gives
//! (reference/openfga-api.md §2): transient (retry the request), rejected for one tuple
//! (dead-letter that row), already applied (an older server's answer to a duplicate write or a
//! missing delete: success for that tuple), or configuration (nothing a row can fix).

use crate::config::{Auth, ConfigError, FgaSettings, Secret, StoreRef};
use crate::payload::Op;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// What a failed Write means for the rows in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// Retry: the next attempt may succeed (network, timeout, 5xx, 429, a write race).
    Transient,
    /// The row holding the named operation can never be delivered as it is.
    Permanent,
    /// The relay's settings or OpenFGA's state: loud errors, keep retrying, dead-letter nothing.
    Configuration,
}

impl FailureClass {
    /// The label used in logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureClass::Transient => "transient",
            FailureClass::Permanent => "permanent",
            FailureClass::Configuration => "configuration",
        }
    }
}

/// A Write that did not succeed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WriteError {
    /// Connection refused or reset, timeout, 5xx, 429, 422 throttling, 409 `Aborted` from a race.
    #[error("{reason}")]
    Transient {
        reason: String,
        /// The server's `Retry-After`, when it sent one.
        retry_after: Option<Duration>,
    },
    /// 429: a rate limiter in front of OpenFGA (OpenFGA itself never sends it). Never the fault
    /// of the rows in the Write: retry them all, as they are, after `Retry-After`.
    #[error("{reason}")]
    Throttled {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// OpenFGA rejected an operation for good (400 `validation_error` for a tuple, 409 condition
    /// conflict). `op` is its index in the request, when the message names it.
    #[error("OpenFGA rejected the write: {code}: {message}")]
    Rejected {
        op: Option<usize>,
        code: String,
        message: String,
    },
    /// An OpenFGA older than 1.10 ignores `on_duplicate`/`on_missing` and answers a duplicate
    /// write or a missing delete with 400 `write_failed_due_to_invalid_input`: that operation is
    /// already in the state asked for.
    #[error("already applied: {message}")]
    AlreadyApplied { op: Option<usize>, message: String },
    /// The request body is larger than OpenFGA, or a proxy in front of it, takes (413, or gRPC's
    /// receive limit): a Write of several rows is halved; a row alone can never be delivered.
    #[error("{reason}")]
    TooLarge { reason: String },
    /// The server allows fewer tuples per Write than `--max-tuples-per-write`.
    #[error("OpenFGA allows fewer tuples per write: {message}")]
    TooManyTuples {
        limit: Option<usize>,
        message: String,
    },
    /// Authentication, store or model: only the operator can fix it. `status` 0: not an answer
    /// of OpenFGA's (a store name that resolves to nothing, a token issuer refusing the
    /// credentials); `message` says what.
    #[error("{}", configuration_message(*status, code, message))]
    Configuration {
        status: u16,
        code: String,
        message: String,
    },
    /// An answer that is not OpenFGA's (a proxy's page, garbage): treated like configuration.
    #[error("unexpected answer from OpenFGA: HTTP {status}: {excerpt}")]
    Unexpected { status: u16, excerpt: String },
}

fn configuration_message(status: u16, code: &str, message: &str) -> String {
    if status == 0 {
        message.to_owned()
    } else {
        format!("OpenFGA answered {status} {code}: {message}")
    }
}

impl WriteError {
    pub fn class(&self) -> FailureClass {
        match self {
            WriteError::Transient { .. } | WriteError::Throttled { .. } => FailureClass::Transient,
            WriteError::Rejected { .. }
            | WriteError::AlreadyApplied { .. }
            | WriteError::TooLarge { .. } => FailureClass::Permanent,
            WriteError::TooManyTuples { .. }
            | WriteError::Configuration { .. }
            | WriteError::Unexpected { .. } => FailureClass::Configuration,
        }
    }

    /// How long the server asked the relay to wait (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            WriteError::Transient { retry_after, .. }
            | WriteError::Throttled { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the same request may succeed later without any change.
    pub fn is_retryable(&self) -> bool {
        !matches!(self.class(), FailureClass::Permanent)
    }
}

/// Why the store could not be checked at start.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Definitive: the store does not exist. Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// OpenFGA could not be asked (down, auth, garbage): not bad configuration, keep going.
    #[error("{0}")]
    Unavailable(String),
}

/// OpenFGA's error body.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

#[derive(Serialize)]
struct WriteBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    writes: Option<WriteKeys<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deletes: Option<DeleteKeys<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    authorization_model_id: Option<&'a str>,
}

#[derive(Serialize)]
struct WriteKeys<'a> {
    tuple_keys: Vec<KeyBody<'a>>,
    on_duplicate: &'static str,
}

#[derive(Serialize)]
struct DeleteKeys<'a> {
    tuple_keys: Vec<KeyBody<'a>>,
    on_missing: &'static str,
}

#[derive(Serialize)]
struct KeyBody<'a> {
    user: &'a str,
    relation: &'a str,
    object: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    condition: Option<ConditionBody<'a>>,
}

#[derive(Serialize)]
struct ConditionBody<'a> {
    name: &'a str,
    context: &'a Map<String, Value>,
}

/// The JSON body of a Write carrying `ops`: writes with `on_duplicate: "ignore"` and deletes
/// with `on_missing: "ignore"`, so that delivering a row again changes nothing (OpenFGA ≥ 1.10).
pub fn write_body(ops: &[&Op], model_id: Option<&str>) -> Vec<u8> {
    let mut writes = Vec::new();
    let mut deletes = Vec::new();
    for op in ops {
        let key = op.key();
        match op {
            Op::Write { condition, .. } => writes.push(KeyBody {
                user: &key.user,
                relation: &key.relation,
                object: &key.object,
                condition: condition.as_ref().map(|c| ConditionBody {
                    name: &c.name,
                    context: &c.context,
                }),
            }),
            Op::Delete { .. } => deletes.push(KeyBody {
                user: &key.user,
                relation: &key.relation,
                object: &key.object,
                condition: None,
            }),
        }
    }
    let body = WriteBody {
        writes: (!writes.is_empty()).then_some(WriteKeys {
            tuple_keys: writes,
            on_duplicate: "ignore",
        }),
        deletes: (!deletes.is_empty()).then_some(DeleteKeys {
            tuple_keys: deletes,
            on_missing: "ignore",
        }),
        authorization_model_id: model_id,
    };
    serde_json::to_vec(&body).expect("a write body always serialises")
}

/// Classifies a non-success answer to a Write carrying `ops`.
pub fn classify(
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
    ops: &[&Op],
) -> WriteError {
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    // 413 comes from a proxy (or a server) with a body limit; OpenFGA's own limit is gRPC's
    // receive limit, answered 500 `resource_exhausted` "grpc: received message larger than max".
    if status == 413
        || parsed.as_ref().is_some_and(|b| {
            b.code == "resource_exhausted" && b.message.contains("received message larger than max")
        })
    {
        let detail = parsed
            .map(|b| format!("{}: {}", b.code, b.message))
            .unwrap_or_else(|| excerpt(body));
        return WriteError::TooLarge {
            reason: format!("OpenFGA answered {status}, the write is too large: {detail}"),
        };
    }
    // 429 (a rate limiter), 408 (a proxy's request timeout) and 5xx, whatever the body (a
    // proxy's HTML 502/503/504 page too): the same request may succeed later.
    if status == 429 || status == 408 || status >= 500 {
        let detail = parsed
            .map(|b| format!("{}: {}", b.code, b.message))
            .unwrap_or_else(|| excerpt(body));
        if status == 429 {
            return WriteError::Throttled {
                reason: format!("OpenFGA answered {status}: {detail}"),
                retry_after,
            };
        }
        return WriteError::Transient {
            reason: format!("OpenFGA answered {status}: {detail}"),
            retry_after,
        };
    }
    let Some(ErrorBody { code, message }) = parsed else {
        return WriteError::Unexpected {
            status,
            excerpt: excerpt(body),
        };
    };
    match (status, code.as_str()) {
        (409, "Aborted") if message.contains("with a different condition") => {
            WriteError::Rejected {
                op: find_by_fields(&message, ops),
                code,
                message,
            }
        }
        (409, _) | (422, _) | (400, "cancelled") => WriteError::Transient {
            reason: format!("OpenFGA answered {status} {code}: {message}"),
            retry_after,
        },
        (400, "write_failed_due_to_invalid_input") => WriteError::AlreadyApplied {
            op: find_by_fields(&message, ops),
            message,
        },
        (400, "exceeded_entity_limit") => WriteError::TooManyTuples {
            limit: message
                .rsplit(' ')
                .next()
                .and_then(|n| n.trim_end_matches('.').parse().ok()),
            message,
        },
        (400, "authorization_model_not_found" | "latest_authorization_model_not_found") => {
            WriteError::Configuration {
                status,
                code,
                message,
            }
        }
        (400, "validation_error")
            if message.contains("WriteRequest.StoreId")
                || message.contains("WriteRequest.AuthorizationModelId")
                || message.contains("invalid schema version")
                || message.contains("invalid on_duplicate option")
                || message.contains("invalid on_missing option") =>
        {
            WriteError::Configuration {
                status,
                code,
                message,
            }
        }
        (400, _) => {
            // `Invalid tuple '…'` names the operation; PGV messages about a tuple field
            // (`invalid TupleKey.Relation: …`) and the duplicate-in-request answer do not, and
            // the row is found by splitting the Write.
            let op = find_by_notation(&message, ops);
            if op.is_some()
                || code == "validation_error"
                || code == "cannot_allow_duplicate_tuples_in_one_request"
            {
                WriteError::Rejected { op, code, message }
            } else {
                WriteError::Configuration {
                    status,
                    code,
                    message,
                }
            }
        }
        _ => WriteError::Configuration {
            status,
            code,
            message,
        },
    }
}

/// The operation named as `Invalid tuple 'object#relation@user'` (optionally followed by
/// ` (condition c)`).
fn find_by_notation(message: &str, ops: &[&Op]) -> Option<usize> {
    ops.iter().position(|op| {
        let k = op.key();
        let needle = format!("Invalid tuple '{}#{}@{}", k.object, k.relation, k.user);
        message.match_indices(&needle).any(|(i, _)| {
            let rest = &message[i + needle.len()..];
            rest.starts_with('\'') || rest.starts_with(" (condition")
        })
    })
}

/// The operation named as `user: '…', relation: '…', object: '…'`; for a duplicate or missing
/// tuple, of the kind the message speaks of.
fn find_by_fields(message: &str, ops: &[&Op]) -> Option<usize> {
    let want_write = if message.contains("cannot delete") {
        Some(false)
    } else if message.contains("cannot write") || message.contains("attempted to write") {
        Some(true)
    } else {
        None
    };
    ops.iter().position(|op| {
        let k = op.key();
        let needle = format!(
            "user: '{}', relation: '{}', object: '{}'",
            k.user, k.relation, k.object
        );
        message.contains(&needle) && want_write.is_none_or(|w| w == op.is_write())
    })
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut out: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        out.push('…');
    }
    if out.is_empty() {
        "(empty body)".to_owned()
    } else {
        out
    }
}

/// Reads `Retry-After`: seconds, or an HTTP date. Values outside 0..=30 min are ignored, as the
/// OpenFGA SDKs do.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let d = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = humantime::parse_rfc3339_weak(value)
            .ok()
            .or_else(|| httpdate(value))?;
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO)
    };
    (d <= Duration::from_secs(1800)).then_some(d)
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form `Retry-After` uses.
fn httpdate(s: &str) -> Option<std::time::SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])?
        + 1;
    let iso = format!("{}-{:02}-{:0>2}T{}Z", parts[3], month, parts[1], parts[4]);
    humantime::parse_rfc3339(&iso).ok()
}

/// A Bearer token fetched with the client-credentials flow, kept until shortly before it expires.
struct CachedToken {
    token: Secret,
    refresh_at: Instant,
}

/// The OpenFGA client.
pub struct FgaClient {
    http: reqwest::Client,
    base: reqwest::Url,
    store: StoreRef,
    /// The store id, once known (at once for `--store-id`, after ListStores for a name).
    store_id: tokio::sync::OnceCell<String>,
    model_id: Option<String>,
    auth: Auth,
    token: Mutex<Option<CachedToken>>,
    /// The deadline of one whole Write call: token, request and the retry after a 401.
    write_deadline: Duration,
}

impl FgaClient {
    /// Builds the client; fails only on settings that can never work (an unreadable CA file).
    pub fn new(settings: &FgaSettings) -> Result<FgaClient, ConfigError> {
        let mut builder = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .connect_timeout(settings.request_timeout.min(Duration::from_secs(5)))
            .tcp_nodelay(true)
            // A redirect means FGA_API_URL is not OpenFGA's address: following it would resend
            // the body (and the token) somewhere the operator never named.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(50))
            .user_agent(concat!("fga-relay/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &settings.ca_file {
            let setting = "--ca-file (FGA_CA_FILE)";
            let pem = std::fs::read(path).map_err(|e| {
                ConfigError::new(setting, format!("cannot read {}: {e}", path.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ConfigError::new(
                    setting,
                    format!("{} holds no PEM certificate: {e}", path.display()),
                )
            })?;
            if certs.is_empty() {
                return Err(ConfigError::new(
                    setting,
                    format!("{} holds no PEM certificate", path.display()),
                ));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| {
            ConfigError::new(
                "--api-url (FGA_API_URL)",
                format!("cannot build a client: {e}"),
            )
        })?;
        let store_id = tokio::sync::OnceCell::new();
        if let StoreRef::Id(id) = &settings.store {
            let _ = store_id.set(id.clone());
        }
        Ok(FgaClient {
            http,
            base: settings.api_url.clone(),
            store: settings.store.clone(),
            store_id,
            model_id: settings.model_id.clone(),
            auth: settings.auth.clone(),
            token: Mutex::new(None),
            write_deadline: settings.request_timeout,
        })
    }

    fn url(&self, path: &str) -> reqwest::Url {
        let mut url = self.base.clone();
        let base_path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{base_path}{path}"));
        url
    }

    /// The Bearer token to send, if any.
    async fn bearer(&self) -> Result<Option<String>, TokenError> {
        match &self.auth {
            Auth::None => Ok(None),
            Auth::ApiToken(t) => Ok(Some(t.expose().to_owned())),
            Auth::ClientCredentials { .. } => {
                let mut cached = self.token.lock().await;
                if let Some(t) = cached.as_ref()
                    && Instant::now() < t.refresh_at
                {
                    return Ok(Some(t.token.expose().to_owned()));
                }
                let fresh = self.fetch_token().await?;
                let token = fresh.token.expose().to_owned();
                *cached = Some(fresh);
                Ok(Some(token))
            }
        }
    }

    /// Forgets a cached token after OpenFGA refused it, so the next request fetches a new one.
    async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    async fn fetch_token(&self) -> Result<CachedToken, TokenError> {
        let Auth::ClientCredentials {
            client_id,
            client_secret,
            token_issuer,
            audience,
            scopes,
        } = &self.auth
        else {
            unreachable!("only called for client credentials");
        };
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_id", client_id.as_str()),
            ("client_secret", client_secret.expose()),
        ];
        if let Some(a) = audience {
            form.push(("audience", a.as_str()));
        }
        if let Some(s) = scopes {
            form.push(("scope", s.as_str()));
        }
        let started = Instant::now();
        let resp = self
            .http
            .post(token_issuer.clone())
            .form(&form)
            .send()
            .await
            .map_err(|e| {
                TokenError::unavailable(format!(
                    "token request to {token_issuer} failed: {}",
                    error_chain(&e)
                ))
            })?;
        let status = resp.status();
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = resp.bytes().await.map_err(|e| {
            TokenError::unavailable(format!(
                "token response from {token_issuer} failed: {}",
                error_chain(&e)
            ))
        })?;
        if !status.is_success() {
            let mut reason = format!(
                "token issuer {token_issuer} answered {status}: {}",
                excerpt(&body)
            );
            if let Some(to) = location {
                reason.push_str(&format!(" (redirect to {to}, not followed)"));
            }
            // 4xx (but a timeout or throttling): the issuer refuses these credentials, which
            // only the operator can fix. 5xx: the issuer is having trouble; retry.
            let refused = status.is_redirection()
                || (status.is_client_error()
                    && status != reqwest::StatusCode::REQUEST_TIMEOUT
                    && status != reqwest::StatusCode::TOO_MANY_REQUESTS);
            return Err(if refused {
                TokenError::refused(format!(
                    "{reason} (check FGA_CLIENT_ID, FGA_CLIENT_SECRET, FGA_API_AUDIENCE and \
                     FGA_API_TOKEN_ISSUER)"
                ))
            } else {
                TokenError::unavailable(reason)
            });
        }
        #[derive(Deserialize)]
        struct TokenBody {
            access_token: String,
            expires_in: Option<u64>,
        }
        let t: TokenBody = serde_json::from_slice(&body).map_err(|e| {
            TokenError::refused(format!(
                "token issuer {token_issuer} answered something that is not a token ({e})"
            ))
        })?;
        // Refresh a minute early (or at half-life for short-lived tokens), so a request never
        // carries a token that expires on its way.
        let lifetime = Duration::from_secs(t.expires_in.unwrap_or(300));
        let margin = Duration::from_secs(60).min(lifetime / 2);
        Ok(CachedToken {
            token: Secret::new(t.access_token),
            refresh_at: started + lifetime - margin,
        })
    }

    /// Sends a request with auth; on a 401 with client credentials, fetches a new token and
    /// tries once more.
    async fn send(
        &self,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SendError> {
        for attempt in 0..2 {
            let mut req = make();
            match self.bearer().await {
                Ok(Some(token)) => req = req.bearer_auth(token),
                Ok(None) => {}
                Err(e) => return Err(SendError::Token(e)),
            }
            let resp = req.send().await.map_err(SendError::Http)?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED
                && matches!(self.auth, Auth::ClientCredentials { .. })
                && attempt == 0
            {
                self.forget_token().await;
                continue;
            }
            return Ok(resp);
        }
        unreachable!("the loop returns on its second pass")
    }

    /// The store id, resolving `--store-name` through ListStores the first time.
    pub async fn store_id(&self) -> Result<&str, PreflightError> {
        self.store_id
            .get_or_try_init(|| async {
                match &self.store {
                    StoreRef::Id(id) => Ok(id.clone()),
                    StoreRef::Name(name) => self.find_store(name).await,
                }
            })
            .await
            .map(String::as_str)
    }

    async fn find_store(&self, name: &str) -> Result<String, PreflightError> {
        let mut found = Vec::new();
        let mut token = String::new();
        loop {
            let mut url = self.url("/stores");
            url.query_pairs_mut()
                .append_pair("name", name)
                .append_pair("page_size", "100");
            if !token.is_empty() {
                url.query_pairs_mut()
                    .append_pair("continuation_token", &token);
            }
            let resp = self
                .send(|| self.http.get(url.clone()))
                .await
                .map_err(|e| PreflightError::Unavailable(e.to_string()))?;
            let status = resp.status();
            let body = resp
                .bytes()
                .await
                .map_err(|e| PreflightError::Unavailable(format!("ListStores: {e}")))?;
            if !status.is_success() {
                return Err(PreflightError::Unavailable(format!(
                    "ListStores answered {status}: {}",
                    excerpt(&body)
                )));
            }
            #[derive(Deserialize)]
            struct Store {
                id: String,
                name: String,
            }
            #[derive(Deserialize)]
            struct Stores {
                #[serde(default)]
                stores: Vec<Store>,
                #[serde(default)]
                continuation_token: String,
            }
            let page: Stores = serde_json::from_slice(&body).map_err(|e| {
                PreflightError::Unavailable(format!("ListStores answered garbage: {e}"))
            })?;
            // Older servers ignore the name filter: filter again here.
            found.extend(page.stores.into_iter().filter(|s| s.name == name));
            if page.continuation_token.is_empty() || page.continuation_token == token {
                break;
            }
            token = page.continuation_token;
        }
        let setting = "--store-name (FGA_STORE_NAME)";
        match found.len() {
            1 => Ok(found.remove(0).id),
            0 => {
                Err(ConfigError::new(setting, format!("no OpenFGA store is named {name:?}")).into())
            }
            n => Err(ConfigError::new(
                setting,
                format!("{n} OpenFGA stores are named {name:?}: give --store-id instead"),
            )
            .into()),
        }
    }

    /// Checks at start that the store exists. A missing store is bad configuration; OpenFGA
    /// being unreachable is not (the relay starts and keeps retrying).
    pub async fn preflight(&self) -> Result<String, PreflightError> {
        let id = self.store_id().await?.to_owned();
        let url = self.url(&format!("/stores/{id}"));
        let resp = self
            .send(|| self.http.get(url.clone()))
            .await
            .map_err(|e| PreflightError::Unavailable(e.to_string()))?;
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        if status.is_success() {
            #[derive(Deserialize)]
            struct Store {
                #[serde(default)]
                name: String,
            }
            let name = serde_json::from_slice::<Store>(&body)
                .map(|s| s.name)
                .unwrap_or_default();
            return Ok(name);
        }
        let code = serde_json::from_slice::<ErrorBody>(&body)
            .map(|b| b.code)
            .unwrap_or_default();
        if status == reqwest::StatusCode::NOT_FOUND && code == "store_id_not_found" {
            return Err(ConfigError::new(
                "--store-id (FGA_STORE_ID)",
                format!("OpenFGA has no store {id}"),
            )
            .into());
        }
        Err(PreflightError::Unavailable(format!(
            "GET /stores/{id} answered {status}: {}",
            excerpt(&body)
        )))
    }

    /// Sends one Write carrying `ops`, all of it (OIDC token fetch, the request, and the retry
    /// after a 401) within one request timeout: a new leader's fence counts on no Write of an
    /// earlier leader lasting longer.
    pub async fn write(&self, ops: &[&Op]) -> Result<(), WriteError> {
        tokio::time::timeout(self.write_deadline, self.write_unbounded(ops))
            .await
            .unwrap_or_else(|_| {
                Err(WriteError::Transient {
                    reason: format!(
                        "the Write (token and retry included) timed out after {:?}",
                        self.write_deadline
                    ),
                    retry_after: None,
                })
            })
    }

    async fn write_unbounded(&self, ops: &[&Op]) -> Result<(), WriteError> {
        let store_id = self.request_store_id().await?;
        let url = self.url(&format!("/stores/{store_id}/write"));
        let body = write_body(ops, self.model_id.as_deref());
        let (status, retry_after, answer) = self.post_json(url, body).await?;
        if (200..300).contains(&status) {
            // OpenFGA answers `{}`. Anything that is not a JSON object came from something else
            // (a proxy's page): the write cannot be taken as done.
            return match serde_json::from_slice::<Value>(&answer) {
                Ok(Value::Object(_)) => Ok(()),
                _ => Err(WriteError::Unexpected {
                    status,
                    excerpt: excerpt(&answer),
                }),
            };
        }
        Err(classify(status, retry_after, &answer, ops))
    }

    /// One page of OpenFGA's Read (reference/openfga-api.md §3): the tuples matching `filter`
    /// (every tuple of the store when `None`), at most `page_size` (1..=[`MAX_READ_PAGE`]) of
    /// them, from `continuation_token` on (empty for the first page), read with
    /// `HIGHER_CONSISTENCY` so that no cache answers for the store. OpenFGA returns tuples in
    /// its own order (insertion order on its SQL datastores, not key order), and an empty token
    /// on the last page.
    ///
    /// Failures are classified as a Write's: [`WriteError::Transient`] may succeed if asked
    /// again; any other class cannot succeed as asked (for a Read, `Rejected` too: there is no
    /// row to blame, the request itself is wrong).
    pub async fn read(
        &self,
        filter: Option<&crate::payload::TupleKey>,
        page_size: u32,
        continuation_token: &str,
    ) -> Result<ReadPage, WriteError> {
        let store_id = self.request_store_id().await?;
        let url = self.url(&format!("/stores/{store_id}/read"));
        let mut body = serde_json::json!({
            "page_size": page_size.clamp(1, MAX_READ_PAGE),
            "consistency": "HIGHER_CONSISTENCY",
        });
        if let Some(k) = filter {
            body["tuple_key"] =
                serde_json::json!({"user": k.user, "relation": k.relation, "object": k.object});
        }
        if !continuation_token.is_empty() {
            body["continuation_token"] = Value::String(continuation_token.to_owned());
        }
        let body = serde_json::to_vec(&body).expect("JSON always serialises");
        let (status, retry_after, answer) = self.post_json(url, body).await?;
        if !(200..300).contains(&status) {
            return Err(classify(status, retry_after, &answer, &[]));
        }
        serde_json::from_slice::<ReadAnswer>(&answer)
            .map(ReadPage::from)
            .map_err(|_| WriteError::Unexpected {
                status,
                excerpt: excerpt(&answer),
            })
    }

    /// The store id for a request; a store that cannot be resolved is classified as a Write's
    /// failure would be (missing: configuration; ListStores unavailable: transient).
    async fn request_store_id(&self) -> Result<&str, WriteError> {
        match self.store_id().await {
            Ok(id) => Ok(id),
            Err(PreflightError::Config(e)) => Err(WriteError::Configuration {
                status: 0,
                code: "store_not_found".into(),
                message: e.to_string(),
            }),
            Err(PreflightError::Unavailable(e)) => Err(WriteError::Transient {
                reason: e,
                retry_after: None,
            }),
        }
    }

    /// POSTs a JSON body with auth; returns the status, `Retry-After` and the answer's body. A
    /// request that got no answer is transient.
    async fn post_json(
        &self,
        url: reqwest::Url,
        body: Vec<u8>,
    ) -> Result<(u16, Option<Duration>, bytes::Bytes), WriteError> {
        let body = bytes::Bytes::from(body);
        let resp = self
            .send(|| {
                self.http
                    .post(url.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await
            .map_err(|e| match e {
                SendError::Token(e) => e.into_write_error(),
                SendError::Http(e) => WriteError::Transient {
                    reason: describe_http_error(&e),
                    retry_after: None,
                },
            })?;
        let status = resp.status().as_u16();
        if resp.status().is_redirection() {
            return Err(redirected(status, resp.headers()));
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let answer = resp.bytes().await.map_err(|e| WriteError::Transient {
            reason: format!(
                "reading OpenFGA's answer failed: {}",
                describe_http_error(&e)
            ),
            retry_after: None,
        })?;
        Ok((status, retry_after, answer))
    }
}

/// A redirect, which is never followed: a configuration error naming where it pointed.
fn redirected(status: u16, headers: &reqwest::header::HeaderMap) -> WriteError {
    let location = headers
        .get(reqwest::header::LOCATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_else(|| "(no Location)".to_owned());
    WriteError::Configuration {
        status,
        code: "redirect".into(),
        message: format!(
            "redirected to {location}; redirects are not followed: set FGA_API_URL to the \
             address OpenFGA answers at"
        ),
    }
}

enum SendError {
    Token(TokenError),
    Http(reqwest::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Token(e) => f.write_str(&e.reason),
            SendError::Http(e) => f.write_str(&describe_http_error(e)),
        }
    }
}

/// No token from the client-credentials flow.
struct TokenError {
    reason: String,
    /// The issuer refused the credentials (or answered garbage): a configuration error, as a
    /// 401 from OpenFGA is. Otherwise it could not be asked: transient.
    refused: bool,
}

impl TokenError {
    fn refused(reason: String) -> Self {
        TokenError {
            reason,
            refused: true,
        }
    }

    fn unavailable(reason: String) -> Self {
        TokenError {
            reason,
            refused: false,
        }
    }

    /// What it means for a Write: refused credentials are the operator's to fix (logged loudly,
    /// retried, nothing dead-lettered); an unreachable issuer is an outage.
    fn into_write_error(self) -> WriteError {
        if self.refused {
            WriteError::Configuration {
                status: 0,
                code: "token_refused".into(),
                message: self.reason,
            }
        } else {
            WriteError::Transient {
                reason: self.reason,
                retry_after: None,
            }
        }
    }
}

/// An error and its causes, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A reqwest error with its causes, which say what really happened (refused, reset, timed out).
fn describe_http_error(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "request timed out"
    } else if e.is_connect() {
        "cannot connect to OpenFGA"
    } else {
        "request to OpenFGA failed"
    };
    match std::error::Error::source(e) {
        Some(cause) => format!("{kind}: {}", error_chain(cause)),
        None => kind.to_owned(),
    }
}

/// The largest page OpenFGA's Read returns (`page_size` is 1..=100).
pub const MAX_READ_PAGE: u32 = 100;

/// One page of a Read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadPage {
    pub tuples: Vec<ReadTuple>,
    /// Where the next page starts; empty when this page is the last.
    pub continuation_token: String,
}

/// A tuple as OpenFGA holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadTuple {
    pub key: crate::payload::TupleKey,
    /// Its condition; OpenFGA returns a stored condition's context as a Struct (`{}` when
    /// empty), whose numbers are doubles.
    pub condition: Option<crate::payload::Condition>,
}

/// A Read's answer: `{"tuples": [{"key": {…, "condition"}, "timestamp"}], "continuation_token"}`.
#[derive(Deserialize)]
struct ReadAnswer {
    #[serde(default)]
    tuples: Vec<ReadAnswerTuple>,
    #[serde(default)]
    continuation_token: Option<String>,
}

#[derive(Deserialize)]
struct ReadAnswerTuple {
    key: ReadAnswerKey,
}

#[derive(Deserialize)]
struct ReadAnswerKey {
    user: String,
    relation: String,
    object: String,
    #[serde(default)]
    condition: Option<ReadAnswerCondition>,
}

#[derive(Deserialize)]
struct ReadAnswerCondition {
    name: String,
    #[serde(default)]
    context: Option<Map<String, Value>>,
}

impl From<ReadAnswer> for ReadPage {
    fn from(a: ReadAnswer) -> ReadPage {
        ReadPage {
            tuples: a
                .tuples
                .into_iter()
                .map(|t| ReadTuple {
                    key: crate::payload::TupleKey {
                        user: t.key.user,
                        relation: t.key.relation,
                        object: t.key.object,
                    },
                    condition: t.key.condition.map(|c| crate::payload::Condition {
                        name: c.name,
                        context: c.context.unwrap_or_default(),
                    }),
                })
                .collect(),
            continuation_token: a.continuation_token.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{Condition, TupleKey};
    use serde_json::json;

    fn key(u: &str, r: &str, o: &str) -> TupleKey {
        TupleKey {
            user: u.into(),
            relation: r.into(),
            object: o.into(),
        }
    }

    fn ops() -> Vec<Op> {
        vec![
            Op::Write {
                key: key("user:ann", "viewer", "document:1"),
                condition: None,
            },
            Op::Write {
                key: key("user:anne", "viewer", "document:1"),
                condition: Some(Condition {
                    name: "non_expired".into(),
                    context: Map::new(),
                }),
            },
            Op::Delete {
                key: key("user:bob", "viewer", "document:1"),
            },
        ]
    }

    fn body(code: &str, message: &str) -> Vec<u8> {
        format!("{}\n", json!({"code": code, "message": message})).into_bytes()
    }

    #[test]
    fn the_write_body_asks_for_idempotent_operations() {
        let ops = ops();
        let refs: Vec<&Op> = ops.iter().collect();
        let v: Value = serde_json::from_slice(&write_body(&refs, Some("01M"))).unwrap();
        assert_eq!(v["writes"]["on_duplicate"], "ignore");
        assert_eq!(v["deletes"]["on_missing"], "ignore");
        assert_eq!(v["writes"]["tuple_keys"].as_array().unwrap().len(), 2);
        assert_eq!(
            v["writes"]["tuple_keys"][1]["condition"]["name"],
            "non_expired"
        );
        assert_eq!(v["deletes"]["tuple_keys"][0]["user"], "user:bob");
        assert_eq!(v["authorization_model_id"], "01M");
        let only_deletes = [&ops[2]];
        let v: Value = serde_json::from_slice(&write_body(&only_deletes, None)).unwrap();
        assert!(v.get("writes").is_none());
        assert!(v.get("authorization_model_id").is_none());
    }

    #[test]
    fn what_stands_in_front_of_openfga_is_classified_too() {
        let ops = ops();
        let refs: Vec<&Op> = ops.iter().collect();
        let html = |s: u16| format!("<html><head><title>{s}</title></head></html>").into_bytes();
        let c = |status, b: Vec<u8>| classify(status, Some(Duration::from_secs(3)), &b, &refs);
        assert!(matches!(c(413, html(413)), WriteError::TooLarge { .. }));
        let grpc_limit = body(
            "resource_exhausted",
            "grpc: received message larger than max (600000 vs. 524288)",
        );
        assert!(matches!(c(500, grpc_limit), WriteError::TooLarge { .. }));
        for status in [408, 502, 503, 504] {
            let e = c(status, html(status));
            assert!(matches!(e, WriteError::Transient { .. }), "{status}: {e:?}");
            assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        }
        let e = c(429, b"".to_vec());
        assert!(matches!(e, WriteError::Throttled { .. }), "{e:?}");
        assert_eq!(e.class(), FailureClass::Transient);
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(c(403, html(403)).class(), FailureClass::Configuration);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::LOCATION,
            "https://login.example/".parse().unwrap(),
        );
        let e = redirected(302, &headers);
        assert_eq!(e.class(), FailureClass::Configuration);
        assert!(e.to_string().contains("https://login.example/"), "{e}");
    }

    #[test]
    fn answers_are_classified_as_openfga_means_them() {
        let ops = ops();
        let refs: Vec<&Op> = ops.iter().collect();
        let c = |status, b: Vec<u8>| classify(status, None, &b, &refs);

        assert_eq!(
            c(500, body("internal_error", "Internal Server Error")).class(),
            FailureClass::Transient
        );
        assert_eq!(
            c(429, b"slow down".to_vec()).class(),
            FailureClass::Transient
        );
        assert_eq!(c(503, b"<html>".to_vec()).class(), FailureClass::Transient);
        let race = "transactional write failed due to conflict: one or more tuples to write were inserted by another transaction";
        assert_eq!(
            c(409, body("Aborted", race)).class(),
            FailureClass::Transient
        );
        assert_eq!(
            c(422, body("throttled_timeout_error", "x")).class(),
            FailureClass::Transient
        );

        // The validation error names the second write, not the first whose user is a prefix.
        match c(
            400,
            body(
                "validation_error",
                "Invalid tuple 'document:1#viewer@user:anne (condition non_expired)'. Reason: undefined condition",
            ),
        ) {
            WriteError::Rejected { op: Some(1), .. } => {}
            other => panic!("{other:?}"),
        }
        match c(
            400,
            body(
                "validation_error",
                "Invalid tuple 'document:1#viewer@user:ann'. Reason: type 'user' not found",
            ),
        ) {
            WriteError::Rejected { op: Some(0), .. } => {}
            other => panic!("{other:?}"),
        }
        match c(
            400,
            body(
                "validation_error",
                "invalid TupleKey.Relation: value does not match regex pattern",
            ),
        ) {
            WriteError::Rejected { op: None, .. } => {}
            other => panic!("{other:?}"),
        }
        let conflict = "transactional write failed due to conflict: attempted to write a tuple which already exists with a different condition: user: 'user:anne', relation: 'viewer', object: 'document:1'";
        match c(409, body("Aborted", conflict)) {
            WriteError::Rejected { op: Some(1), .. } => {}
            other => panic!("{other:?}"),
        }
        let missing = "cannot delete a tuple which does not exist: user: 'user:bob', relation: 'viewer', object: 'document:1': tuple to be written already existed or the tuple to be deleted did not exist";
        match c(400, body("write_failed_due_to_invalid_input", missing)) {
            WriteError::AlreadyApplied { op: Some(2), .. } => {}
            other => panic!("{other:?}"),
        }
        match c(
            400,
            body(
                "exceeded_entity_limit",
                "The number of write operations exceeds the allowed limit of 50",
            ),
        ) {
            WriteError::TooManyTuples {
                limit: Some(50), ..
            } => {}
            other => panic!("{other:?}"),
        }
        for (status, code) in [
            (401, "unauthenticated"),
            (401, "bearer_token_missing"),
            (400, "latest_authorization_model_not_found"),
            (400, "authorization_model_not_found"),
            (404, "undefined_endpoint"),
        ] {
            assert_eq!(
                c(status, body(code, "x")).class(),
                FailureClass::Configuration,
                "{code}"
            );
        }
        assert_eq!(
            c(
                400,
                body(
                    "validation_error",
                    "invalid WriteRequest.StoreId: value does not match regex pattern"
                )
            )
            .class(),
            FailureClass::Configuration
        );
        assert!(matches!(
            c(400, b"<html>bad gateway</html>".to_vec()),
            WriteError::Unexpected { .. }
        ));
        assert!(matches!(c(302, Vec::new()), WriteError::Unexpected { .. }));
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("100000"), None);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
