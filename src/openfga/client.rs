//! The HTTP client: its connection settings, the Write and Read calls, and the deadline of one
//! whole Write.

use super::answer::read_at_most;
use super::auth::{Credentials, TokenError};
use super::classify::{NOT_TLS, WriteError, classify, error_chain, excerpt, not_tls, redirected};
use super::guarded_body::{GuardedBody, refused};
use super::read_page::{MAX_READ_PAGE, ReadAnswer, ReadPage};
use super::retry_after::parse_retry_after;
use super::target::Target;
use super::write_body::write_body;
use crate::config::{Auth, ConfigError, FgaSettings, StoreRef};
use crate::payload::Op;
use crate::send_window::SendWindow;
use serde_json::Value;
use std::time::Duration;

/// The most of an answer the relay reads (see `post_json`).
const MAX_ANSWER: usize = 1 << 20;

/// The OpenFGA client.
pub struct FgaClient {
    pub(super) http: reqwest::Client,
    base: reqwest::Url,
    pub(super) store: StoreRef,
    /// The store id, once known (at once for `--store-id`, after ListStores for a name).
    pub(super) store_id: tokio::sync::OnceCell<String>,
    pub(super) model_id: Option<String>,
    credentials: Credentials,
    /// The deadline of each request a Write makes, and of one whole Write call: the request and
    /// the retry after a 401 (with its token fetch).
    write_deadline: Duration,
    /// When each store was last found to exist (see `store::FgaClient::store_still_exists`).
    pub(super) store_seen: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
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
            let setting = "--ca-file (FGA_RELAY_CA_FILE)";
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
            credentials: Credentials::new(settings.auth.clone()),
            write_deadline: settings.request_timeout,
            store_seen: std::sync::Mutex::default(),
        })
    }

    /// Authenticates with `auth` from the next request on (a SIGHUP reread the token's or the
    /// client secret's file). Returns whether it differs from what was in use.
    pub async fn set_auth(&self, auth: Auth) -> bool {
        self.credentials.replace(auth).await
    }

    pub(super) fn url(&self, path: &str) -> reqwest::Url {
        let mut url = self.base.clone();
        let base_path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{base_path}{path}"));
        url
    }

    /// Sends a request with auth; on a 401 with client credentials, fetches a new token and
    /// tries once more.
    pub(super) async fn send(
        &self,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SendError> {
        self.send_with(None, make).await
    }

    /// [`FgaClient::send`], with `first`, a token taken already, for the first try.
    async fn send_with(
        &self,
        mut first: Option<&str>,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SendError> {
        for attempt in 0..2 {
            let mut req = make();
            let token = match first.take() {
                Some(t) => Ok(Some(t.to_owned())),
                None => self.credentials.bearer(&self.http).await,
            };
            match token {
                Ok(Some(token)) => req = req.bearer_auth(token),
                Ok(None) => {}
                Err(e) => return Err(SendError::Token(e)),
            }
            let resp = req.send().await.map_err(SendError::Http)?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED
                && matches!(self.credentials.auth(), Auth::ClientCredentials { .. })
                && attempt == 0
            {
                self.credentials.forget_token().await;
                continue;
            }
            return Ok(resp);
        }
        unreachable!("the loop returns on its second pass")
    }

    /// What a Write to `target` asks before it leaves: a client-credentials token when one is
    /// due (the issuer), the store's id (ListStores, while `--store-name` is not resolved yet)
    /// and whether the store still exists (GetStore, on a store's first Write and then every
    /// few seconds; see [`FgaClient::ready`]). Each ends
    /// within one request timeout and is told to `step` as it ends. Asked before the Write's
    /// rows are locked and before its last look at the stream's `keep_going`, so that a Write
    /// that passes that look leaves at once.
    pub async fn prepare<'a>(
        &'a self,
        target: &'a Target,
        step: &(dyn Fn() + Sync),
    ) -> Result<Prepared<'a>, WriteError> {
        // Before the Write's deadline starts: a GetStore sends nothing a fence must wait for,
        // and its token fetch must not eat into the Write's time.
        // Taken now, and carried to the Write's first request: a token fetched here must not be
        // fetched again after the last look at whether to go on (one that lives less than
        // twice the issuer's answer is due again as it comes).
        let due = self.credentials.token_due();
        let token = self
            .within_deadline(
                "fetching a token from the issuer",
                self.credentials.bearer(&self.http),
            )
            .await;
        if due {
            step();
        }
        let token = token?.map_err(TokenError::into_write_error)?;
        let store_id: &str = match &target.store {
            Some(id) => id,
            None => match self.configured_store_id() {
                Some(id) => id,
                None => {
                    let id = self
                        .within_deadline("resolving the store's name", self.request_store_id())
                        .await;
                    step();
                    id??
                }
            },
        };
        // A GetStore that does not answer in time is no reason to hold, as one that fails is
        // not: the Write tells what it can.
        if !self.store_checked(store_id) {
            let exists = tokio::time::timeout(
                self.write_deadline,
                self.store_still_exists(store_id, target.store.is_none()),
            )
            .await;
            step();
            if let Ok(exists) = exists {
                exists?;
            }
        }
        let model = match &target.model {
            Some(m) => Some(&**m),
            None if target.store.is_none() => self.model_id.as_deref(),
            None => None,
        };
        Ok(Prepared {
            target,
            store_id,
            model,
            token,
        })
    }

    /// Whether a Write to `target` can leave without asking anything first (OpenFGA, the token
    /// issuer): [`FgaClient::prepare`] answers at once.
    pub fn ready(&self, target: &Target) -> bool {
        let store_id = match &target.store {
            Some(id) => Some(&**id),
            None => self.configured_store_id(),
        };
        store_id.is_some_and(|id| self.store_checked(id)) && !self.credentials.token_due()
    }

    /// Sends one Write carrying `ops` where `to` says, in steps that each end within one
    /// request timeout and are told to `step` as they end: the Write itself (the request, and
    /// the retry after a 401 with the token fetch it needs), and what a refusal needs asked
    /// after it (whether a store or model a row names exists). A new leader's fence counts on no Write
    /// of an earlier leader lasting longer than its deadline; the relay's liveness, on no step
    /// lasting longer than a request timeout. The Write's body leaves only while `window` is
    /// open.
    pub async fn write(
        &self,
        to: &Prepared<'_>,
        ops: &[&Op],
        window: &SendWindow,
        step: &(dyn Fn() + Sync),
    ) -> Result<(), WriteError> {
        let written = self
            .within_deadline(
                "the Write (token and retry included)",
                self.write_unbounded(to, ops, window),
            )
            .await
            .and_then(|w| w);
        step();
        match written {
            Err(e) if to.target.store.is_some() || to.target.model.is_some() => {
                let e = self.named_target_missing(to.target, to.store_id, e).await;
                step();
                Err(e)
            }
            other => other,
        }
    }

    /// `f`, given up after one request timeout as a transient failure: nothing a fence waits
    /// for, and no step the relay's liveness could take for a stuck loop, lasts longer.
    pub async fn within_deadline<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = T>,
    ) -> Result<T, WriteError> {
        tokio::time::timeout(self.write_deadline, f)
            .await
            .map_err(|_| WriteError::Transient {
                reason: format!("{what} timed out after {:?}", self.write_deadline),
                retry_after: None,
            })
    }

    async fn write_unbounded(
        &self,
        to: &Prepared<'_>,
        ops: &[&Op],
        window: &SendWindow,
    ) -> Result<(), WriteError> {
        let url = self.url(&format!("/stores/{}/write", to.store_id));
        let body = write_body(ops, to.model);
        let (status, retry_after, answer) = self
            .post_json(url, body, Some(window), to.token.as_deref())
            .await?;
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

    /// One page of OpenFGA's Read of `store` (the configured one for `None`), as its source
    /// answers it: the tuples matching `filter`
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
        store: Option<&str>,
        filter: Option<&crate::payload::TupleKey>,
        page_size: u32,
        continuation_token: &str,
    ) -> Result<ReadPage, WriteError> {
        let store_id = match store {
            Some(id) => id,
            None => self.request_store_id().await?,
        };
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
        let (status, retry_after, answer) = self.post_json(url, body, None, None).await?;
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

    /// POSTs a JSON body with auth (`token` for the first try, if given); returns the status,
    /// `Retry-After` and the answer's body. A request that got no answer is transient. With a
    /// `window`, the body leaves only while it is open.
    pub(super) async fn post_json(
        &self,
        url: reqwest::Url,
        body: Vec<u8>,
        window: Option<&SendWindow>,
        token: Option<&str>,
    ) -> Result<(u16, Option<Duration>, bytes::Bytes), WriteError> {
        let body = bytes::Bytes::from(body);
        let resp = self
            .send_with(token, || {
                let body = match window {
                    Some(w) => reqwest::Body::wrap(GuardedBody::new(body.clone(), w.clone())),
                    None => reqwest::Body::from(body.clone()),
                };
                self.http
                    .post(url.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body)
            })
            .await
            .map_err(|e| match e {
                SendError::Token(e) => e.into_write_error(),
                SendError::Http(e) if refused(&e) => WriteError::NotSent,
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
        // OpenFGA answers a Write with `{}` or an error of a few hundred bytes, a proxy with a
        // page of a few kB. Past MAX_ANSWER the rest is not read (its start classifies it):
        // a misbehaving hop cannot make the relay hold an endless body in memory.
        let (answer, _) =
            read_at_most(resp, MAX_ANSWER)
                .await
                .map_err(|e| WriteError::Transient {
                    reason: format!(
                        "reading OpenFGA's answer failed: {}",
                        describe_http_error(&e)
                    ),
                    retry_after: None,
                })?;
        Ok((status, retry_after, answer.into()))
    }
}

pub(super) enum SendError {
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

/// A reqwest error with its causes, which say what really happened (refused, reset, timed out).
fn describe_http_error(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "request timed out"
    } else if e.is_connect() {
        "cannot connect to OpenFGA"
    } else {
        "request to OpenFGA failed"
    };
    let said = match std::error::Error::source(e) {
        Some(cause) => format!("{kind}: {}", error_chain(cause)),
        None => kind.to_owned(),
    };
    if not_tls(e) {
        return format!("{said}: {NOT_TLS}");
    }
    said
}

/// Where a Write goes, as [`FgaClient::prepare`] found it, and the Bearer token it sends.
pub struct Prepared<'a> {
    target: &'a Target,
    store_id: &'a str,
    model: Option<&'a str>,
    token: Option<String>,
}
