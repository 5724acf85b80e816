//! A stand-in for OpenFGA's HTTP API, for the relay's tests and its benchmark.
//!
//! No OpenFGA server can run here, so this module answers as OpenFGA does, byte for byte where
//! the source code tells us how, and never more lenient than OpenFGA. Every behaviour was read
//! from the OpenFGA sources (openfga/openfga `da9354f7e670`, openfga/api `f153694bfc20`); the
//! file and function are cited where it helps.
//!
//! What it serves: `POST /stores/{id}/write`, `POST /stores/{id}/read`,
//! `GET /stores/{id}`, `GET /stores`, `GET /healthz`. Anything else gets the gateway's 404s.
//! There is one store, [`STORE_ID`], named [`STORE_NAME`], whose one model is [`MODEL_ID`].
//!
//! How a request travels, in OpenFGA's order:
//! 1. grpc-gateway decodes the JSON body (Go `encoding/json` first, then `protojson` with
//!    `DiscardUnknown`), and takes `store_id` from the path.
//! 2. gRPC rejects a request whose protobuf encoding exceeds `512*1204` bytes.
//! 3. The PGV validator runs with `ValidateAll`; it runs *before*
//!    authentication (openfga `cmd/run/run.go`: the `grpcauth` interceptor is chained last).
//! 4. Authentication.
//! 5. Injected faults (write requests only; not something OpenFGA does).
//! 6. The handler: for Write, `Server.Write` then `WriteCommand.Execute`.
//!
//! The server runs on its own thread with its own tokio runtime, so it keeps answering while a
//! test blocks its own thread. It serves HTTP/1.1 connections itself (hyper's
//! `serve_connection`), which lets it drop one connection without answering
//! ([`Fault::CloseConnection`]) and stop listening on its port ([`FakeFga::set_refusing`]).
//! Dropping the [`FakeFga`] stops the runtime, which ends every connection, hanging ones
//! included, and joins the thread.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use axum::routing::{get, post};
use serde_json::{Map, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

// ------------------------------------------------------------------------------------------------
// Public constants
// ------------------------------------------------------------------------------------------------

/// The one store. 26 characters of `[ABCDEFGHJKMNPQRSTVWXYZ0-9]` (no I, L, O, U), as the
/// `store_id` PGV pattern requires.
pub const STORE_ID: &str = "01JRE1AYTESTST0RE000000000";
/// The store's one authorization model (same pattern).
pub const MODEL_ID: &str = "01JRE1AYTESTM0DE1000000000";
/// The store's name, as ListStores and GetStore return it.
pub const STORE_NAME: &str = "relay-test";
/// OpenFGA's default `maxTuplesPerWrite`.
pub const DEFAULT_MAX_TUPLES_PER_WRITE: usize = 100;

/// gRPC's `MaxRecvMsgSize`: `serverconfig.DefaultMaxRPCMessageSizeInBytes = 512*1204`.
const MAX_RECV_MSG_SIZE: usize = 512 * 1204;
/// `DefaultWriteContextByteLimit = 32*1024`.
const CONDITION_CONTEXT_BYTE_LIMIT: usize = 32 * 1024;
/// `storage.DefaultPageSize` for Read and ListStores.
const DEFAULT_PAGE_SIZE: usize = 50;
/// `AuthorizationModelIDHeader`.
const MODEL_ID_HEADER: &str = "openfga-authorization-model-id";
/// `requestid.RequestIDHeader`, set on every gRPC answer (openfga `pkg/middleware/requestid`).
const REQUEST_ID_HEADER: &str = "x-request-id";
/// The service name the health checker answers for (openfga `pkg/server/health/health.go`).
const HEALTH_SERVICE: &str = "openfga.v1.OpenFGAService";

// PGV reasons, exactly as the generated Go code writes them (api: `*.pb.validate.go`). The
// patterns are printed with doubled backslashes there, so they are here too.
const ULID_REASON: &str =
    r#"value does not match regex pattern "^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$""#;
const RELATION_REASON: &str = r#"value does not match regex pattern "^[^:#@\\s]{1,50}$""#;
const OBJECT_REASON: &str = r#"value does not match regex pattern "^[^\\s]{2,256}$""#;
const CONDITION_NAME_REASON: &str = r#"value does not match regex pattern "^[^\\s]{2,256}$""#;
const READ_USER_REASON: &str =
    r#"value does not match regex pattern "^[^\\s]{1,511}:[^\\s]{1,511}$""#;
const TOKEN_REASON: &str = r#"value does not match regex pattern "^$|^[A-Za-z0-9-_]+={0,2}$""#;
const STORE_NAME_REASON: &str =
    r#"value does not match regex pattern "^[a-zA-Z0-9\\s\\.\\-\\/^_&@]{3,64}$""#;
const USER_LENGTH_REASON: &str = "value length must be at most 512 bytes";
const MIN_ITEMS_REASON: &str = "value must contain at least 1 item(s)";
const PAGE_SIZE_REASON: &str = "value must be inside range [1, 100]";

// ------------------------------------------------------------------------------------------------
// Public data types
// ------------------------------------------------------------------------------------------------

/// A relationship tuple as the store holds it. Ordered by (object, relation, user, condition).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoredTuple {
    pub object: String,
    pub relation: String,
    pub user: String,
    /// The condition as OpenFGA's Read returns it, in canonical JSON text:
    /// `{"name":"…","context":{…}}` with sorted keys and numbers printed as protojson prints a
    /// double. A stored condition always has a `context` (possibly `{}`): the SQL datastores
    /// store an empty context as NULL and read it back as an empty Struct
    /// (openfga `pkg/storage/sqlcommon/encoding.go`, `pkg/tuple/tuple.go` `NewRelationshipCondition`).
    /// Build it with [`StoredTuple::with_condition`].
    pub condition: Option<String>,
}

impl StoredTuple {
    pub fn new(user: &str, relation: &str, object: &str) -> Self {
        StoredTuple {
            object: object.to_owned(),
            relation: relation.to_owned(),
            user: user.to_owned(),
            condition: None,
        }
    }

    /// Adds a condition; `context` must be a JSON object (or null for none).
    pub fn with_condition(mut self, name: &str, context: Value) -> Self {
        let context = match context {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => panic!("a condition context must be a JSON object, got {other}"),
        };
        self.condition = Some(Cond::new(name, &context).text);
        self
    }

    /// The condition as JSON (`{"name","context"}`), if any.
    pub fn condition_value(&self) -> Option<Value> {
        self.condition
            .as_deref()
            .map(|text| serde_json::from_str(text).expect("condition text is JSON"))
    }
}

/// One `POST /stores/{id}/write` as received, whatever became of it.
#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub received_at: Instant,
    /// The body's (first) JSON value; `Value::Null` for an empty body, and the body text as a
    /// `Value::String` when it is not JSON.
    pub body: Value,
    /// The HTTP status answered; 0 while unanswered, and for `Hang` and `CloseConnection`.
    pub status: u16,
    /// When it was answered (or, for a delayed write whose client left, applied); `None` while
    /// in flight and for `Hang` and `CloseConnection`.
    pub answered_at: Option<Instant>,
    /// The raw `Authorization` header, if any.
    pub authorization: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Write,
    Delete,
}

/// One applied operation (skipped `ignore` operations are not changes, as in OpenFGA's
/// changelog). Deletes carry no condition.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub op: Op,
    pub user: String,
    pub relation: String,
    pub object: String,
    pub condition: Option<Value>,
    pub at: Instant,
}

/// A fault to inject into write requests. Rules are consumed in FIFO order: each write request
/// that passed authentication takes the first rule that matches it and has `times > 0`.
#[derive(Clone, Debug)]
pub struct FaultRule {
    pub fault: Fault,
    pub times: usize,
    /// `(user, relation, object)`: the rule matches only requests that write or delete this tuple.
    pub only_if_tuple: Option<(String, String, String)>,
}

impl FaultRule {
    pub fn once(fault: Fault) -> Self {
        Self::times(fault, 1)
    }

    pub fn times(fault: Fault, n: usize) -> Self {
        FaultRule {
            fault,
            times: n,
            only_if_tuple: None,
        }
    }

    pub fn when_tuple(mut self, user: &str, relation: &str, object: &str) -> Self {
        self.only_if_tuple = Some((user.to_owned(), relation.to_owned(), object.to_owned()));
        self
    }
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer this instead of processing (nothing applied). The body is OpenFGA's error
    /// envelope `{"code":…,"message":…}` + newline.
    Status {
        status: u16,
        code: String,
        message: String,
        retry_after: Option<String>,
    },
    /// Wait, then process normally. The write is applied after the delay even if the client
    /// has given up by then (as a server that already took the request would).
    Delay(Duration),
    /// Never answer, never apply. Ends when the connection is dropped: on `set_refusing(true)`
    /// or when the `FakeFga` is dropped.
    Hang,
    /// Close the TCP connection without any HTTP response; nothing applied.
    CloseConnection,
    /// Answer with an arbitrary body, as a proxy in front of OpenFGA might; nothing applied.
    Garbage {
        status: u16,
        content_type: String,
        body: String,
    },
    /// A redirect from something in front of OpenFGA (`Location: location`); nothing applied.
    Redirect { status: u16, location: String },
}

/// Faults drawn at random for every write request no [`FaultRule`] matched, as a flaky or
/// overloaded deployment (several replicas behind a load balancer, a rate limiter) answers.
#[derive(Clone, Debug, Default)]
pub struct RandomFaults {
    /// Share of writes answered 500 `internal_error`.
    pub internal: f64,
    /// Share of writes answered 429, with `Retry-After: retry_after` when given.
    pub rate_limited: f64,
    pub retry_after: Option<String>,
}

impl Fault {
    /// A proxy's HTML error page (nginx's form), as it stands in front of OpenFGA.
    pub fn html(status: u16, title: &str) -> Fault {
        Fault::Garbage {
            status,
            content_type: "text/html".into(),
            body: format!(
                "<html>\r\n<head><title>{status} {title}</title></head>\r\n<body>\r\n\
                 <center><h1>{status} {title}</h1></center>\r\n<hr><center>nginx</center>\r\n\
                 </body>\r\n</html>\r\n"
            ),
        }
    }

    pub fn status(status: u16, code: &str, message: &str) -> Fault {
        Fault::Status {
            status,
            code: code.to_owned(),
            message: message.to_owned(),
            retry_after: None,
        }
    }

    /// What OpenFGA answers for any hidden internal error.
    pub fn internal() -> Fault {
        Fault::status(500, "internal_error", "Internal Server Error")
    }

    /// gRPC `Unavailable` as the gateway reports it when OpenFGA's gRPC side is down: code 4010
    /// maps to HTTP 500. The message is grpc-go's dial error.
    pub fn unavailable() -> Fault {
        Fault::status(
            500,
            "unavailable",
            "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:8081: connect: connection refused\"",
        )
    }

    /// 429 with `Retry-After: <secs>`. OpenFGA itself never sends this (it has no
    /// rate limiter); hosted deployments and proxies do. Code and message are illustrative.
    pub fn rate_limited(retry_after_secs: u64) -> Fault {
        Fault::Status {
            status: 429,
            code: "rate_limit_exceeded".to_owned(),
            message: "Rate Limit exceeded".to_owned(),
            retry_after: Some(retry_after_secs.to_string()),
        }
    }

    /// The concurrent-insert race: 409 with the literal code "Aborted".
    pub fn aborted() -> Fault {
        Fault::status(
            409,
            "Aborted",
            "transactional write failed due to conflict: one or more tuples to write were inserted by another transaction",
        )
    }

    /// The request timeout: 500 `deadline_exceeded`.
    pub fn deadline_exceeded() -> Fault {
        Fault::status(500, "deadline_exceeded", "Request Deadline Exceeded")
    }

    /// Datastore throttling: 500 `resource_exhausted`.
    pub fn throttled() -> Fault {
        Fault::status(
            500,
            "resource_exhausted",
            "transaction was throttled by the datastore",
        )
    }
}

/// One entry of a relation's type restrictions (OpenFGA's `RelationReference`): `user`,
/// `user:*`, `group#member`, optionally followed by ` with <condition>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeRestriction {
    pub user_type: String,
    pub relation: Option<String>,
    pub wildcard: bool,
    pub condition: Option<String>,
}

impl TypeRestriction {
    /// Parses the DSL form: `user`, `user:*`, `group#member`, `user with non_expired`.
    pub fn parse(spec: &str) -> Self {
        let (base, condition) = match spec.split_once(" with ") {
            Some((b, c)) => (b.trim(), Some(c.trim().to_owned())),
            None => (spec.trim(), None),
        };
        if let Some(t) = base.strip_suffix(":*") {
            TypeRestriction {
                user_type: t.to_owned(),
                relation: None,
                wildcard: true,
                condition,
            }
        } else if let Some((t, r)) = base.split_once('#') {
            TypeRestriction {
                user_type: t.to_owned(),
                relation: Some(r.to_owned()),
                wildcard: false,
                condition,
            }
        } else {
            TypeRestriction {
                user_type: base.to_owned(),
                relation: None,
                wildcard: false,
                condition,
            }
        }
    }
}

/// An authorization model (schema 1.1) restricted to what a Write validates: types, their
/// directly assignable relations with type restrictions, and conditions with parameter names.
/// Computed relations, tuple-to-userset rewrites and parameter types are not modelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    types: BTreeMap<String, BTreeMap<String, Vec<TypeRestriction>>>,
    conditions: BTreeMap<String, Vec<String>>,
}

impl Model {
    /// A model with no types at all.
    pub fn empty() -> Self {
        Model {
            types: BTreeMap::new(),
            conditions: BTreeMap::new(),
        }
    }

    /// Declares a type (with no relations yet).
    pub fn with_type(mut self, type_name: &str) -> Self {
        self.types.entry(type_name.to_owned()).or_default();
        self
    }

    /// Declares `type_name#relation: [allowed...]` (declaring the type if needed); each allowed
    /// entry is in [`TypeRestriction::parse`] form.
    pub fn with_relation(mut self, type_name: &str, relation: &str, allowed: &[&str]) -> Self {
        self.types.entry(type_name.to_owned()).or_default().insert(
            relation.to_owned(),
            allowed.iter().map(|a| TypeRestriction::parse(a)).collect(),
        );
        self
    }

    /// Declares a condition and its parameter names.
    pub fn with_condition(mut self, name: &str, params: &[&str]) -> Self {
        self.conditions.insert(
            name.to_owned(),
            params.iter().map(|p| (*p).to_owned()).collect(),
        );
        self
    }

    fn has_type(&self, type_name: &str) -> bool {
        self.types.contains_key(type_name)
    }

    fn relation(&self, type_name: &str, relation: &str) -> Option<&[TypeRestriction]> {
        self.types.get(type_name)?.get(relation).map(Vec::as_slice)
    }
}

impl Default for Model {
    /// user; organization{member}; capture_job{parent}; archive{parent}; group{member};
    /// document{viewer, editor, owner, parent}; condition non_expired(current_time, expires_at).
    fn default() -> Self {
        Model::empty()
            .with_type("user")
            .with_relation("organization", "member", &["user"])
            .with_relation("capture_job", "parent", &["organization"])
            .with_relation("archive", "parent", &["capture_job"])
            .with_relation("group", "member", &["user"])
            .with_relation(
                "document",
                "viewer",
                &["user", "user:*", "group#member", "user with non_expired"],
            )
            .with_relation("document", "editor", &["user"])
            .with_relation("document", "owner", &["user"])
            .with_relation("document", "parent", &["organization"])
            .with_condition("non_expired", &["current_time", "expires_at"])
    }
}

/// Polls `f` every 10 ms until it returns true; panics with `what` after `timeout`.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, what: &str, mut f: F) {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ------------------------------------------------------------------------------------------------
// FakeFga: the handle
// ------------------------------------------------------------------------------------------------

/// The running stand-in. Stops, and joins its thread, when dropped.
pub struct FakeFga {
    shared: Arc<Shared>,
    addr: SocketAddr,
    control: tokio::sync::mpsc::UnboundedSender<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
    refusing: Mutex<bool>,
}

pub struct FakeFgaBuilder {
    auth: Auth,
    max_tuples_per_write: usize,
    legacy: bool,
    model: Option<Model>,
}

impl FakeFgaBuilder {
    /// Requires `Authorization: Bearer <key>` on every route except `/healthz`. May be given
    /// several times: any of the keys is accepted, as with `--authn-preshared-keys`.
    pub fn preshared_key(mut self, key: &str) -> Self {
        match &mut self.auth {
            Auth::Preshared(keys) => keys.push(key.to_owned()),
            _ => self.auth = Auth::Preshared(vec![key.to_owned()]),
        }
        self
    }

    /// OIDC-like authentication: a bearer token is accepted iff `f(token)`. A rejected token
    /// gets what OpenFGA's OIDC authenticator answers, 401 `invalid_claims`.
    pub fn accept_bearer(mut self, f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.auth = Auth::Bearer(Arc::new(f));
        self
    }

    pub fn max_tuples_per_write(mut self, n: usize) -> Self {
        self.max_tuples_per_write = n;
        self
    }

    /// A server older than 1.10: `on_duplicate` and `on_missing` are unknown fields, dropped
    /// by `DiscardUnknown`, so both behave as "error".
    pub fn legacy(mut self) -> Self {
        self.legacy = true;
        self
    }

    pub fn model(mut self, model: Model) -> Self {
        self.model = Some(model);
        self
    }

    /// The store exists but has no model: writes get 400 `latest_authorization_model_not_found`
    /// (or `authorization_model_not_found` when they name [`MODEL_ID`]).
    pub fn no_model(mut self) -> Self {
        self.model = None;
        self
    }

    pub fn start(self) -> FakeFga {
        let now = SystemTime::now();
        let shared = Arc::new(Shared {
            auth: self.auth,
            max_tuples_per_write: self.max_tuples_per_write,
            legacy: self.legacy,
            model: self.model,
            created_at: now,
            state: Mutex::new(Db::default()),
        });
        let listener = bind_listener();
        let addr = listener.local_addr().expect("listener address");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let app = router(shared.clone());
        let (control, control_rx) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("fake-fga".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("fake-fga-worker")
                    .enable_all()
                    .build()
                    .expect("fake-fga runtime");
                runtime.block_on(accept_loop(listener, control_rx, app));
                // Dropping the runtime cancels every task: hanging requests, delayed writes
                // and idle keep-alive connections all end here.
                drop(runtime);
            })
            .expect("spawn fake-fga thread");
        FakeFga {
            shared,
            addr,
            control,
            thread: Some(thread),
            refusing: Mutex::new(false),
        }
    }
}

impl FakeFga {
    /// Defaults: no auth, 100 tuples per write, a modern (>= 1.10) server, [`Model::default`].
    pub fn start() -> FakeFga {
        Self::builder().start()
    }

    pub fn builder() -> FakeFgaBuilder {
        FakeFgaBuilder {
            auth: Auth::None,
            max_tuples_per_write: DEFAULT_MAX_TUPLES_PER_WRITE,
            legacy: false,
            model: Some(Model::default()),
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current tuples, sorted by (object, relation, user).
    pub fn tuples(&self) -> Vec<StoredTuple> {
        let state = self.shared.state();
        let mut tuples: Vec<StoredTuple> = state.tuples.values().map(Entry::to_stored).collect();
        drop(state);
        tuples.sort();
        tuples
    }

    pub fn has(&self, user: &str, relation: &str, object: &str) -> bool {
        let key = key_string(object, relation, user);
        self.shared.state().tuples.contains_key(key.as_str())
    }

    /// The stored condition `{"name","context"}` of a tuple, if the tuple exists and has one.
    pub fn condition_of(&self, user: &str, relation: &str, object: &str) -> Option<Value> {
        let key = key_string(object, relation, user);
        let state = self.shared.state();
        let cond = state.tuples.get(key.as_str())?.condition.clone()?;
        drop(state);
        Some(serde_json::from_str(&cond.text).expect("condition text is JSON"))
    }

    /// Inserts (or replaces) a tuple behind the relay's back. Not recorded in `changelog()`.
    pub fn insert_tuple(&self, t: StoredTuple) {
        let condition = t
            .condition
            .as_deref()
            .map(|text| Arc::new(Cond::from_text(text)));
        let key = TKey::new(&t.object, &t.relation, &t.user);
        let now = SystemTime::now();
        let mut state = self.shared.state();
        let seq = state.next_seq();
        state.tuples.insert(
            key.s.clone(),
            Entry {
                key,
                seq,
                inserted_at: now,
                condition,
            },
        );
    }

    /// Removes a tuple behind the relay's back; true if it existed. Not recorded in `changelog()`.
    pub fn remove_tuple(&self, user: &str, relation: &str, object: &str) -> bool {
        let key = key_string(object, relation, user);
        self.shared.state().tuples.remove(key.as_str()).is_some()
    }

    /// Every `POST /stores/{id}/write` received since the start (or the last
    /// `reset_requests`), in arrival order, with its outcome. Parses the recorded bodies on
    /// each call: in a tight polling loop prefer [`FakeFga::write_count`].
    pub fn writes(&self) -> Vec<WriteRecord> {
        let raw: Vec<RecordInner> = self.shared.state().writes.clone();
        raw.into_iter()
            .map(|r| WriteRecord {
                received_at: r.received_at,
                answered_at: r.answered_at,
                body: body_as_json(&r.body),
                status: r.status,
                authorization: r.authorization,
            })
            .collect()
    }

    pub fn write_count(&self) -> usize {
        self.shared.state().writes.len()
    }

    /// Every applied operation, in order.
    pub fn changelog(&self) -> Vec<Change> {
        let state = self.shared.state();
        state
            .changelog
            .iter()
            .map(|c| Change {
                op: c.op,
                user: c.key.user().to_owned(),
                relation: c.key.relation().to_owned(),
                object: c.key.object().to_owned(),
                condition: c
                    .condition
                    .as_ref()
                    .map(|cond| serde_json::from_str(&cond.text).expect("condition text is JSON")),
                at: c.at,
            })
            .collect()
    }

    pub fn push_fault(&self, rule: FaultRule) {
        self.shared.state().faults.push_back(rule);
    }

    pub fn clear_faults(&self) {
        self.shared.state().faults.clear();
    }

    /// Faults at random for every write no rule matched; `None` to stop them.
    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.shared.state().random = faults;
    }

    /// A proxy in front of OpenFGA with a body limit: a write body above `bytes` is answered
    /// 413 with the proxy's HTML page, before OpenFGA sees it. `None`: no limit.
    pub fn set_body_limit(&self, bytes: Option<usize>) {
        self.shared.state().body_limit = bytes;
    }

    /// `true`: stop listening (new connections are refused) and close every open connection,
    /// as a server that went down would. `false`: listen again on the same port. Returns once
    /// the change has taken effect.
    pub fn set_refusing(&self, refusing: bool) {
        let mut current = self.refusing.lock().unwrap_or_else(|e| e.into_inner());
        if *current == refusing {
            return;
        }
        let (ack, done) = std::sync::mpsc::channel();
        if refusing {
            self.control
                .send(Control::Stop(ack))
                .expect("fake-fga thread is running");
        } else {
            let listener = rebind(self.addr);
            self.control
                .send(Control::Listen(listener, ack))
                .expect("fake-fga thread is running");
        }
        done.recv().expect("fake-fga thread acknowledges");
        *current = refusing;
    }

    /// Forgets the recorded write requests (not the tuples, nor the changelog).
    pub fn reset_requests(&self) {
        let mut state = self.shared.state();
        state.writes.clear();
        state.writes_epoch += 1;
    }
}

impl Drop for FakeFga {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Shared state
// ------------------------------------------------------------------------------------------------

enum Auth {
    None,
    Preshared(Vec<String>),
    Bearer(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

struct Shared {
    auth: Auth,
    max_tuples_per_write: usize,
    legacy: bool,
    model: Option<Model>,
    created_at: SystemTime,
    state: Mutex<Db>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Db> {
        // A panicking test thread must not poison the server for the other requests.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fast non-cryptographic hasher (FxHash's round with a murmur3 finaliser) for the maps the
/// write path uses; SipHash showed up in profiles and hash flooding is no concern here.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FastBuild = std::hash::BuildHasherDefault<FastHasher>;

#[derive(Default)]
struct Db {
    /// Keyed by `object#relation@user`, OpenFGA's own tuple key (`tuple.TupleKeyToString`).
    tuples: HashMap<Arc<str>, Entry, FastBuild>,
    /// Insertion order, standing in for the SQL datastores' `ulid` column (Read orders by it).
    seq: u64,
    writes: Vec<RecordInner>,
    /// Bumped by `reset_requests`, so a request answered after a reset does not update a record
    /// that is no longer its own.
    writes_epoch: u64,
    changelog: Vec<ChangeInner>,
    faults: VecDeque<FaultRule>,
    random: Option<RandomFaults>,
    body_limit: Option<usize>,
}

impl Db {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

/// A tuple key stored once as `object#relation@user` plus the two split points.
#[derive(Clone)]
struct TKey {
    s: Arc<str>,
    object_end: usize,
    relation_end: usize,
}

impl TKey {
    fn new(object: &str, relation: &str, user: &str) -> TKey {
        TKey::from_key_string(
            key_string(object, relation, user),
            object.len(),
            relation.len(),
        )
    }

    fn from_key_string(key: String, object_len: usize, relation_len: usize) -> TKey {
        TKey {
            s: Arc::from(key),
            object_end: object_len,
            relation_end: object_len + 1 + relation_len,
        }
    }

    fn object(&self) -> &str {
        &self.s[..self.object_end]
    }

    fn relation(&self) -> &str {
        &self.s[self.object_end + 1..self.relation_end]
    }

    fn user(&self) -> &str {
        &self.s[self.relation_end + 1..]
    }
}

/// `tuple.TupleKeyToString`: `object#relation@user`.
fn key_string(object: &str, relation: &str, user: &str) -> String {
    let mut s = String::with_capacity(object.len() + relation.len() + user.len() + 2);
    s.push_str(object);
    s.push('#');
    s.push_str(relation);
    s.push('@');
    s.push_str(user);
    s
}

struct Entry {
    key: TKey,
    seq: u64,
    inserted_at: SystemTime,
    condition: Option<Arc<Cond>>,
}

impl Entry {
    fn to_stored(&self) -> StoredTuple {
        StoredTuple {
            object: self.key.object().to_owned(),
            relation: self.key.relation().to_owned(),
            user: self.key.user().to_owned(),
            condition: self.condition.as_ref().map(|c| c.text.clone()),
        }
    }
}

#[derive(Clone)]
struct RecordInner {
    received_at: Instant,
    answered_at: Option<Instant>,
    body: Bytes,
    status: u16,
    authorization: Option<String>,
}

struct ChangeInner {
    op: Op,
    key: TKey,
    condition: Option<Arc<Cond>>,
    at: Instant,
}

/// A stored condition, kept in canonical form for comparisons and output.
#[derive(Debug, PartialEq, Eq)]
struct Cond {
    name: String,
    /// Canonical JSON text of the context object (`{}` when empty or absent).
    context: String,
    /// Canonical JSON text of `{"name":…,"context":…}`.
    text: String,
}

impl Cond {
    fn new(name: &str, context: &Map<String, Value>) -> Cond {
        let mut ctx = String::new();
        write_canonical_object(context, &mut ctx);
        let mut text = String::with_capacity(name.len() + ctx.len() + 24);
        text.push_str("{\"name\":");
        write_json_str(name, &mut text);
        text.push_str(",\"context\":");
        text.push_str(&ctx);
        text.push('}');
        Cond {
            name: name.to_owned(),
            context: ctx,
            text,
        }
    }

    fn from_text(text: &str) -> Cond {
        let v: Value = serde_json::from_str(text).expect("a condition is JSON");
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .expect("a condition has a name");
        let empty = Map::new();
        let ctx = v
            .get("context")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        Cond::new(name, ctx)
    }
}

// ------------------------------------------------------------------------------------------------
// Listening and connections
// ------------------------------------------------------------------------------------------------

enum Control {
    /// Stop listening and close every connection; acknowledge when done.
    Stop(std::sync::mpsc::Sender<()>),
    /// Listen again with this (already bound) listener; acknowledge when done.
    Listen(StdTcpListener, std::sync::mpsc::Sender<()>),
    Shutdown,
}

/// Per-connection handle given to handlers, so that one can drop its own connection.
#[derive(Clone)]
struct ConnCtl {
    kill: CancellationToken,
}

/// Binds 127.0.0.1 on a port below the kernel's ephemeral range when it can: such a port is
/// never handed to an outgoing connection, so `set_refusing(false)` can take it back.
fn bind_listener() -> StdTcpListener {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_low > 12000 {
        for _ in 0..200 {
            let port = fastrand::u16(10000..ephemeral_low);
            if let Ok(listener) = StdTcpListener::bind(("127.0.0.1", port)) {
                return listener;
            }
        }
    }
    StdTcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0")
}

/// Binds the same address again (std sets SO_REUSEADDR, so closed connections in TIME_WAIT do
/// not stand in the way).
fn rebind(addr: SocketAddr) -> StdTcpListener {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match StdTcpListener::bind(addr) {
            Ok(listener) => {
                listener
                    .set_nonblocking(true)
                    .expect("non-blocking listener");
                return listener;
            }
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("fake-fga could not listen on {addr} again: {e}"),
        }
    }
}

async fn accept_loop(
    listener: StdTcpListener,
    mut control: tokio::sync::mpsc::UnboundedReceiver<Control>,
    app: Router,
) {
    let mut listener = Some(TcpListener::from_std(listener).expect("tokio listener"));
    // Every connection of the current listening period: cancelled and awaited on Stop.
    let mut connections = CancellationToken::new();
    let mut tracker = TaskTracker::new();
    loop {
        tokio::select! {
            message = control.recv() => match message {
                None | Some(Control::Shutdown) => break,
                Some(Control::Stop(ack)) => {
                    listener = None;
                    connections.cancel();
                    tracker.close();
                    tracker.wait().await;
                    connections = CancellationToken::new();
                    tracker = TaskTracker::new();
                    let _ = ack.send(());
                }
                Some(Control::Listen(std_listener, ack)) => {
                    listener = Some(TcpListener::from_std(std_listener).expect("tokio listener"));
                    let _ = ack.send(());
                }
            },
            accepted = accept(listener.as_ref()) => match accepted {
                Ok(stream) => {
                    tracker.spawn(serve_connection(stream, app.clone(), connections.child_token()));
                }
                // E.g. too many open files: wait a little rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
    }
    connections.cancel();
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// Serves one HTTP/1.1 connection until the client closes it or `kill` fires; on `kill` the
/// connection future is dropped, which closes the socket without writing anything more.
async fn serve_connection(stream: TcpStream, app: Router, kill: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let ctl = ConnCtl { kill: kill.clone() };
    let service = hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ctl.clone());
        // `Router` is always ready, so `call` needs no `poll_ready` first.
        tower_service::Service::call(&mut app.clone(), request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        _ = kill.cancelled() => {}
    }
}

// ------------------------------------------------------------------------------------------------
// Routes
// ------------------------------------------------------------------------------------------------

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(healthz_route))
        .route("/stores", get(list_stores_route))
        .route("/stores/{store_id}", get(get_store_route))
        .route("/stores/{store_id}/write", post(write_route))
        .route("/stores/{store_id}/read", post(read_route))
        // grpc-gateway's routing errors: an unknown path is NotFound → 5000,
        // a known path with another method is 405 → Unimplemented → 5004; both are HTTP 404.
        .fallback(|| async { Reply::error(404, "undefined_endpoint", "Not Found").into_response() })
        .method_not_allowed_fallback(|| async {
            Reply::error(404, "unimplemented", "Method Not Allowed").into_response()
        })
        // The gateway has no body limit of its own; gRPC's message limit is applied below.
        .layer(DefaultBodyLimit::disable())
        .with_state(shared)
}

/// A response, before it becomes an HTTP one.
struct Reply {
    status: u16,
    content_type: Cow<'static, str>,
    body: Bytes,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Reply {
    fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            content_type: Cow::Borrowed("application/json"),
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// OpenFGA's error envelope: Go `json.Encoder` with `SetEscapeHTML(false)`, hence the
    /// trailing newline.
    fn error(status: u16, code: &str, message: &str) -> Reply {
        let mut body = String::with_capacity(code.len() + message.len() + 32);
        body.push_str("{\"code\":");
        write_go_json_str(code, &mut body);
        body.push_str(",\"message\":");
        write_go_json_str(message, &mut body);
        body.push_str("}\n");
        Reply::json(status, body)
    }

    /// An OpenFGA error code (its numeric range sets the status) with its message run through
    /// `sanitizedMessage`.
    fn encoded(status: u16, code: &str, message: &str) -> Reply {
        Reply::error(status, code, &sanitized_message(message))
    }

    /// A gRPC `InvalidArgument` (gateway decoding, PGV): the code is derived from the message
    /// as `ConvertToEncodedErrorCode` does.
    fn invalid_argument(message: &str) -> Reply {
        let sanitized = sanitized_message(message);
        let code = invalid_argument_code(&sanitized);
        Reply::error(400, code, &sanitized)
    }

    fn header(mut self, name: &'static str, value: &str) -> Reply {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((HeaderName::from_static(name), v));
        }
        self
    }

    fn into_response(self) -> Response<Body> {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        if let Ok(ct) = HeaderValue::from_str(&self.content_type) {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

/// A random v4 UUID for `X-Request-Id`.
fn request_id() -> String {
    let r = fastrand::u128(..);
    let r = (r & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{r:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

async fn healthz_route(RawQuery(query): RawQuery) -> Response<Body> {
    // grpc-gateway's healthz endpoint calls the gRPC health service, which bypasses authn
    //; the `service` query parameter names the service to check.
    let service = query
        .as_deref()
        .and_then(|q| {
            parse_query(q)
                .ok()?
                .into_iter()
                .rev()
                .find(|(k, _)| k == "service")
        })
        .map(|(_, v)| v)
        .unwrap_or_default();
    if service.is_empty() || service == HEALTH_SERVICE {
        Reply::json(200, r#"{"status":"SERVING"}"#).into_response()
    } else {
        Reply::encoded(
            404,
            "undefined_endpoint",
            &format!("service '{service}' is not registered with the Health server"),
        )
        .into_response()
    }
}

async fn get_store_route(
    State(fga): State<Arc<Shared>>,
    Path(store_id): Path<String>,
    headers: HeaderMap,
) -> Response<Body> {
    fga.get_store(&store_id, &headers).into_response()
}

async fn list_stores_route(
    State(fga): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response<Body> {
    fga.list_stores(query.as_deref().unwrap_or(""), &headers)
        .into_response()
}

async fn read_route(
    State(fga): State<Arc<Shared>>,
    Path(store_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    fga.read(&store_id, &headers, &body).into_response()
}

async fn write_route(
    State(fga): State<Arc<Shared>>,
    Path(store_id): Path<String>,
    Extension(conn): Extension<ConnCtl>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let record = fga.record_write(body.clone(), authorization);
    let reply = fga.write(&store_id, &headers, &body, &conn, record).await;
    fga.finish_write(record, reply.status);
    reply.into_response()
}

// ------------------------------------------------------------------------------------------------
// Handlers
// ------------------------------------------------------------------------------------------------

impl Shared {
    fn record_write(&self, body: Bytes, authorization: Option<String>) -> (u64, usize) {
        let mut state = self.state();
        state.writes.push(RecordInner {
            received_at: Instant::now(),
            answered_at: None,
            body,
            status: 0,
            authorization,
        });
        (state.writes_epoch, state.writes.len() - 1)
    }

    fn finish_write(&self, (epoch, index): (u64, usize), status: u16) {
        let mut state = self.state();
        if state.writes_epoch == epoch
            && let Some(record) = state.writes.get_mut(index)
        {
            record.status = status;
            record.answered_at = Some(Instant::now());
        }
    }

    /// OpenFGA's preshared-key authentication: `grpcauth.AuthFromMD(ctx, "Bearer")` takes the first
    /// `authorization` value, cuts it at the first space and compares the scheme
    /// case-insensitively; any failure there is `bearer_token_missing`.
    fn authenticate(&self, headers: &HeaderMap) -> Result<(), Reply> {
        let token = || {
            let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("Bearer").then_some(token)
        };
        let missing = || Reply::encoded(401, "bearer_token_missing", "missing bearer token");
        match &self.auth {
            Auth::None => Ok(()),
            Auth::Preshared(keys) => match token() {
                None => Err(missing()),
                Some(t) if keys.iter().any(|k| k == t) => Ok(()),
                Some(_) => Err(Reply::encoded(401, "unauthenticated", "unauthenticated")),
            },
            Auth::Bearer(accept) => match token() {
                None => Err(missing()),
                Some(t) if accept(t) => Ok(()),
                // openfga `internal/authn/oidc/oidc.go`: errInvalidClaims.
                Some(_) => Err(Reply::encoded(401, "invalid_claims", "invalid claims")),
            },
        }
    }

    // --- GetStore ---------------------------------------------------------------------------

    fn get_store(&self, store_id: &str, headers: &HeaderMap) -> Reply {
        let rid = request_id();
        if !is_ulid(store_id) {
            let msg = pgv_leaf("GetStoreRequest", "StoreId", ULID_REASON);
            return Reply::invalid_argument(&msg).header(REQUEST_ID_HEADER, &rid);
        }
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        if store_id != STORE_ID {
            // openfga `pkg/server/commands/get_store.go`: ErrStoreIDNotFound.
            return Reply::encoded(404, "store_id_not_found", "Store ID not found")
                .header(REQUEST_ID_HEADER, &rid);
        }
        let mut out = String::with_capacity(160);
        self.write_store_json(&mut out);
        Reply::json(200, out).header(REQUEST_ID_HEADER, &rid)
    }

    /// `Store` / `GetStoreResponse` as protojson with `EmitUnpopulated` prints them: fields in
    /// number order, the unset `deleted_at` as null.
    fn write_store_json(&self, out: &mut String) {
        let ts = rfc3339(self.created_at);
        out.push_str("{\"id\":");
        write_json_str(STORE_ID, out);
        out.push_str(",\"name\":");
        write_json_str(STORE_NAME, out);
        let _ = write!(
            out,
            ",\"created_at\":\"{ts}\",\"updated_at\":\"{ts}\",\"deleted_at\":null}}"
        );
    }

    // --- ListStores -------------------------------------------------------------------------

    fn list_stores(&self, query: &str, headers: &HeaderMap) -> Reply {
        // Query parameters as grpc-gateway's `PopulateQueryParameters` reads them: unknown
        // names ignored, a repeated scalar an error, `page_size` parsed by `strconv.ParseInt`.
        let pairs = match parse_query(query) {
            Ok(p) => p,
            Err(msg) => return Reply::invalid_argument(&msg),
        };
        let mut page_size: Option<i64> = None;
        let mut token = String::new();
        let mut name = String::new();
        for field in ["page_size", "continuation_token", "name"] {
            let values: Vec<&str> = pairs
                .iter()
                .filter(|(k, _)| k == field)
                .map(|(_, v)| v.as_str())
                .collect();
            if values.len() > 1 {
                return Reply::invalid_argument(&format!(
                    "too many values for field \"{field}\": {}",
                    values.join(", ")
                ));
            }
            let Some(value) = values.first().copied() else {
                continue;
            };
            if value.is_empty() {
                continue;
            }
            match field {
                "page_size" => match parse_go_int32(value) {
                    Ok(n) => page_size = Some(n),
                    Err(e) => {
                        return Reply::invalid_argument(&format!(
                            "parsing field \"page_size\": {e}"
                        ));
                    }
                },
                "continuation_token" => token = value.to_owned(),
                _ => name = value.to_owned(),
            }
        }
        let rid = request_id();
        // PGV ListStoresRequest.
        let mut errs = Vec::new();
        if let Some(n) = page_size
            && !(1..=100).contains(&n)
        {
            errs.push(pgv_leaf("ListStoresRequest", "PageSize", PAGE_SIZE_REASON));
        }
        pgv_token("ListStoresRequest", &token, &mut errs);
        if !name.is_empty() && !store_name_ok(&name) {
            errs.push(pgv_leaf("ListStoresRequest", "Name", STORE_NAME_REASON));
        }
        if !errs.is_empty() {
            return Reply::invalid_argument(&errs.join("; ")).header(REQUEST_ID_HEADER, &rid);
        }
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        // The token is the base64url of the first store id of the next page.
        let from = match decode_token(&token) {
            Some(from) => from,
            None => {
                return Reply::encoded(
                    400,
                    "invalid_continuation_token",
                    "Invalid continuation token",
                )
                .header(REQUEST_ID_HEADER, &rid);
            }
        };
        let page_size = page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as usize);
        let ids: Vec<&str> = [STORE_ID]
            .into_iter()
            .filter(|id| (name.is_empty() || name == STORE_NAME) && *id >= from.as_str())
            .collect();
        let mut out = String::from("{\"stores\":[");
        for (i, _id) in ids.iter().take(page_size).enumerate() {
            if i > 0 {
                out.push(',');
            }
            self.write_store_json(&mut out);
        }
        out.push_str("],\"continuation_token\":");
        let next = ids
            .get(page_size)
            .map(|id| b64url_encode(id.as_bytes()))
            .unwrap_or_default();
        write_json_str(&next, &mut out);
        out.push('}');
        Reply::json(200, out).header(REQUEST_ID_HEADER, &rid)
    }

    // --- Read -------------------------------------------------------------------------------

    fn read(&self, store_id: &str, headers: &HeaderMap, body: &[u8]) -> Reply {
        let value = match gw_decode(body, schema::READ_REQUEST) {
            Ok(Some(raw)) => match accepted_json(raw) {
                Ok(v) => v,
                Err(reply) => return reply,
            },
            Ok(None) => Value::Object(Map::new()),
            Err(reply) => return reply,
        };
        let empty = Map::new();
        let req = ReadReq::from_value(value.as_object().unwrap_or(&empty));
        let rid = request_id();
        if let Some(msg) = pgv_read(store_id, &req) {
            return Reply::invalid_argument(&msg).header(REQUEST_ID_HEADER, &rid);
        }
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        let reply = self.read_page(store_id, &req);
        reply.header(REQUEST_ID_HEADER, &rid)
    }

    /// openfga `pkg/server/commands/read.go` `ReadQuery.Execute` over the SQL datastores'
    /// `read` (openfga `pkg/storage/postgres/postgres.go`): filter, order by insertion, one
    /// page, and a token only when more rows follow.
    fn read_page(&self, store_id: &str, req: &ReadReq<'_>) -> Reply {
        let filter = req.tuple_key.unwrap_or_default();
        let (object_type, object_id) = split_object(filter.object);
        if req.tuple_key.is_some()
            && (object_type.is_empty() || (object_id.is_empty() && filter.user.is_empty()))
        {
            return Reply::encoded(
                400,
                "validation_error",
                "the 'tuple_key' field was provided but the object type field is required and both the object id and user cannot be empty",
            );
        }
        let from = match decode_token(req.token) {
            Some(t) if t.is_empty() => 0,
            Some(t) => match t.parse::<u64>() {
                Ok(seq) => seq,
                Err(_) => {
                    return Reply::encoded(
                        400,
                        "invalid_continuation_token",
                        "Invalid continuation token",
                    );
                }
            },
            None => {
                return Reply::encoded(
                    400,
                    "invalid_continuation_token",
                    "Invalid continuation token",
                );
            }
        };
        let page_size = req.page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as usize);
        let mut rows: Vec<(u64, TKey, SystemTime, Option<Arc<Cond>>)> = Vec::new();
        if store_id == STORE_ID {
            let state = self.state();
            for e in state.tuples.values() {
                if e.seq < from {
                    continue;
                }
                let (t, id) = split_object(e.key.object());
                if (!object_type.is_empty() && t != object_type)
                    || (!object_id.is_empty() && id != object_id)
                    || (!filter.relation.is_empty() && e.key.relation() != filter.relation)
                    || (!filter.user.is_empty() && e.key.user() != filter.user)
                {
                    continue;
                }
                rows.push((e.seq, e.key.clone(), e.inserted_at, e.condition.clone()));
            }
        }
        rows.sort_unstable_by_key(|r| r.0);
        let next = rows
            .get(page_size)
            .map(|r| b64url_encode(r.0.to_string().as_bytes()))
            .unwrap_or_default();
        let mut out = String::with_capacity(64 + rows.len().min(page_size) * 160);
        out.push_str("{\"tuples\":[");
        for (i, (_, key, at, cond)) in rows.iter().take(page_size).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"key\":{\"user\":");
            write_json_str(key.user(), &mut out);
            out.push_str(",\"relation\":");
            write_json_str(key.relation(), &mut out);
            out.push_str(",\"object\":");
            write_json_str(key.object(), &mut out);
            out.push_str(",\"condition\":");
            match cond {
                Some(c) => out.push_str(&c.text),
                None => out.push_str("null"),
            }
            let _ = write!(out, "}},\"timestamp\":\"{}\"}}", rfc3339(*at));
        }
        out.push_str("],\"continuation_token\":");
        write_json_str(&next, &mut out);
        out.push('}');
        Reply::json(200, out)
    }

    // --- Write ------------------------------------------------------------------------------

    async fn write(
        self: &Arc<Self>,
        store_id: &str,
        headers: &HeaderMap,
        body: &Bytes,
        conn: &ConnCtl,
        record: (u64, usize),
    ) -> Reply {
        // 0. A proxy in front with a body limit answers before OpenFGA sees anything.
        let limit = self.state().body_limit;
        if limit.is_some_and(|l| body.len() > l) {
            let Fault::Garbage {
                status,
                content_type,
                body,
            } = Fault::html(413, "Request Entity Too Large")
            else {
                unreachable!("html() is a Garbage fault")
            };
            let mut reply = Reply::json(status, body);
            reply.content_type = Cow::Owned(content_type);
            return reply;
        }
        // 1. grpc-gateway decodes the body.
        let parsed = match ParsedWrite::decode(body) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        let req = parsed.request();
        // 2. gRPC's receive limit, checked before any interceptor.
        let size = req.proto_size(store_id);
        if size > MAX_RECV_MSG_SIZE {
            return Reply::encoded(
                500,
                "resource_exhausted",
                &format!("grpc: received message larger than max ({size} vs. {MAX_RECV_MSG_SIZE})"),
            );
        }
        let rid = request_id();
        // 3. PGV, all rules, before authentication.
        if let Some(msg) = pgv_write(store_id, &req) {
            return Reply::invalid_argument(&msg).header(REQUEST_ID_HEADER, &rid);
        }
        // 4. Authentication.
        if let Err(reply) = self.authenticate(headers) {
            return reply.header(REQUEST_ID_HEADER, &rid);
        }
        // 5. Injected faults.
        let fault = self.take_fault(&req);
        let reply = match fault {
            None => self.execute_write(store_id, &req),
            Some(Fault::Status {
                status,
                code,
                message,
                retry_after,
            }) => {
                let reply = Reply::error(status, &code, &message);
                match retry_after {
                    Some(secs) => reply.header("retry-after", &secs),
                    None => reply,
                }
            }
            Some(Fault::Garbage {
                status,
                content_type,
                body,
            }) => {
                let mut reply = Reply::json(status, body);
                reply.content_type = Cow::Owned(content_type);
                return reply;
            }
            Some(Fault::Delay(delay)) => {
                // Processed on a task of its own: the write lands after the delay even if the
                // client stops waiting and this handler is dropped with its connection.
                let fga = Arc::clone(self);
                let store_id = store_id.to_owned();
                let body = body.clone();
                let task = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let reply = fga.execute_write_bytes(&store_id, &body);
                    // Recorded here too: the client may have left (killed), and the write still
                    // lands now.
                    fga.finish_write(record, reply.status);
                    reply
                });
                match task.await {
                    Ok(reply) => reply,
                    Err(_) => Reply::encoded(500, "internal_error", "Internal Server Error"),
                }
            }
            Some(Fault::Redirect { status, location }) => {
                return Reply::json(status, Bytes::new()).header("location", &location);
            }
            Some(Fault::Hang) => return std::future::pending().await,
            Some(Fault::CloseConnection) => {
                conn.kill.cancel();
                return std::future::pending().await;
            }
        };
        reply.header(REQUEST_ID_HEADER, &rid)
    }

    fn take_fault(&self, req: &WriteReq<'_>) -> Option<Fault> {
        let mut state = self.state();
        let index = state.faults.iter().position(|rule| {
            rule.times > 0
                && rule.only_if_tuple.as_ref().is_none_or(|(u, r, o)| {
                    req.all_keys()
                        .any(|(user, relation, object)| user == u && relation == r && object == o)
                })
        });
        let Some(index) = index else {
            let random = state.random.clone()?;
            let draw = fastrand::f64();
            return if draw < random.internal {
                Some(Fault::internal())
            } else if draw < random.internal + random.rate_limited {
                Some(Fault::Status {
                    status: 429,
                    code: "rate_limit_exceeded".to_owned(),
                    message: "Rate Limit exceeded".to_owned(),
                    retry_after: random.retry_after,
                })
            } else {
                None
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

    /// The back half of a Write, from a body that already passed decoding, PGV and auth.
    fn execute_write_bytes(&self, store_id: &str, body: &[u8]) -> Reply {
        let parsed = match ParsedWrite::decode(body) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        self.execute_write(store_id, &parsed.request())
    }

    /// `Server.Write` then `WriteCommand.Execute`.
    fn execute_write(&self, store_id: &str, req: &WriteReq<'_>) -> Reply {
        // Step 2: resolve the model, even for delete-only requests (openfga `pkg/server/server.go`
        // `resolveTypesystem`; a missing store surfaces here too).
        let model = if store_id == STORE_ID {
            self.model.as_ref()
        } else {
            None
        };
        let model = match (model, req.model_id) {
            (Some(m), "") => m,
            (Some(m), id) if id == MODEL_ID => m,
            (_, "") => {
                return Reply::encoded(
                    400,
                    "latest_authorization_model_not_found",
                    &format!("No authorization models found for store '{store_id}'"),
                );
            }
            (_, id) => {
                return Reply::encoded(
                    400,
                    "authorization_model_not_found",
                    &format!("Authorization Model '{id}' not found"),
                );
            }
        };
        // From here on the resolved model id is a response header, errors included: the custom
        // error handler copies the gRPC header metadata (openfga `pkg/middleware/http/handler.go`).
        self.apply_write(model, req)
            .header(MODEL_ID_HEADER, MODEL_ID)
    }

    fn apply_write(&self, model: &Model, req: &WriteReq<'_>) -> Reply {
        let no_keys: &[TK<'_>] = &[];
        let writes = req.writes.as_ref().map_or(no_keys, |l| &l.keys[..]);
        let deletes = req.deletes.as_ref().map_or(no_keys, |l| &l.keys[..]);
        // Step 4.
        if writes.is_empty() && deletes.is_empty() {
            return Reply::encoded(
                400,
                "invalid_write_input",
                "Invalid input. Make sure you provide at least one write, or at least one delete",
            );
        }
        // Step 5: each write against the model, first failure wins.
        for tk in writes {
            if let Err(msg) = validate_tuple_for_write(model, tk) {
                return Reply::encoded(400, "validation_error", &msg);
            }
            // `validateNotImplicit`.
            let (user_object, user_relation) = split_object_relation(tk.user);
            if tk.relation == user_relation && tk.object == user_object {
                return Reply::encoded(
                    400,
                    "validation_error",
                    &invalid_tuple(tk, "cannot write a tuple that is implicit"),
                );
            }
            if let Some(ctx) = tk.condition.and_then(|c| c.context) {
                let size = struct_size(ctx);
                if size > CONDITION_CONTEXT_BYTE_LIMIT {
                    return Reply::encoded(
                        400,
                        "validation_error",
                        &invalid_tuple(
                            tk,
                            &format!(
                                "condition context size limit exceeded: {size} bytes exceeds {CONDITION_CONTEXT_BYTE_LIMIT} bytes"
                            ),
                        ),
                    );
                }
            }
        }
        // Step 6: deletes are only checked for a well-formed user.
        for tk in deletes {
            if !is_valid_user(tk.user) {
                return Reply::encoded(
                    400,
                    "validation_error",
                    &invalid_tuple(tk, "the 'user' field is malformed"),
                );
            }
        }
        // Steps 7 and 8: duplicates across deletes then writes (condition ignored), then the
        // number of unique tuples.
        let delete_keys: Vec<String> = deletes
            .iter()
            .map(|tk| key_string(tk.object, tk.relation, tk.user))
            .collect();
        let write_keys: Vec<String> = writes
            .iter()
            .map(|tk| key_string(tk.object, tk.relation, tk.user))
            .collect();
        let mut seen: HashSet<&str, FastBuild> =
            HashSet::with_capacity_and_hasher(deletes.len() + writes.len(), FastBuild::default());
        for (tk, key) in deletes
            .iter()
            .zip(&delete_keys)
            .chain(writes.iter().zip(&write_keys))
        {
            if !seen.insert(key.as_str()) {
                return Reply::encoded(
                    400,
                    "cannot_allow_duplicate_tuples_in_one_request",
                    &format!(
                        "duplicate tuple in write: user: '{}', relation: '{}', object: '{}'",
                        tk.user, tk.relation, tk.object
                    ),
                );
            }
        }
        if seen.len() > self.max_tuples_per_write {
            return Reply::encoded(
                400,
                "exceeded_entity_limit",
                &format!(
                    "The number of write operations exceeds the allowed limit of {}",
                    self.max_tuples_per_write
                ),
            );
        }
        // Step 9: the options; a legacy server never saw them (they were unknown fields).
        let (on_duplicate, on_missing) = if self.legacy {
            ("", "")
        } else {
            (
                req.writes.as_ref().map_or("", |l| l.option),
                req.deletes.as_ref().map_or("", |l| l.option),
            )
        };
        let ignore_duplicates = match on_duplicate {
            "" | "error" => false,
            "ignore" => true,
            other => {
                return Reply::encoded(
                    400,
                    "validation_error",
                    &format!("invalid on_duplicate option: {other}"),
                );
            }
        };
        let ignore_missing = match on_missing {
            "" | "error" => false,
            "ignore" => true,
            other => {
                return Reply::encoded(
                    400,
                    "validation_error",
                    &format!("invalid on_missing option: {other}"),
                );
            }
        };
        // Step 10: the transaction. Conditions are canonicalised before taking the lock.
        let conditions: Vec<Option<(Arc<Cond>, bool)>> = writes
            .iter()
            .map(|tk| {
                tk.condition.map(|c| {
                    let empty = Map::new();
                    let cond = Cond::new(c.name, c.context.unwrap_or(&empty));
                    (Arc::new(cond), c.context.is_some())
                })
            })
            .collect();
        let now = SystemTime::now();
        let at = Instant::now();
        let mut state = self.state();
        // openfga `pkg/storage/sqlcommon/sqlcommon.go` `GetDeleteWriteChangelogItems`: decide
        // everything against the rows as they were, deletes first, first offender named.
        let mut apply_delete = Vec::with_capacity(deletes.len());
        for (tk, key) in deletes.iter().zip(&delete_keys) {
            let exists = state.tuples.contains_key(key.as_str());
            if !exists && !ignore_missing {
                return Reply::encoded(
                    400,
                    "write_failed_due_to_invalid_input",
                    &format!(
                        "cannot delete a tuple which does not exist: user: '{}', relation: '{}', object: '{}': tuple to be written already existed or the tuple to be deleted did not exist",
                        tk.user, tk.relation, tk.object
                    ),
                );
            }
            apply_delete.push(exists);
        }
        let mut apply_write = Vec::with_capacity(writes.len());
        for ((tk, key), incoming) in writes.iter().zip(&write_keys).zip(&conditions) {
            let Some(existing) = state.tuples.get(key.as_str()) else {
                apply_write.push(true);
                continue;
            };
            if !ignore_duplicates {
                return Reply::encoded(
                    400,
                    "write_failed_due_to_invalid_input",
                    &format!(
                        "cannot write a tuple which already exists: user: '{}', relation: '{}', object: '{}': tuple to be written already existed or the tuple to be deleted did not exist",
                        tk.user, tk.relation, tk.object
                    ),
                );
            }
            if !same_condition(existing.condition.as_deref(), incoming.as_ref()) {
                return Reply::encoded(
                    409,
                    "Aborted",
                    &format!(
                        "transactional write failed due to conflict: attempted to write a tuple which already exists with a different condition: user: '{}', relation: '{}', object: '{}'",
                        tk.user, tk.relation, tk.object
                    ),
                );
            }
            apply_write.push(false);
        }
        for (key, apply) in delete_keys.iter().zip(apply_delete) {
            if !apply {
                continue;
            }
            if let Some(entry) = state.tuples.remove(key.as_str()) {
                state.changelog.push(ChangeInner {
                    op: Op::Delete,
                    key: entry.key,
                    condition: None,
                    at,
                });
            }
        }
        for (((key, tk), apply), incoming) in write_keys
            .into_iter()
            .zip(writes)
            .zip(apply_write)
            .zip(conditions)
        {
            if !apply {
                continue;
            }
            let key = TKey::from_key_string(key, tk.object.len(), tk.relation.len());
            let condition = incoming.map(|(c, _)| c);
            let seq = state.next_seq();
            state.changelog.push(ChangeInner {
                op: Op::Write,
                key: key.clone(),
                condition: condition.clone(),
                at,
            });
            state.tuples.insert(
                key.s.clone(),
                Entry {
                    key,
                    seq,
                    inserted_at: now,
                    condition,
                },
            );
        }
        drop(state);
        // OpenFGA's answer to a successful Write: 200 `{}`.
        Reply::json(200, "{}")
    }
}

/// `proto.Equal(existing.condition, incoming.condition)` as the SQL datastores evaluate it for
/// `on_duplicate: "ignore"`. A stored condition always reads back with a non-nil
/// (possibly empty) context, so an incoming condition *without* a `context` field is unequal
/// to it — `proto.Equal` tells a nil message from an empty one. Send `"context": {}`.
fn same_condition(existing: Option<&Cond>, incoming: Option<&(Arc<Cond>, bool)>) -> bool {
    match (existing, incoming) {
        (None, None) => true,
        (Some(e), Some((c, has_context))) => {
            *has_context && e.name == c.name && e.context == c.context
        }
        _ => false,
    }
}

// ------------------------------------------------------------------------------------------------
// Requests as grpc-gateway decodes them
// ------------------------------------------------------------------------------------------------

/// grpc-gateway's `decodeJSONPb`, up to the point where protojson accepts the body: Go's
/// `json.Decoder` reads the first value into a `json.RawMessage` (an empty body is `io.EOF`,
/// which the generated code accepts as an empty request; bytes after the first value are never
/// read), then protojson unmarshals it with `DiscardUnknown`. Returns
/// the raw first value (`None` for an empty body) or the error answer.
fn gw_decode<'b>(body: &'b [u8], schema: &[gojson::Field]) -> Result<Option<&'b [u8]>, Reply> {
    match gojson::first_value(body) {
        Ok(None) => Ok(None),
        Ok(Some((start, end))) => {
            let raw = &body[start..end];
            match gojson::check_protojson(raw, schema) {
                Ok(()) => Ok(Some(raw)),
                Err(msg) => Err(Reply::invalid_argument(&msg)),
            }
        }
        Err(msg) => Err(Reply::invalid_argument(&msg)),
    }
}

/// The value of a body protojson accepted (syntax and field types are already checked).
fn accepted_json(raw: &[u8]) -> Result<Value, Reply> {
    serde_json::from_slice(raw)
        // Not reachable for a body Go accepted, short of invalid UTF-8 or an absurd number.
        .map_err(|e| Reply::invalid_argument(&format!("proto: {e}")))
}

/// A Write body, decoded. Once protojson's rules have accepted it, most bodies go through a
/// borrowing, allocation-light typed parse; the few it declines (a badly typed field that is
/// unknown where it stands, such as a delete's `condition`) go through `serde_json::Value`.
enum ParsedWrite<'b> {
    Empty,
    Fast(fastjson::WriteBody<'b>),
    Slow(Value),
}

impl<'b> ParsedWrite<'b> {
    fn decode(body: &'b [u8]) -> Result<Self, Reply> {
        let Some(raw) = gw_decode(body, schema::WRITE_REQUEST)? else {
            return Ok(ParsedWrite::Empty);
        };
        if let Ok(fast) = serde_json::from_slice(raw) {
            return Ok(ParsedWrite::Fast(fast));
        }
        accepted_json(raw).map(ParsedWrite::Slow)
    }

    fn request(&self) -> WriteReq<'_> {
        match self {
            ParsedWrite::Empty => WriteReq {
                writes: None,
                deletes: None,
                model_id: "",
            },
            ParsedWrite::Fast(body) => body.request(),
            ParsedWrite::Slow(value) => WriteReq::from_value(value),
        }
    }
}

mod schema {
    //! The request messages protojson decodes (api `openfga/v1/openfga_service.proto`,
    //! `openfga.proto`). Every json_name there is the snake_case proto name.

    use super::gojson::{Field, Kind};

    const fn f(name: &'static str, kind: Kind) -> Field {
        Field { name, kind }
    }

    const RELATIONSHIP_CONDITION: &[Field] = &[f("name", Kind::Str), f("context", Kind::Struct)];
    const TUPLE_KEY: &[Field] = &[
        f("user", Kind::Str),
        f("relation", Kind::Str),
        f("object", Kind::Str),
        f("condition", Kind::Message(RELATIONSHIP_CONDITION)),
    ];
    const TUPLE_KEY_WITHOUT_CONDITION: &[Field] = &[
        f("user", Kind::Str),
        f("relation", Kind::Str),
        f("object", Kind::Str),
    ];
    const WRITE_REQUEST_WRITES: &[Field] = &[
        f("tuple_keys", Kind::Repeated(TUPLE_KEY)),
        f("on_duplicate", Kind::Str),
    ];
    const WRITE_REQUEST_DELETES: &[Field] = &[
        f("tuple_keys", Kind::Repeated(TUPLE_KEY_WITHOUT_CONDITION)),
        f("on_missing", Kind::Str),
    ];
    pub const WRITE_REQUEST: &[Field] = &[
        f("store_id", Kind::Str),
        f("writes", Kind::Message(WRITE_REQUEST_WRITES)),
        f("deletes", Kind::Message(WRITE_REQUEST_DELETES)),
        f("authorization_model_id", Kind::Str),
    ];
    const READ_REQUEST_TUPLE_KEY: &[Field] = &[
        f("user", Kind::Str),
        f("relation", Kind::Str),
        f("object", Kind::Str),
    ];
    pub const READ_REQUEST: &[Field] = &[
        f("store_id", Kind::Str),
        f("tuple_key", Kind::Message(READ_REQUEST_TUPLE_KEY)),
        f("page_size", Kind::Int32Wrapper),
        f("continuation_token", Kind::Str),
        f("consistency", Kind::Enum),
    ];
}

mod fastjson {
    //! Typed, borrowing deserialisation of a WriteRequest body that protojson's rules already
    //! accepted (`gojson::check_protojson`): unknown fields skipped, `null` meaning unset,
    //! messages only from JSON objects (never serde's "struct from a sequence"). It declines
    //! (and the caller falls back to `serde_json::Value`) where one type serves two messages
    //! here but not in the proto: an `on_missing` among the writes, a delete's `condition`.

    use std::borrow::Cow;
    use std::fmt;

    use serde::Deserialize;
    use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
    use serde_json::{Map, Value};

    use super::{CondIn, TK, TupleList, WriteReq};

    /// A JSON string, borrowed from the body unless it has escapes.
    pub struct Str<'a>(pub Cow<'a, str>);

    impl<'de> Deserialize<'de> for Str<'de> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Str<'de>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a string")
                }
                fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                    Ok(Str(Cow::Borrowed(v)))
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                    Ok(Str(Cow::Owned(v.to_owned())))
                }
                fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                    Ok(Str(Cow::Owned(v)))
                }
            }
            d.deserialize_str(V)
        }
    }

    fn text<'v>(s: &'v Option<Str<'_>>) -> &'v str {
        s.as_ref().map_or("", |s| s.0.as_ref())
    }

    /// Implements `Deserialize` for a message from a JSON object only.
    macro_rules! message {
        ($ty:ident { $($json:literal => $field:ident : $fty:ty),* $(,)? }) => {
            #[derive(Default)]
            pub struct $ty<'a> {
                $(pub $field: Option<$fty>,)*
                _marker: std::marker::PhantomData<&'a ()>,
            }

            impl<'de> Deserialize<'de> for $ty<'de> {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    struct V;
                    impl<'de> Visitor<'de> for V {
                        type Value = $ty<'de>;
                        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                            f.write_str("an object")
                        }
                        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$ty<'de>, A::Error> {
                            let mut out = $ty::default();
                            while let Some(key) = map.next_key::<Str<'de>>()? {
                                match key.0.as_ref() {
                                    $($json => out.$field = map.next_value()?,)*
                                    _ => {
                                        map.next_value::<IgnoredAny>()?;
                                    }
                                }
                            }
                            Ok(out)
                        }
                    }
                    d.deserialize_map(V)
                }
            }
        };
    }

    message!(WriteBody {
        "store_id" => store_id: Str<'a>,
        "writes" => writes: ListBody<'a>,
        "deletes" => deletes: ListBody<'a>,
        "authorization_model_id" => model_id: Str<'a>,
    });
    // One type for both lists: a badly typed option of the other list (an unknown field there)
    // sends the body to the slow path, which ignores it.
    message!(ListBody {
        "tuple_keys" => keys: Vec<KeyBody<'a>>,
        "on_duplicate" => on_duplicate: Str<'a>,
        "on_missing" => on_missing: Str<'a>,
    });
    message!(KeyBody {
        "user" => user: Str<'a>,
        "relation" => relation: Str<'a>,
        "object" => object: Str<'a>,
        "condition" => condition: CondBody<'a>,
    });
    message!(CondBody {
        "name" => name: Str<'a>,
        "context" => context: Map<String, Value>,
    });

    impl WriteBody<'_> {
        pub fn request(&self) -> WriteReq<'_> {
            WriteReq {
                writes: list(&self.writes, true),
                deletes: list(&self.deletes, false),
                model_id: text(&self.model_id),
            }
        }
    }

    fn list<'v>(l: &'v Option<ListBody<'_>>, writes: bool) -> Option<TupleList<'v>> {
        l.as_ref().map(|l| TupleList {
            keys: l.keys.iter().flatten().map(|k| key(k, writes)).collect(),
            option: text(if writes {
                &l.on_duplicate
            } else {
                &l.on_missing
            }),
        })
    }

    fn key<'v>(k: &'v KeyBody<'_>, with_condition: bool) -> TK<'v> {
        TK {
            user: text(&k.user),
            relation: text(&k.relation),
            object: text(&k.object),
            condition: k
                .condition
                .as_ref()
                .filter(|_| with_condition)
                .map(|c| CondIn {
                    name: text(&c.name),
                    context: c.context.as_ref(),
                }),
        }
    }
}

// Lenient accessors for a `Value` that protojson's rules already accepted: a field of the
// wrong type can only be one that is unknown where it stands, which protojson skips.

fn v_str<'v>(m: &'v Map<String, Value>, name: &str) -> &'v str {
    m.get(name).and_then(Value::as_str).unwrap_or("")
}

fn v_obj<'v>(m: &'v Map<String, Value>, name: &str) -> Option<&'v Map<String, Value>> {
    m.get(name).and_then(Value::as_object)
}

fn v_list<'v>(
    m: &'v Map<String, Value>,
    name: &str,
) -> impl Iterator<Item = &'v Map<String, Value>> + 'v {
    m.get(name)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

#[derive(Clone, Copy)]
struct CondIn<'v> {
    name: &'v str,
    context: Option<&'v Map<String, Value>>,
}

#[derive(Clone, Copy)]
struct TK<'v> {
    user: &'v str,
    relation: &'v str,
    object: &'v str,
    condition: Option<CondIn<'v>>,
}

struct TupleList<'v> {
    keys: Vec<TK<'v>>,
    /// `on_duplicate` or `on_missing`.
    option: &'v str,
}

/// `WriteRequest` (api `openfga/v1/openfga_service.proto`). Unknown fields are dropped, as
/// `DiscardUnknown` does; `store_id` comes from the path.
struct WriteReq<'v> {
    writes: Option<TupleList<'v>>,
    deletes: Option<TupleList<'v>>,
    model_id: &'v str,
}

impl<'v> WriteReq<'v> {
    fn from_value(v: &'v Value) -> Self {
        let Some(top) = v.as_object() else {
            return WriteReq {
                writes: None,
                deletes: None,
                model_id: "",
            };
        };
        let list = |field: &str, option: &str, with_condition: bool| {
            v_obj(top, field).map(|msg| TupleList {
                keys: v_list(msg, "tuple_keys")
                    .map(|k| TK {
                        user: v_str(k, "user"),
                        relation: v_str(k, "relation"),
                        object: v_str(k, "object"),
                        // TupleKeyWithoutCondition has no `condition`: unknown, skipped.
                        condition: v_obj(k, "condition").filter(|_| with_condition).map(|c| {
                            CondIn {
                                name: v_str(c, "name"),
                                context: v_obj(c, "context"),
                            }
                        }),
                    })
                    .collect(),
                option: v_str(msg, option),
            })
        };
        WriteReq {
            writes: list("writes", "on_duplicate", true),
            deletes: list("deletes", "on_missing", false),
            model_id: v_str(top, "authorization_model_id"),
        }
    }

    fn all_keys(&self) -> impl Iterator<Item = (&'v str, &'v str, &'v str)> + '_ {
        self.writes
            .iter()
            .chain(self.deletes.iter())
            .flat_map(|l| l.keys.iter().map(|k| (k.user, k.relation, k.object)))
    }

    /// The protobuf encoding size of the request gRPC receives.
    fn proto_size(&self, store_id: &str) -> usize {
        let list = |l: &TupleList<'_>| -> usize {
            l.keys
                .iter()
                .map(|k| {
                    let cond = k.condition.map_or(0, |c| {
                        len_field(
                            str_field(c.name) + c.context.map_or(0, |m| len_field(struct_size(m))),
                        )
                    });
                    len_field(
                        str_field(k.user) + str_field(k.relation) + str_field(k.object) + cond,
                    )
                })
                .sum::<usize>()
                + str_field(l.option)
        };
        str_field(store_id)
            + self.writes.as_ref().map_or(0, |l| len_field(list(l)))
            + self.deletes.as_ref().map_or(0, |l| len_field(list(l)))
            + str_field(self.model_id)
    }
}

#[derive(Clone, Copy, Default)]
struct ReadKey<'v> {
    user: &'v str,
    relation: &'v str,
    object: &'v str,
}

/// `ReadRequest`.
struct ReadReq<'v> {
    tuple_key: Option<ReadKey<'v>>,
    page_size: Option<i64>,
    token: &'v str,
    consistency: i64,
}

impl<'v> ReadReq<'v> {
    fn from_value(top: &'v Map<String, Value>) -> Self {
        ReadReq {
            tuple_key: v_obj(top, "tuple_key").map(|tk| ReadKey {
                user: v_str(tk, "user"),
                relation: v_str(tk, "relation"),
                object: v_str(tk, "object"),
            }),
            // google.protobuf.Int32Value: a number or a numeric string.
            page_size: top.get("page_size").and_then(json_int32),
            token: v_str(top, "continuation_token"),
            // An enum: a number, or a name (unknown names are dropped by DiscardUnknown).
            consistency: match top.get("consistency") {
                Some(Value::String(s)) => match s.as_str() {
                    "MINIMIZE_LATENCY" => 100,
                    "HIGHER_CONSISTENCY" => 200,
                    _ => 0,
                },
                Some(v) => json_int32(v).unwrap_or(0),
                None => 0,
            },
        }
    }
}

/// protojson's int32 reading: an integral number (or a string holding one) within range.
fn json_int32(v: &Value) -> Option<i64> {
    let f = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) if !s.is_empty() && s.trim() == s => s.parse::<f64>().ok()?,
        _ => return None,
    };
    (f.fract() == 0.0 && f >= f64::from(i32::MIN) && f <= f64::from(i32::MAX)).then_some(f as i64)
}

/// Go `strconv.ParseInt(value, 10, 32)` and its error text.
fn parse_go_int32(value: &str) -> Result<i64, String> {
    let digits = value.strip_prefix(['+', '-']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.ParseInt: parsing \"{value}\": invalid syntax"
        ));
    }
    match value.parse::<i128>() {
        Ok(n) if n >= i128::from(i32::MIN) && n <= i128::from(i32::MAX) => Ok(n as i64),
        _ => Err(format!(
            "strconv.ParseInt: parsing \"{value}\": value out of range"
        )),
    }
}

/// Go `url.ParseQuery` (what `Request.ParseForm` uses): `&`-separated, `+` is a space,
/// `%XX` escapes; a semicolon or a bad escape is an error.
fn parse_query(query: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for part in query.split('&') {
        if part.is_empty() {
            continue;
        }
        if part.contains(';') {
            return Err("invalid semicolon separator in query".to_owned());
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((unescape_query(k)?, unescape_query(v)?));
    }
    Ok(out)
}

fn unescape_query(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) {
                    (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                    _ => {
                        let bad: String = s[i..].chars().take(3).collect();
                        return Err(format!("invalid URL escape \"{bad}\""));
                    }
                }
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

// ------------------------------------------------------------------------------------------------
// PGV validation (api `proto/openfga/v1/*.pb.validate.go`, `ValidateAll`)
// ------------------------------------------------------------------------------------------------

fn pgv_leaf(message: &str, field: &str, reason: &str) -> String {
    format!("invalid {message}.{field}: {reason}")
}

fn pgv_embedded(message: &str, field: &str, cause: &str) -> String {
    format!("invalid {message}.{field}: embedded message failed validation | caused by: {cause}")
}

/// RE2's `\s`: `[\t\n\f\r ]`.
fn is_re2_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\u{c}' | '\r' | ' ')
}

/// `^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$`
fn is_ulid(s: &str) -> bool {
    s.len() == 26
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b)))
}

/// The number of characters (RE2 counts runes).
fn char_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
}

/// RE2's `\s` and the other excluded characters are all ASCII, so bytes can be tested directly
/// (no byte of a multi-byte UTF-8 sequence is ASCII).
fn is_re2_space_byte(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' ')
}

/// `^[^:#@\s]{1,50}$`
fn relation_pattern_ok(s: &str) -> bool {
    (1..=50).contains(&char_len(s))
        && !s
            .bytes()
            .any(|b| matches!(b, b':' | b'#' | b'@') || is_re2_space_byte(b))
}

/// `^[^\s]{2,256}$` (objects and condition names)
fn nonspace_2_256(s: &str) -> bool {
    (2..=256).contains(&char_len(s)) && !s.bytes().any(is_re2_space_byte)
}

/// `^[^\s]{1,511}:[^\s]{1,511}$` (Read's user filter)
fn read_user_pattern_ok(s: &str) -> bool {
    if s.chars().any(is_re2_space) {
        return false;
    }
    let n = s.chars().count();
    s.chars()
        .enumerate()
        .any(|(p, c)| c == ':' && (1..=511).contains(&p) && (1..=511).contains(&(n - p - 1)))
}

/// `^[a-zA-Z0-9\s\.\-\/^_&@]{3,64}$`
fn store_name_ok(s: &str) -> bool {
    let n = s.chars().count();
    (3..=64).contains(&n)
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || is_re2_space(c) || ".-/^_&@".contains(c))
}

/// `max_bytes: 5120` and `^$|^[A-Za-z0-9-_]+={0,2}$`
fn pgv_token(message: &str, token: &str, errs: &mut Vec<String>) {
    if token.len() > 5120 {
        errs.push(pgv_leaf(
            message,
            "ContinuationToken",
            "value length must be at most 5120 bytes",
        ));
    }
    let body = token.trim_end_matches('=');
    let ok = token.is_empty()
        || (!body.is_empty()
            && token.len() - body.len() <= 2
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    if !ok {
        errs.push(pgv_leaf(message, "ContinuationToken", TOKEN_REASON));
    }
}

fn pgv_write(store_id: &str, req: &WriteReq<'_>) -> Option<String> {
    let mut errs = Vec::new();
    if !is_ulid(store_id) {
        errs.push(pgv_leaf("WriteRequest", "StoreId", ULID_REASON));
    }
    for (list, field, message, key_message) in [
        (&req.writes, "Writes", "WriteRequestWrites", "TupleKey"),
        (
            &req.deletes,
            "Deletes",
            "WriteRequestDeletes",
            "TupleKeyWithoutCondition",
        ),
    ] {
        let Some(list) = list else { continue };
        let mut inner = Vec::new();
        if list.keys.is_empty() {
            inner.push(pgv_leaf(message, "TupleKeys", MIN_ITEMS_REASON));
        }
        for (i, tk) in list.keys.iter().enumerate() {
            if let Some(e) = pgv_tuple_key(key_message, tk) {
                inner.push(pgv_embedded(message, &format!("TupleKeys[{i}]"), &e));
            }
        }
        if !inner.is_empty() {
            errs.push(pgv_embedded("WriteRequest", field, &inner.join("; ")));
        }
    }
    if !req.model_id.is_empty() && !is_ulid(req.model_id) {
        errs.push(pgv_leaf(
            "WriteRequest",
            "AuthorizationModelId",
            ULID_REASON,
        ));
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

fn pgv_tuple_key(message: &str, tk: &TK<'_>) -> Option<String> {
    let mut errs = Vec::new();
    if tk.user.len() > 512 {
        errs.push(pgv_leaf(message, "User", USER_LENGTH_REASON));
    }
    if !tk.relation.is_empty() && !relation_pattern_ok(tk.relation) {
        errs.push(pgv_leaf(message, "Relation", RELATION_REASON));
    }
    if !tk.object.is_empty() && !nonspace_2_256(tk.object) {
        errs.push(pgv_leaf(message, "Object", OBJECT_REASON));
    }
    if let Some(c) = tk.condition
        && !nonspace_2_256(c.name)
    {
        let cause = pgv_leaf("RelationshipCondition", "Name", CONDITION_NAME_REASON);
        errs.push(pgv_embedded(message, "Condition", &cause));
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

fn pgv_read(store_id: &str, req: &ReadReq<'_>) -> Option<String> {
    let mut errs = Vec::new();
    if !is_ulid(store_id) {
        errs.push(pgv_leaf("ReadRequest", "StoreId", ULID_REASON));
    }
    if let Some(tk) = req.tuple_key {
        let mut inner = Vec::new();
        if !tk.user.is_empty() {
            if tk.user.len() > 512 {
                inner.push(pgv_leaf("ReadRequestTupleKey", "User", USER_LENGTH_REASON));
            }
            if !read_user_pattern_ok(tk.user) {
                inner.push(pgv_leaf("ReadRequestTupleKey", "User", READ_USER_REASON));
            }
        }
        if !tk.relation.is_empty() && !relation_pattern_ok(tk.relation) {
            inner.push(pgv_leaf("ReadRequestTupleKey", "Relation", RELATION_REASON));
        }
        if !tk.object.is_empty() && !nonspace_2_256(tk.object) {
            inner.push(pgv_leaf("ReadRequestTupleKey", "Object", OBJECT_REASON));
        }
        if !inner.is_empty() {
            errs.push(pgv_embedded("ReadRequest", "TupleKey", &inner.join("; ")));
        }
    }
    if let Some(n) = req.page_size
        && !(1..=100).contains(&n)
    {
        errs.push(pgv_leaf("ReadRequest", "PageSize", PAGE_SIZE_REASON));
    }
    pgv_token("ReadRequest", req.token, &mut errs);
    if ![0, 100, 200].contains(&req.consistency) {
        errs.push(pgv_leaf(
            "ReadRequest",
            "Consistency",
            "value must be one of the defined enum values",
        ));
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

// ------------------------------------------------------------------------------------------------
// Error encoding (openfga `pkg/server/errors/encoded_errors.go`)
// ------------------------------------------------------------------------------------------------

/// `sanitizedMessage`: the text after the last `| caused by:`, `unexpected EOF` →
/// `malformed JSON`, no `rpc error: code = X desc = ` prefix, no leading `proto:`.
fn sanitized_message(message: &str) -> String {
    let last = message
        .rsplit("| caused by:")
        .next()
        .unwrap_or(message)
        .trim();
    let mut s = last.replace("unexpected EOF", "malformed JSON");
    while let Some(start) = s.find("rpc error: code = ") {
        let rest = &s[start + "rpc error: code = ".len()..];
        let code_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '(' || c == ')'))
            .unwrap_or(rest.len());
        if !rest[code_len..].starts_with(" desc = ") {
            break;
        }
        let end = start + "rpc error: code = ".len() + code_len + " desc = ".len();
        s.replace_range(start..end, "");
    }
    s.strip_prefix("proto:").unwrap_or(&s).trim().to_owned()
}

/// `ConvertToEncodedErrorCode` for `InvalidArgument`: `invalid Msg.Field: reason` may map to
/// a field-specific code (`getCustomizedErrorCode`), anything else is `validation_error`.
fn invalid_argument_code(sanitized: &str) -> &'static str {
    let Some((object, reason)) = sanitized.split_once(": ") else {
        return "validation_error";
    };
    let parts: Vec<&str> = object.split('.').collect();
    if parts.len() != 2 {
        return "validation_error";
    }
    let field = parts[1];
    let starts = |p: &str| reason.starts_with(p);
    match field {
        "Assertions" if starts("value must contain no more than") => "assertions_too_many_items",
        "AuthorizationModelId" if starts("value length must be at most") => {
            "authorization_model_id_too_long"
        }
        "Base" if starts("value is required") => "difference_base_missing_value",
        "Id" if starts("value length must be at most") => "id_too_long",
        "Object" if starts("value length must be at most") => "object_too_long",
        "PageSize" if starts("value must be inside range") => "page_size_invalid",
        "Params" if starts("value is required") => "param_missing_value",
        "Relation" if starts("value length must be at most") => "relation_too_long",
        "Relations" if starts("value must contain at least") => "relations_too_few_items",
        "Subtract" if starts("value is required") => "subtract_base_missing_value",
        "StoreId" if starts("value length must be") => "store_id_invalid_length",
        "TupleKey" if starts("value is required") => "tuple_key_value_not_specified",
        "TupleKeys" if starts("value must contain between") => {
            "tuple_keys_too_many_or_too_few_items"
        }
        "Type" if starts("value length must be at") => "type_invalid_length",
        "Type" if starts("value does not match regex pattern") => "type_invalid_pattern",
        "TypeDefinitions" if starts("value must contain at least") => {
            "type_definitions_too_few_items"
        }
        f if f.starts_with("Relations[") && starts("value length must be at most") => {
            "relations_too_long"
        }
        f if f.starts_with("Relations[") && starts("value does not match regex pattern") => {
            "relations_invalid_pattern"
        }
        _ => "validation_error",
    }
}

// ------------------------------------------------------------------------------------------------
// Tuple validation against the model (openfga `internal/validation/validation.go`,
// `pkg/tuple/tuple.go`)
// ------------------------------------------------------------------------------------------------
//
// The well-formedness rules, exactly as OpenFGA's `pkg/tuple` implements them (no control
// characters anywhere; `#`, `:`, `@` and space are the separators):
// - object (`IsValidObject`): `type:id` — exactly one `:`, not first, a non-empty id, no `#`
//   and no space. `type:*` is well-formed but rejected as an object by the validation.
// - relation (`IsValidRelation`): non-empty, no `#`, `:`, `@` or space.
// - user (`IsValidUser`): `*`, or a bare id (no `#`, `:`, space), or an object `type:id`
//   (including `type:*`), or a userset `type:id#relation` (one `:` not first, a non-empty id
//   without `*`, one `#`, a non-empty relation). A write's user must then be an object or a
//   userset (schema 1.1); a delete's user only needs to pass `IsValidUser`.

fn split_object(s: &str) -> (&str, &str) {
    match s.bytes().position(|b| b == b':') {
        None => ("", s),
        Some(i) => (&s[..i], &s[i + 1..]),
    }
}

fn split_object_relation(s: &str) -> (&str, &str) {
    match s.bytes().rposition(|b| b == b'#') {
        None => (s, ""),
        Some(i) if i == s.len() - 1 => (&s[..i], ""),
        Some(i) => (&s[..i], &s[i + 1..]),
    }
}

fn is_valid_object(s: &str) -> bool {
    let (mut state, mut id_len) = (0usize, 0usize);
    for (ndx, c) in s.char_indices() {
        if c.is_control() {
            return false;
        }
        match c {
            '#' | ' ' => return false,
            ':' => {
                if state > 0 || ndx == 0 {
                    return false;
                }
                state = 1;
            }
            _ => id_len += state,
        }
    }
    id_len > 0
}

fn is_valid_relation(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_control() || matches!(c, '#' | ':' | '@' | ' '))
}

fn is_valid_user_id(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_control() || matches!(c, '#' | ':' | ' '))
}

fn is_valid_userset(s: &str) -> bool {
    let (mut state, mut id_len, mut rel_len) = (0u8, 0usize, 0usize);
    for (ndx, c) in s.char_indices() {
        if c.is_control() {
            return false;
        }
        match c {
            ':' => {
                if state > 0 || ndx == 0 {
                    return false;
                }
                state = 1;
            }
            '#' => {
                if state > 1 || id_len == 0 {
                    return false;
                }
                state = 2;
            }
            ' ' => return false,
            '*' if state > 0 => return false,
            '*' => {}
            _ => match state {
                1 => id_len += 1,
                2 => rel_len += 1,
                _ => {}
            },
        }
    }
    rel_len > 0
}

fn is_valid_user(s: &str) -> bool {
    s == "*" || is_valid_user_id(s) || is_valid_object(s) || is_valid_userset(s)
}

fn is_typed_wildcard(s: &str) -> bool {
    let (t, id) = split_object(s);
    !t.is_empty() && id == "*"
}

/// `tuple.InvalidTupleError`: `Invalid tuple 'object#relation@user'. Reason: …`
fn invalid_tuple(tk: &TK<'_>, reason: &str) -> String {
    format!(
        "Invalid tuple '{}'. Reason: {reason}",
        key_string(tk.object, tk.relation, tk.user)
    )
}

/// `tuple.InvalidConditionalTupleError`: the key is followed by ` (condition name)`.
fn invalid_conditional_tuple(tk: &TK<'_>, reason: &str) -> String {
    let mut key = key_string(tk.object, tk.relation, tk.user);
    if let Some(c) = tk.condition {
        let _ = write!(key, " (condition {})", c.name);
    }
    format!("Invalid tuple '{key}'. Reason: {reason}")
}

/// `ValidateTupleForWrite` for a schema 1.1 model without tuple-to-userset rewrites.
fn validate_tuple_for_write(model: &Model, tk: &TK<'_>) -> Result<(), String> {
    validate_user(model, tk.user)
        .and_then(|()| validate_object(model, tk.object))
        .and_then(|()| validate_relation(model, tk.object, tk.relation))
        .map_err(|reason| invalid_tuple(tk, &reason))?;
    validate_type_restrictions(model, tk).map_err(|reason| invalid_tuple(tk, &reason))?;
    validate_condition(model, tk).map_err(|reason| invalid_conditional_tuple(tk, &reason))
}

fn validate_user(model: &Model, user: &str) -> Result<(), String> {
    if !is_valid_user(user) {
        return Err("the 'user' field is malformed".to_owned());
    }
    let is_object = is_valid_object(user);
    let is_userset = is_valid_userset(user);
    let (user_object, user_relation) = split_object_relation(user);
    let user_type = split_object(user_object).0;
    if !is_object && !is_userset {
        return Err("the 'user' field must be an object (e.g. document:1) or an 'object#relation' or a typed wildcard (e.g. group:*)".to_owned());
    }
    if !model.has_type(user_type) {
        return Err(format!("type '{user_type}' not found"));
    }
    if is_userset && model.relation(user_type, user_relation).is_none() {
        return Err(format!("relation '{user_type}#{user_relation}' not found"));
    }
    Ok(())
}

fn validate_object(model: &Model, object: &str) -> Result<(), String> {
    if !is_valid_object(object) {
        return Err("invalid 'object' field format".to_owned());
    }
    let (object_type, id) = split_object(object);
    if id == "*" {
        return Err("the 'object' field cannot reference a typed wildcard".to_owned());
    }
    if !model.has_type(object_type) {
        return Err(format!("type '{object_type}' not found"));
    }
    Ok(())
}

fn validate_relation(model: &Model, object: &str, relation: &str) -> Result<(), String> {
    if !is_valid_relation(relation) {
        return Err("the 'relation' field is malformed".to_owned());
    }
    let object_type = split_object(object).0;
    if !model.has_type(object_type) {
        return Err(format!("type '{object_type}' not found"));
    }
    if model.relation(object_type, relation).is_none() {
        return Err(format!("relation '{object_type}#{relation}' not found"));
    }
    Ok(())
}

fn validate_type_restrictions(model: &Model, tk: &TK<'_>) -> Result<(), String> {
    let object_type = split_object(tk.object).0;
    let (user_object, user_relation) = split_object_relation(tk.user);
    let user_type = split_object(user_object).0;
    let allowed = model.relation(object_type, tk.relation).unwrap_or(&[]);
    if is_valid_userset(tk.user) {
        if allowed
            .iter()
            .any(|r| r.user_type == user_type && r.relation.as_deref() == Some(user_relation))
        {
            return Ok(());
        }
        return Err(format!(
            "'{user_type}#{user_relation}' is not an allowed type restriction for '{object_type}#{}'",
            tk.relation
        ));
    }
    if is_typed_wildcard(tk.user) {
        if allowed
            .iter()
            .any(|r| r.user_type == user_type && r.wildcard)
        {
            return Ok(());
        }
        return Err(format!(
            "the typed wildcard '{}' is not an allowed type restriction for '{object_type}#{}'",
            tk.user, tk.relation
        ));
    }
    if allowed
        .iter()
        .any(|r| r.user_type == user_type && !r.wildcard && r.relation.is_none())
    {
        return Ok(());
    }
    Err(format!(
        "type '{user_type}' is not an allowed type restriction for '{object_type}#{}'",
        tk.relation
    ))
}

fn validate_condition(model: &Model, tk: &TK<'_>) -> Result<(), String> {
    let object_type = split_object(tk.object).0;
    let user_type = split_object(tk.user).0;
    let user_relation = split_object_relation(tk.user).1;
    let allowed = model.relation(object_type, tk.relation).unwrap_or(&[]);
    let Some(condition) = tk.condition else {
        for r in allowed {
            if r.condition.is_some() || r.user_type != user_type {
                continue;
            }
            if r.relation.is_some() || r.wildcard {
                if r.relation
                    .as_deref()
                    .is_some_and(|rel| rel != user_relation)
                {
                    continue;
                }
                if r.wildcard && !is_typed_wildcard(tk.user) {
                    continue;
                }
            } else if is_typed_wildcard(tk.user) {
                continue;
            }
            return Ok(());
        }
        return Err("condition is missing".to_owned());
    };
    if condition.name.chars().any(char::is_control) {
        return Err("condition name contains forbidden characters".to_owned());
    }
    let Some(params) = model.conditions.get(condition.name) else {
        return Err("undefined condition".to_owned());
    };
    if !allowed
        .iter()
        .any(|r| r.user_type == user_type && r.condition.as_deref() == Some(condition.name))
    {
        return Err("invalid condition for type restriction".to_owned());
    }
    let Some(context) = condition.context else {
        return Ok(());
    };
    validate_struct_chars(context)?;
    if context.is_empty() {
        return Ok(());
    }
    if params.is_empty() {
        return Err(format!(
            "parameter type error on condition '{}' - no parameters defined for the condition",
            condition.name
        ));
    }
    // Go iterates a map in random order; with several bad keys the one named here is the
    // smallest.
    let mut keys: Vec<&String> = context.keys().collect();
    keys.sort();
    if let Some(bad) = keys.into_iter().find(|k| !params.contains(k)) {
        return Err(format!("found invalid context parameter: {bad}"));
    }
    Ok(())
}

/// `ValidateStruct`: no control characters in context keys or string values.
fn validate_struct_chars(m: &Map<String, Value>) -> Result<(), String> {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    for k in keys {
        if k.chars().any(char::is_control) {
            return Err(format!(
                "context key {} contains forbidden characters",
                go_quote(k)
            ));
        }
        validate_value_chars(&m[k])?;
    }
    Ok(())
}

fn validate_value_chars(v: &Value) -> Result<(), String> {
    match v {
        Value::String(s) if s.chars().any(char::is_control) => Err(format!(
            "context value {} contains forbidden characters",
            go_quote(s)
        )),
        Value::Array(items) => items.iter().try_for_each(validate_value_chars),
        Value::Object(m) => validate_struct_chars(m),
        _ => Ok(()),
    }
}

// ------------------------------------------------------------------------------------------------
// Encodings: JSON text, protobuf sizes, timestamps, tokens
// ------------------------------------------------------------------------------------------------

/// JSON string escaping as protojson (and serde_json) do it.
fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go `encoding/json` escaping with `SetEscapeHTML(false)`: the same, plus U+2028 and U+2029.
fn write_go_json_str(s: &str, out: &mut String) {
    let mut tmp = String::with_capacity(s.len() + 2);
    write_json_str(s, &mut tmp);
    if tmp.contains(['\u{2028}', '\u{2029}']) {
        tmp = tmp
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029");
    }
    out.push_str(&tmp);
}

/// Go `strconv.Quote`, close enough for the control characters it is used for.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push_str(&gojson::quote_rune(c)),
        }
    }
    out.push('"');
    out
}

/// A JSON value as a `google.protobuf.Value` prints it: objects with sorted keys, numbers as
/// doubles (protobuf-go `appendFloat`).
fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&format_double(n.as_f64().unwrap_or(0.0))),
        Value::String(s) => write_json_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => write_canonical_object(m, out),
    }
}

fn write_canonical_object(m: &Map<String, Value>, out: &mut String) {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    out.push('{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_str(k, out);
        out.push(':');
        write_canonical(&m[k], out);
    }
    out.push('}');
}

/// protobuf-go `appendFloat` for a double: `%f`-style shortest digits, `e` notation below 1e-6
/// and from 1e21 (`1e+21`, `1e-7`). Negative zero prints as 0 so equal values compare equal.
fn format_double(f: f64) -> String {
    if f == 0.0 {
        return "0".to_owned();
    }
    let a = f.abs();
    if (1e-6..1e21).contains(&a) {
        format!("{f}")
    } else {
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
            _ => s,
        }
    }
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// A length-delimited field with a one-byte tag.
fn len_field(payload: usize) -> usize {
    1 + varint_len(payload as u64) + payload
}

/// A proto3 string field (omitted when empty).
fn str_field(s: &str) -> usize {
    if s.is_empty() { 0 } else { len_field(s.len()) }
}

/// `proto.Size` of a `google.protobuf.Struct`: map entries always carry key and value.
fn struct_size(m: &Map<String, Value>) -> usize {
    m.iter()
        .map(|(k, v)| len_field(len_field(k.len()) + len_field(value_size(v))))
        .sum()
}

/// `proto.Size` of a `google.protobuf.Value` (a oneof: always encoded).
fn value_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 2,
        Value::Number(_) => 9,
        Value::String(s) => len_field(s.len()),
        Value::Object(m) => len_field(struct_size(m)),
        Value::Array(items) => len_field(items.iter().map(|i| len_field(value_size(i))).sum()),
    }
}

/// A `google.protobuf.Timestamp` as protojson prints it; microseconds, as PostgreSQL keeps.
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let micros = d.subsec_micros();
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    );
    if micros != 0 {
        if micros.is_multiple_of(1000) {
            let _ = write!(s, ".{:03}", micros / 1000);
        } else {
            let _ = write!(s, ".{micros:06}");
        }
    }
    s.push('Z');
    s
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Go `base64.URLEncoding` (padded), as OpenFGA's token encoder uses.
fn b64url_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (ci, chunk) in b.chunks(4).enumerate() {
        let last = ci == b.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = if i >= 4 - pad {
                0
            } else {
                B64.iter().position(|&x| x == c)? as u32
            };
            n = (n << 6) | v;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// A continuation token: base64url of UTF-8 text; "" for none; None when it does not decode.
fn decode_token(token: &str) -> Option<String> {
    if token.is_empty() {
        return Some(String::new());
    }
    String::from_utf8(b64url_decode(token)?).ok()
}

/// A recorded body as JSON for `WriteRecord::body`: its first JSON value (all the server ever
/// reads), `Null` for an empty body, the text itself when that is not JSON.
fn body_as_json(body: &[u8]) -> Value {
    let as_text = || Value::String(String::from_utf8_lossy(body).into_owned());
    match gojson::first_value(body) {
        Ok(None) => Value::Null,
        Ok(Some((start, end))) => {
            serde_json::from_slice(&body[start..end]).unwrap_or_else(|_| as_text())
        }
        Err(_) => as_text(),
    }
}

// ------------------------------------------------------------------------------------------------
// Go's JSON decoder, for its error messages and for protojson error positions
// ------------------------------------------------------------------------------------------------

mod gojson {
    //! Go `encoding/json`'s scanner (`scanner.go`) as `json.Decoder` runs it for the first
    //! value of a stream, with its error texts; plus the position arithmetic protobuf-go uses
    //! in its errors (`internal/encoding/json/decode.go` `Position`).

    const EOF: &str = "unexpected EOF";

    /// The first JSON value's byte range, `None` for an empty or all-space body, or Go's error.
    pub fn first_value(b: &[u8]) -> Result<Option<(usize, usize)>, String> {
        let mut p = Scanner { b, i: 0 };
        p.skip_ws();
        if p.i >= b.len() {
            return Ok(None);
        }
        let start = p.i;
        p.value()?;
        Ok(Some((start, p.i)))
    }

    struct Scanner<'a> {
        b: &'a [u8],
        i: usize,
    }

    fn err(c: u8, context: &str) -> String {
        format!("invalid character {} {context}", quote_char(c))
    }

    impl Scanner<'_> {
        fn peek(&self) -> Option<u8> {
            self.b.get(self.i).copied()
        }

        fn skip_ws(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        fn value(&mut self) -> Result<(), String> {
            match self.peek() {
                None => Err(EOF.to_owned()),
                Some(b'{') => self.object(),
                Some(b'[') => self.array(),
                Some(b'"') => self.string(),
                Some(b'-' | b'0'..=b'9') => self.number(),
                Some(b't') => self.literal(b"true"),
                Some(b'f') => self.literal(b"false"),
                Some(b'n') => self.literal(b"null"),
                Some(c) => Err(err(c, "looking for beginning of value")),
            }
        }

        fn object(&mut self) -> Result<(), String> {
            self.i += 1;
            self.skip_ws();
            match self.peek() {
                None => return Err(EOF.to_owned()),
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'"') => {}
                Some(c) => return Err(err(c, "looking for beginning of object key string")),
            }
            loop {
                self.string()?;
                self.skip_ws();
                match self.peek() {
                    None => return Err(EOF.to_owned()),
                    Some(b':') => self.i += 1,
                    Some(c) => return Err(err(c, "after object key")),
                }
                self.skip_ws();
                self.value()?;
                self.skip_ws();
                match self.peek() {
                    None => return Err(EOF.to_owned()),
                    Some(b',') => {
                        self.i += 1;
                        self.skip_ws();
                        match self.peek() {
                            None => return Err(EOF.to_owned()),
                            Some(b'"') => {}
                            Some(c) => {
                                return Err(err(c, "looking for beginning of object key string"));
                            }
                        }
                    }
                    Some(b'}') => {
                        self.i += 1;
                        return Ok(());
                    }
                    Some(c) => return Err(err(c, "after object key:value pair")),
                }
            }
        }

        fn array(&mut self) -> Result<(), String> {
            self.i += 1;
            self.skip_ws();
            if self.peek() == Some(b']') {
                self.i += 1;
                return Ok(());
            }
            loop {
                self.skip_ws();
                self.value()?;
                self.skip_ws();
                match self.peek() {
                    None => return Err(EOF.to_owned()),
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        return Ok(());
                    }
                    Some(c) => return Err(err(c, "after array element")),
                }
            }
        }

        fn string(&mut self) -> Result<(), String> {
            self.i += 1;
            loop {
                match self.peek() {
                    None => return Err(EOF.to_owned()),
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(());
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        match self.peek() {
                            None => return Err(EOF.to_owned()),
                            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                                self.i += 1
                            }
                            Some(b'u') => {
                                self.i += 1;
                                for _ in 0..4 {
                                    match self.peek() {
                                        None => return Err(EOF.to_owned()),
                                        Some(h) if h.is_ascii_hexdigit() => self.i += 1,
                                        Some(c) => {
                                            return Err(err(
                                                c,
                                                "in \\u hexadecimal character escape",
                                            ));
                                        }
                                    }
                                }
                            }
                            Some(c) => return Err(err(c, "in string escape code")),
                        }
                    }
                    Some(c) if c < 0x20 => return Err(err(c, "in string literal")),
                    Some(_) => self.i += 1,
                }
            }
        }

        fn digits(&mut self) {
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }

        fn need_digit(&mut self, context: &str) -> Result<(), String> {
            match self.peek() {
                None => Err(EOF.to_owned()),
                Some(b'0'..=b'9') => Ok(()),
                Some(c) => Err(err(c, context)),
            }
        }

        fn number(&mut self) -> Result<(), String> {
            if self.peek() == Some(b'-') {
                self.i += 1;
                self.need_digit("in numeric literal")?;
            }
            if self.peek() == Some(b'0') {
                self.i += 1;
            } else {
                self.digits();
            }
            if self.peek() == Some(b'.') {
                self.i += 1;
                self.need_digit("after decimal point in numeric literal")?;
                self.digits();
            }
            if matches!(self.peek(), Some(b'e' | b'E')) {
                self.i += 1;
                if matches!(self.peek(), Some(b'+' | b'-')) {
                    self.i += 1;
                }
                self.need_digit("in exponent of numeric literal")?;
                self.digits();
            }
            Ok(())
        }

        fn literal(&mut self, word: &[u8]) -> Result<(), String> {
            self.i += 1;
            for &expected in &word[1..] {
                match self.peek() {
                    None => return Err(EOF.to_owned()),
                    Some(c) if c == expected => self.i += 1,
                    Some(c) => {
                        let context = format!(
                            "in literal {} (expecting {})",
                            String::from_utf8_lossy(word),
                            quote_char(expected)
                        );
                        return Err(err(c, &context));
                    }
                }
            }
            Ok(())
        }
    }

    /// Go `quoteChar`: a byte shown as a (Latin-1) rune in single quotes.
    fn quote_char(c: u8) -> String {
        match c {
            b'\'' => r"'\''".to_owned(),
            b'"' => "'\"'".to_owned(),
            c => format!("'{}'", quote_rune(char::from(c))),
        }
    }

    /// One rune as Go `strconv.Quote` writes it (without the quotes).
    pub fn quote_rune(c: char) -> String {
        match c {
            '\u{7}' => "\\a".to_owned(),
            '\u{8}' => "\\b".to_owned(),
            '\u{c}' => "\\f".to_owned(),
            '\n' => "\\n".to_owned(),
            '\r' => "\\r".to_owned(),
            '\t' => "\\t".to_owned(),
            '\u{b}' => "\\v".to_owned(),
            '\\' => "\\\\".to_owned(),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => format!("\\x{:02x}", c as u32),
            c if (0x80..=0xa0).contains(&(c as u32)) || c as u32 == 0xad || c.is_control() => {
                format!("\\u{:04x}", c as u32)
            }
            c => c.to_string(),
        }
    }

    fn skip_ws(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    fn skip_string(b: &[u8], mut i: usize) -> usize {
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return i + 1,
                _ => i += 1,
            }
        }
        i
    }

    fn skip_scalar(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && !matches!(b[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    fn skip_value(b: &[u8], i: usize) -> usize {
        match b.get(i) {
            Some(b'"') => skip_string(b, i),
            Some(&open @ (b'{' | b'[')) => {
                let close = if open == b'{' { b'}' } else { b']' };
                let mut j = skip_ws(b, i + 1);
                if b.get(j) == Some(&close) {
                    return j + 1;
                }
                loop {
                    if open == b'{' {
                        j = skip_string(b, j);
                        j = skip_ws(b, j) + 1;
                        j = skip_ws(b, j);
                    }
                    j = skip_ws(b, skip_value(b, j));
                    match b.get(j) {
                        Some(b',') => j = skip_ws(b, j + 1),
                        _ => return j + 1,
                    }
                }
            }
            _ => skip_scalar(b, i),
        }
    }

    /// A field of a request message, for [`check_protojson`].
    pub struct Field {
        pub name: &'static str,
        pub kind: Kind,
    }

    pub enum Kind {
        Str,
        Message(&'static [Field]),
        Repeated(&'static [Field]),
        /// `google.protobuf.Struct`
        Struct,
        /// `google.protobuf.Int32Value`
        Int32Wrapper,
        Enum,
    }

    /// protojson's `Unmarshal` with `DiscardUnknown` over an already well-formed JSON value,
    /// in document order, stopping at the first error as protobuf-go does
    /// (`encoding/protojson/decode.go`): unknown fields skipped, a repeated field name
    /// (`duplicate field`), a repeated Struct key (`duplicate map key`), `null` meaning unset,
    /// a message from anything but an object (`syntax error …: unexpected token`), a badly
    /// typed scalar (`invalid value for <kind> field <name>`). Positions are protobuf-go's:
    /// line and rune column from the first byte of the value.
    pub fn check_protojson(raw: &[u8], fields: &[Field]) -> Result<(), String> {
        let mut w = Walker {
            b: raw,
            i: skip_ws(raw, 0),
        };
        w.message(fields)
    }

    struct Walker<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Walker<'a> {
        fn peek(&self) -> Option<u8> {
            self.b.get(self.i).copied()
        }

        fn ws(&mut self) {
            self.i = skip_ws(self.b, self.i);
        }

        fn error_at(&self, pos: usize, message: &str) -> String {
            let (line, column) = line_col(self.b, pos);
            format!("proto: (line {line}:{column}): {message}")
        }

        fn unexpected(&self) -> String {
            let (line, column) = line_col(self.b, self.i);
            format!(
                "proto: syntax error (line {line}:{column}): unexpected token {}",
                raw_token(self.b, self.i)
            )
        }

        fn invalid(&self, kind: &str, name: &str) -> String {
            let token = raw_token(self.b, self.i);
            self.error_at(
                self.i,
                &format!("invalid value for {kind} field {name}: {token}"),
            )
        }

        /// An object key at `self.i`: its raw token and its decoded text; moves past the `:`.
        fn key(&mut self) -> (&'a [u8], std::borrow::Cow<'a, str>) {
            let start = self.i;
            let end = skip_string(self.b, start);
            let raw = &self.b[start..end];
            let inner = &raw[1..raw.len() - 1];
            let name = if inner.contains(&b'\\') {
                std::borrow::Cow::Owned(serde_json::from_slice::<String>(raw).unwrap_or_default())
            } else {
                String::from_utf8_lossy(inner)
            };
            self.i = skip_ws(self.b, end) + 1;
            self.ws();
            (raw, name)
        }

        fn message(&mut self, fields: &[Field]) -> Result<(), String> {
            if self.peek() != Some(b'{') {
                return Err(self.unexpected());
            }
            self.i += 1;
            let mut seen = 0u64;
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    self.i += 1; // the closing brace
                    return Ok(());
                }
                let key_pos = self.i;
                let (raw_key, name) = self.key();
                match fields.iter().position(|f| f.name == name) {
                    None => self.i = skip_value(self.b, self.i),
                    Some(n) => {
                        if seen & (1 << n) != 0 {
                            let message =
                                format!("duplicate field {}", String::from_utf8_lossy(raw_key));
                            return Err(self.error_at(key_pos, &message));
                        }
                        seen |= 1 << n;
                        self.field(&fields[n])?;
                    }
                }
                self.ws();
                if self.peek() == Some(b',') {
                    self.i += 1;
                }
            }
        }

        fn field(&mut self, field: &Field) -> Result<(), String> {
            // `null` leaves any of these fields unset.
            if self.b[self.i..].starts_with(b"null") {
                self.i += 4;
                return Ok(());
            }
            match field.kind {
                Kind::Str => {
                    if self.peek() != Some(b'"') {
                        return Err(self.invalid("string", field.name));
                    }
                    self.i = skip_string(self.b, self.i);
                }
                Kind::Message(fields) => self.message(fields)?,
                Kind::Repeated(fields) => {
                    if self.peek() != Some(b'[') {
                        return Err(self.unexpected());
                    }
                    self.i += 1;
                    loop {
                        self.ws();
                        if self.peek() == Some(b']') {
                            self.i += 1;
                            break;
                        }
                        self.message(fields)?;
                        self.ws();
                        if self.peek() == Some(b',') {
                            self.i += 1;
                        }
                    }
                }
                Kind::Struct => self.struct_value()?,
                Kind::Int32Wrapper => {
                    if !self.int32_token() {
                        return Err(self.invalid("int32", "value"));
                    }
                    self.i = skip_value(self.b, self.i);
                }
                Kind::Enum => {
                    // A name (unknown ones are discarded) or an int32.
                    if self.peek() != Some(b'"') && !self.int32_token() {
                        return Err(self.invalid("enum", field.name));
                    }
                    self.i = skip_value(self.b, self.i);
                }
            }
            Ok(())
        }

        fn int32_token(&self) -> bool {
            let end = skip_value(self.b, self.i);
            serde_json::from_slice::<serde_json::Value>(&self.b[self.i..end])
                .ok()
                .and_then(|v| super::json_int32(&v))
                .is_some()
        }

        /// A `google.protobuf.Struct`: an object whose keys may not repeat, at any depth.
        fn struct_value(&mut self) -> Result<(), String> {
            if self.peek() != Some(b'{') {
                return Err(self.unexpected());
            }
            self.i += 1;
            let mut keys: Vec<std::borrow::Cow<'a, str>> = Vec::new();
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    self.i += 1;
                    return Ok(());
                }
                let key_pos = self.i;
                let (raw_key, name) = self.key();
                if keys.contains(&name) {
                    let message = format!("duplicate map key {}", String::from_utf8_lossy(raw_key));
                    return Err(self.error_at(key_pos, &message));
                }
                keys.push(name);
                self.any_value()?;
                self.ws();
                if self.peek() == Some(b',') {
                    self.i += 1;
                }
            }
        }

        /// A `google.protobuf.Value`.
        fn any_value(&mut self) -> Result<(), String> {
            match self.peek() {
                Some(b'{') => self.struct_value(),
                Some(b'[') => {
                    self.i += 1;
                    loop {
                        self.ws();
                        if self.peek() == Some(b']') {
                            self.i += 1;
                            return Ok(());
                        }
                        self.any_value()?;
                        self.ws();
                        if self.peek() == Some(b',') {
                            self.i += 1;
                        }
                    }
                }
                _ => {
                    self.i = skip_value(self.b, self.i);
                    Ok(())
                }
            }
        }
    }

    /// The token at `pos` as protobuf-go's `Token.RawString` shows it.
    pub fn raw_token(raw: &[u8], pos: usize) -> String {
        let end = match raw.get(pos) {
            None => pos,
            Some(b'{' | b'[') => pos + 1,
            Some(b'"') => skip_string(raw, pos),
            Some(_) => skip_scalar(raw, pos),
        };
        String::from_utf8_lossy(&raw[pos..end.min(raw.len())]).into_owned()
    }

    /// protobuf-go `Decoder.Position`: 1-based line, and rune column.
    pub fn line_col(raw: &[u8], pos: usize) -> (usize, usize) {
        let before = &raw[..pos.min(raw.len())];
        let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1);
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        (line, column)
    }
}
