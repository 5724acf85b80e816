//! The fault proxy in front of a real OpenFGA: it passes every request on, records each Write,
//! and injects into Writes what a real server cannot be made to do on demand (5xx, 429, hangs,
//! dropped connections, a proxy's 413 and HTML pages, a Write applied late), the same into
//! ListStores (a `--store-name` that cannot be resolved), GetStore and Read (a slow store lookup
//! or read-back), and plays an OIDC gateway when a test wants one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Request, State};
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use serde_json::{Value, json};

use super::faults::{Fault, FaultRule, Latency, RandomFaults, Route};
use super::records::WriteRecord;
use super::server::ConnCtl;

pub(super) type BearerCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub(super) struct Proxy {
    pub(super) upstream: String,
    /// When set, every route but `/healthz` wants `Authorization: Bearer <t>` with `check(t)`,
    /// answered as OpenFGA's OIDC authenticator answers.
    pub(super) bearer: Option<BearerCheck>,
    client: reqwest::Client,
    state: Mutex<ProxyState>,
}

#[derive(Default)]
pub(super) struct ProxyState {
    pub(super) writes: Vec<WriteRecord>,
    pub(super) faults: VecDeque<FaultRule>,
    pub(super) random: Option<RandomFaults>,
    pub(super) latency: Option<Latency>,
    pub(super) body_limit: Option<usize>,
    /// Every Write request as its head arrived (before its body, which a leader may cut short):
    /// when, and its raw `Authorization` header.
    pub(super) heads: Vec<(Instant, Option<String>)>,
    /// Every connection its client ended (closed, or broke off in the middle of a request):
    /// when, and the `Authorization` header of its first request (`None`: it sent none).
    pub(super) ends: Vec<(Instant, Option<String>)>,
    /// Every request but `/healthz` hangs, never answered: OpenFGA (and whatever is in front of
    /// it) hung as a whole, its store lookups and reads as well as its Writes.
    pub(super) hanging: bool,
    /// Each request of a route other than Write's (ListStores, GetStore, Read), in arrival
    /// order, with the status answered: 0 while unanswered, and for `Hang` and
    /// `CloseConnection`.
    pub(super) others: Vec<(Route, u16)>,
}

impl Proxy {
    pub(super) fn new(upstream: String, bearer: Option<BearerCheck>) -> Proxy {
        Proxy {
            upstream,
            bearer,
            client: reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("proxy client"),
            state: Mutex::default(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ProxyState> {
        // A panicking test thread must not poison the proxy for the other requests.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, path: &str, body: &Bytes, headers: &HeaderMap) -> usize {
        let mut state = self.state();
        state.writes.push(WriteRecord {
            received_at: Instant::now(),
            store: store_of(path).to_owned(),
            body: body_as_json(body),
            status: 0,
            answered_at: None,
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        });
        state.writes.len() - 1
    }

    fn finish(&self, index: usize, status: u16) {
        if let Some(record) = self.state().writes.get_mut(index) {
            record.status = status;
            record.answered_at = Some(Instant::now());
        }
    }

    /// Passes a request on to the real server, and its answer back.
    async fn forward(&self, method: &str, path: &str, headers: &HeaderMap, body: Bytes) -> Reply {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.upstream))
            .body(body);
        for (name, value) in headers {
            if name != header::HOST && name != header::CONTENT_LENGTH && name != header::CONNECTION
            {
                request = request.header(name.as_str(), value.as_bytes());
            }
        }
        let answer = match request.send().await {
            Ok(a) => a,
            Err(e) => return Reply::error(502, "proxy_error", &format!("upstream: {e}")),
        };
        let status = answer.status().as_u16();
        let mut reply_headers = Vec::new();
        for (name, value) in answer.headers() {
            if name != header::TRANSFER_ENCODING
                && name != header::CONTENT_LENGTH
                && name != header::CONNECTION
            {
                reply_headers.push((name.as_str().to_owned(), value.as_bytes().to_vec()));
            }
        }
        let body = answer.bytes().await.unwrap_or_default();
        Reply {
            status,
            headers: reply_headers,
            body,
        }
    }

    fn take_fault(
        &self,
        route: Route,
        store: &str,
        keys: &[(String, String, String)],
    ) -> Option<Fault> {
        let mut state = self.state();
        let index = state.faults.iter().position(|rule| {
            rule.times > 0
                && rule.route == route
                && rule
                    .only_if_tuple
                    .as_ref()
                    .is_none_or(|wanted| keys.iter().any(|k| k == wanted))
                && rule.only_if_store.as_deref().is_none_or(|s| s == store)
        });
        let Some(index) = index else {
            // Latency and random faults are a Write's.
            if route != Route::Write {
                return None;
            }
            let latency = state.latency.map(|l| Fault::Delay(l.draw()));
            return match &state.random {
                Some(random) => random.draw().or(latency),
                None => latency,
            };
        };
        let rule = &mut state.faults[index];
        rule.times -= 1;
        let fault = rule.fault.clone();
        if rule.times == 0 {
            state.faults.remove(index);
        }
        Some(fault)
    }

    /// A Write: recorded, then faulted or passed on. Passed on from a task of its own, so that
    /// it lands even when the client stops waiting and this handler is dropped with its
    /// connection, as with a server that already took the request.
    async fn write(
        self: &Arc<Self>,
        path: String,
        headers: HeaderMap,
        body: Bytes,
        conn: &ConnCtl,
    ) -> Reply {
        let index = self.record(&path, &body, &headers);
        let limit = self.state().body_limit;
        let fault = if limit.is_some_and(|l| body.len() > l) {
            Some(Fault::html(413, "Request Entity Too Large"))
        } else {
            self.take_fault(Route::Write, store_of(&path), &tuple_keys(&body))
        };
        let (delay, answer_instead) = match faulted(fault, conn).await {
            Faulted::Answer(reply) => {
                self.finish(index, reply.status);
                return reply;
            }
            Faulted::Forward { delay, instead } => (delay, instead),
        };
        let proxy = Arc::clone(self);
        let task = tokio::spawn(async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let mut reply = proxy.forward("POST", &path, &headers, body).await;
            if let Some(fault) = answer_instead {
                reply = Reply::fault(fault);
            }
            proxy.finish(index, reply.status);
            reply
        });
        task.await
            .unwrap_or_else(|_| Reply::error(500, "internal_error", "Internal Server Error"))
    }

    /// A request of a route other than Write's, recorded with its answer, faulted or passed on.
    async fn other(
        &self,
        route: Route,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
        conn: &ConnCtl,
    ) -> Reply {
        let index = {
            let mut state = self.state();
            state.others.push((route, 0));
            state.others.len() - 1
        };
        let reply = match faulted(self.take_fault(route, store_of(path), &[]), conn).await {
            Faulted::Answer(reply) => reply,
            Faulted::Forward { delay, instead } => {
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                let reply = self.forward(method, path, headers, body).await;
                instead.map_or(reply, Reply::fault)
            }
        };
        if let Some((_, status)) = self.state().others.get_mut(index) {
            *status = reply.status;
        }
        reply
    }
}

/// What a fault makes of a request: an answer of the proxy's own, or the request passed on
/// (after `delay`; answered with `instead` rather than the server's answer). A hang or a
/// dropped connection never returns: the handler ends with its connection.
enum Faulted {
    Answer(Reply),
    Forward {
        delay: Option<std::time::Duration>,
        instead: Option<Fault>,
    },
}

async fn faulted(fault: Option<Fault>, conn: &ConnCtl) -> Faulted {
    match fault {
        None => Faulted::Forward {
            delay: None,
            instead: None,
        },
        Some(Fault::Applied(then)) => Faulted::Forward {
            delay: None,
            instead: Some(*then),
        },
        Some(Fault::Delay(d)) => Faulted::Forward {
            delay: Some(d),
            instead: None,
        },
        Some(Fault::Hang) => std::future::pending().await,
        Some(Fault::CloseConnection) => {
            conn.kill.cancel();
            std::future::pending().await
        }
        Some(other) => Faulted::Answer(Reply::fault(other)),
    }
}

pub(super) fn router(proxy: Arc<Proxy>) -> Router {
    Router::new().fallback(handle).with_state(proxy)
}

async fn handle(
    State(proxy): State<Arc<Proxy>>,
    Extension(conn): Extension<ConnCtl>,
    request: Request,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    if is_write(parts.method.as_str(), parts.uri.path()) {
        let auth = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        proxy.state().heads.push((Instant::now(), auth));
    }
    let _ = conn.owner.set(
        parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    if parts.uri.path() != "/healthz" && proxy.state().hanging {
        // Ends when the connection is dropped (`set_refusing`, or the `Fga` dropped).
        std::future::pending::<()>().await;
    }
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if parts.uri.path() != "/healthz"
        && let Some(check) = &proxy.bearer
    {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let refusal = match token {
            None => Some(("bearer_token_missing", "missing bearer token")),
            Some(t) if !check(t) => Some(("invalid_claims", "invalid claims")),
            Some(_) => None,
        };
        if let Some((code, message)) = refusal {
            if is_write(parts.method.as_str(), parts.uri.path()) {
                let index = proxy.record(parts.uri.path(), &body, &parts.headers);
                proxy.finish(index, 401);
            }
            return Reply::error(401, code, message).into_response();
        }
    }
    let method = parts.method.as_str();
    let reply = match Route::of(method, parts.uri.path()) {
        Some(Route::Write) => proxy.write(path, parts.headers, body, &conn).await,
        Some(route) => {
            proxy
                .other(route, method, &path, &parts.headers, body, &conn)
                .await
        }
        None => proxy.forward(method, &path, &parts.headers, body).await,
    };
    reply.into_response()
}

/// The store of a `/stores/{store}/...` path; empty for any other.
fn store_of(path: &str) -> &str {
    path.strip_prefix("/stores/")
        .and_then(|rest| rest.split(['/', '?']).next())
        .unwrap_or("")
}

fn is_write(method: &str, path: &str) -> bool {
    Route::of(method, path) == Some(Route::Write)
}

/// The (user, relation, object) of every operation in a Write body; none when it is not JSON.
fn tuple_keys(body: &[u8]) -> Vec<(String, String, String)> {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for side in ["writes", "deletes"] {
        for key in value[side]["tuple_keys"].as_array().into_iter().flatten() {
            let text = |k: &str| key[k].as_str().unwrap_or_default().to_owned();
            keys.push((text("user"), text("relation"), text("object")));
        }
    }
    keys
}

pub(super) fn body_as_json(body: &[u8]) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// An answer, before it becomes an HTTP one.
pub(super) struct Reply {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
}

impl Reply {
    /// OpenFGA's error envelope (Go's `json.Encoder` adds the newline).
    fn error(status: u16, code: &str, message: &str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: format!("{}\n", json!({ "code": code, "message": message })).into(),
        }
    }

    fn fault(fault: Fault) -> Reply {
        match fault {
            Fault::Status {
                status,
                code,
                message,
                retry_after,
            } => {
                let mut reply = Reply::error(status, &code, &message);
                if let Some(secs) = retry_after {
                    reply
                        .headers
                        .push(("retry-after".into(), secs.into_bytes()));
                }
                reply
            }
            Fault::Garbage {
                status,
                content_type,
                body,
            } => Reply {
                status,
                headers: vec![("content-type".into(), content_type.into_bytes())],
                body: body.into(),
            },
            Fault::Redirect { status, location } => Reply {
                status,
                headers: vec![("location".into(), location.into_bytes())],
                body: Bytes::new(),
            },
            Fault::Delay(_) | Fault::Hang | Fault::CloseConnection | Fault::Applied(_) => {
                unreachable!("handled before an answer is made")
            }
        }
    }

    fn into_response(self) -> Response<Body> {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (
                header::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(&value),
            ) {
                headers.append(name, value);
            }
        }
        response
    }
}
