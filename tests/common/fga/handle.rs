//! OpenFGA as a test holds it: a store of its own on a real server, the fault proxy the relay
//! talks to, what the server holds and what the proxy passed on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::api::{Api, Refused};
use super::faults::{FaultRule, Latency, RandomFaults, Route};
use super::model::Model;
use super::openfga::{Flavour, LEGACY, MODERN};
use super::proxy::{BearerCheck, Proxy};
use super::records::{Change, StoredTuple, WriteRecord};
use super::server::{Control, accept_loop, bind_listener, rebind};

/// OpenFGA's default `maxTuplesPerWrite`.
pub const DEFAULT_MAX_TUPLES_PER_WRITE: usize = 100;

static STORES: AtomicUsize = AtomicUsize::new(0);

/// A test's OpenFGA: its own store (with a model) on a shared real server, behind a fault proxy
/// of its own. Stops the proxy when dropped.
pub struct Fga {
    /// Kept so that a server of this test's own lives as long as the store.
    server: Arc<super::openfga::Server>,
    api: Api,
    store_id: String,
    store_name: String,
    model_id: Option<String>,
    /// The model's JSON, for the other stores a test makes ([`Fga::add_store`]).
    model: Option<Value>,
    version: &'static str,
    proxy: Arc<Proxy>,
    addr: SocketAddr,
    control: tokio::sync::mpsc::UnboundedSender<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
    refusing: Mutex<bool>,
}

pub struct FgaBuilder {
    flavour: Flavour,
    bearer: Option<BearerCheck>,
    model: Option<Model>,
}

impl FgaBuilder {
    /// The server wants `Authorization: Bearer <key>` on every route except `/healthz`
    /// (`--authn-method preshared`). May be given several times: any of the keys is accepted.
    pub fn preshared_key(mut self, key: &str) -> Self {
        self.flavour.preshared_keys.push(key.to_owned());
        self
    }

    /// A server of this test's own with `--authn-method oidc`, trusting `issuer` (which must be
    /// serving: OpenFGA reads its discovery document and keys at start) for tokens naming
    /// `audience`; the harness's own calls carry `token` (`OidcIssuer::openfga` gives all three).
    pub fn oidc(mut self, issuer: &str, audience: &str, token: String) -> Self {
        self.flavour.oidc = Some(super::openfga::Oidc {
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
            token,
        });
        self
    }

    /// A bearer token, as a gateway in front of OpenFGA checks it, for a token the test changes
    /// while the relay runs: a token is accepted iff `f(token)`; a rejected one gets OpenFGA's
    /// answer, 401 `invalid_claims`. Played by the proxy (for OIDC itself, see [`Self::oidc`]).
    pub fn accept_bearer(mut self, f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.bearer = Some(Arc::new(f));
        self
    }

    /// A server started with `--max-tuples-per-write n`.
    pub fn max_tuples_per_write(mut self, n: usize) -> Self {
        self.flavour.max_tuples_per_write = n;
        self
    }

    /// OpenFGA before 1.10 (v1.9.5): no `on_duplicate` / `on_missing`, so a duplicate write or
    /// a missing delete is an error.
    pub fn legacy(mut self) -> Self {
        self.flavour.version = LEGACY;
        self
    }

    /// OpenFGA's PostgreSQL datastore at `url` (a libpq connection string), migrated first, on
    /// a server of this test's own, instead of a shared server's memory datastore.
    pub fn postgres(mut self, url: &str) -> Self {
        self.flavour.postgres = Some(url.to_owned());
        self
    }

    pub fn model(mut self, model: Model) -> Self {
        self.model = Some(model);
        self
    }

    /// The store exists but has no model: writes get 400 `latest_authorization_model_not_found`.
    #[allow(dead_code)] // used by some test binaries only
    pub fn no_model(mut self) -> Self {
        self.model = None;
        self
    }

    pub fn start(self) -> Fga {
        let server = super::openfga::server(&self.flavour);
        let api = Api::new(&server.url, server.key.clone());
        let n = STORES.fetch_add(1, Ordering::Relaxed);
        let store_name = format!("relay-test-{}-{n}", std::process::id());
        let store_id = api.create_store(&store_name);
        let model = self.model.map(|m| m.to_json());
        let model_id = model.as_ref().map(|m| api.write_model(&store_id, m));
        let proxy = Arc::new(Proxy::new(server.url.clone(), self.bearer));
        let listener = bind_listener();
        let addr = listener.local_addr().expect("listener address");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let app = super::proxy::router(proxy.clone());
        let ends = proxy.clone();
        let on_end: super::server::OnEnd = Arc::new(move |owner| {
            ends.state().ends.push((std::time::Instant::now(), owner));
        });
        let (control, control_rx) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("fga-proxy".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("fga-proxy-worker")
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                runtime.block_on(accept_loop(listener, control_rx, app, on_end));
                // Dropping the runtime cancels every task: hanging requests, delayed writes
                // and idle keep-alive connections all end here.
                drop(runtime);
            })
            .expect("spawn the proxy thread");
        Fga {
            server,
            api,
            store_id,
            store_name,
            model_id,
            model,
            version: self.flavour.version,
            proxy,
            addr,
            control,
            thread: Some(thread),
            refusing: Mutex::new(false),
        }
    }
}

impl Fga {
    /// The newest OpenFGA, no authentication, 100 tuples per write, [`Model::default`].
    pub fn start() -> Fga {
        Self::builder().start()
    }

    pub fn builder() -> FgaBuilder {
        FgaBuilder {
            flavour: Flavour {
                version: MODERN,
                preshared_keys: Vec::new(),
                max_tuples_per_write: DEFAULT_MAX_TUPLES_PER_WRITE,
                postgres: None,
                oidc: None,
            },
            bearer: None,
            model: Some(Model::default()),
        }
    }

    /// The proxy, as the relay is pointed at it: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server itself, past the proxy: for a client that wants OpenFGA without faults or
    /// records in between (the benchmark's measurements against the real thing).
    pub fn direct_url(&self) -> &str {
        &self.server.url
    }

    /// The server's process id (the benchmark confines it to a CPU quota).
    #[allow(dead_code)] // the bench uses it; the tests do not
    pub fn server_pid(&self) -> u32 {
        self.server.pid()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This test's store.
    pub fn store_id(&self) -> &str {
        &self.store_id
    }

    /// This test's store's name (unique on the server).
    pub fn store_name(&self) -> &str {
        &self.store_name
    }

    /// The store's model, when it has one.
    pub fn model_id(&self) -> Option<&str> {
        self.model_id.as_deref()
    }

    /// Another store on the same server (reached through the same proxy), with this test's
    /// model; its id. For rows that name their store.
    #[allow(dead_code)] // used by some test binaries only
    pub fn add_store(&self) -> String {
        let n = STORES.fetch_add(1, Ordering::Relaxed);
        let id = self
            .api
            .create_store(&format!("relay-test-{}-{n}", std::process::id()));
        if let Some(model) = &self.model {
            self.api.write_model(&id, model);
        }
        id
    }

    /// Writes this test's model once more into `store`: a second model id.
    #[allow(dead_code)] // used by some test binaries only
    pub fn add_model(&self, store: &str) -> String {
        let model = self.model.as_ref().expect("a test with a model");
        self.api.write_model(store, model)
    }

    /// The tuples of `store` (any store of the server), sorted.
    #[allow(dead_code)] // used by some test binaries only
    pub fn tuples_in(&self, store: &str) -> Vec<StoredTuple> {
        let mut tuples: Vec<StoredTuple> = self
            .api
            .read(store, None)
            .iter()
            .map(StoredTuple::from_key)
            .collect();
        tuples.sort();
        tuples
    }

    /// Whether `store` holds the tuple.
    #[allow(dead_code)] // used by some test binaries only
    pub fn has_in(&self, store: &str, user: &str, relation: &str, object: &str) -> bool {
        let key = json!({ "user": user, "relation": relation, "object": object });
        !self.api.read(store, Some(key)).is_empty()
    }

    /// Every applied operation of `store`, in order.
    #[allow(dead_code)] // used by some test binaries only
    pub fn changelog_in(&self, store: &str) -> Vec<Change> {
        self.api
            .changes(store)
            .iter()
            .map(Change::from_json)
            .collect()
    }

    /// A Write straight to the server, into `store`.
    #[allow(dead_code)] // used by some test binaries only
    pub fn write_direct_in(
        &self,
        store: &str,
        writes: Vec<Value>,
        deletes: Vec<Value>,
    ) -> Result<(), Refused> {
        self.api.write(store, writes, deletes)
    }

    /// Deletes `store` (softly, as OpenFGA does).
    #[allow(dead_code)] // used by some test binaries only
    pub fn delete_store_id(&self, store: &str) {
        self.api.delete_store(store);
    }

    /// The OpenFGA version serving this store (`v1.18.1`, ...).
    pub fn version(&self) -> &'static str {
        self.version
    }

    /// The current tuples, sorted by (object, relation, user).
    pub fn tuples(&self) -> Vec<StoredTuple> {
        self.tuples_in(&self.store_id)
    }

    fn read_one(&self, user: &str, relation: &str, object: &str) -> Option<Value> {
        let key = json!({ "user": user, "relation": relation, "object": object });
        self.api.read(&self.store_id, Some(key)).into_iter().next()
    }

    pub fn has(&self, user: &str, relation: &str, object: &str) -> bool {
        self.read_one(user, relation, object).is_some()
    }

    /// The stored condition `{"name","context"}` of a tuple, if the tuple exists and has one.
    pub fn condition_of(&self, user: &str, relation: &str, object: &str) -> Option<Value> {
        super::records::condition_of_key(&self.read_one(user, relation, object)?)
    }

    /// Writes a tuple behind the relay's back (straight to the server; it is in the changelog).
    /// A tuple already there is replaced.
    pub fn insert_tuple(&self, t: StoredTuple) {
        self.remove_tuple(&t.user, &t.relation, &t.object);
        self.write_direct(vec![t.to_key()], vec![])
            .unwrap_or_else(|r| panic!("OpenFGA refused {t:?}: {r:?}"));
    }

    /// Deletes a tuple behind the relay's back; true if it existed.
    pub fn remove_tuple(&self, user: &str, relation: &str, object: &str) -> bool {
        if !self.has(user, relation, object) {
            return false;
        }
        let key = json!({ "user": user, "relation": relation, "object": object });
        self.write_direct(vec![], vec![key])
            .unwrap_or_else(|r| panic!("OpenFGA refused a delete: {r:?}"));
        true
    }

    /// A Write straight to the server, as another client sends it.
    pub fn write_direct(&self, writes: Vec<Value>, deletes: Vec<Value>) -> Result<(), Refused> {
        self.api.write(&self.store_id, writes, deletes)
    }

    /// Deletes the store (OpenFGA deletes softly: its Writes may still be answered).
    #[allow(dead_code)] // used by some test binaries only
    pub fn delete_store(&self) {
        self.api.delete_store(&self.store_id);
    }

    /// Every `POST /stores/{id}/write` the proxy received since the start, in arrival order,
    /// with its outcome.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.proxy.state().writes.clone()
    }

    pub fn write_count(&self) -> usize {
        self.proxy.state().writes.len()
    }

    /// Every applied operation, in order, from the server's changelog (ReadChanges).
    pub fn changelog(&self) -> Vec<Change> {
        self.api
            .changes(&self.store_id)
            .iter()
            .map(Change::from_json)
            .collect()
    }

    /// The status answered to each ListStores request (the relay resolving `--store-name`), in
    /// arrival order; 0 while unanswered.
    #[allow(dead_code)] // used by some test binaries only
    pub fn list_stores(&self) -> Vec<u16> {
        self.requests_of(Route::ListStores)
    }

    /// The status answered to each request of `route` (not Writes: see [`Fga::writes`]), in
    /// arrival order; 0 while unanswered.
    #[allow(dead_code)] // used by some test binaries only
    pub fn requests_of(&self, route: Route) -> Vec<u16> {
        self.proxy
            .state()
            .others
            .iter()
            .filter(|(r, _)| *r == route)
            .map(|(_, status)| *status)
            .collect()
    }

    pub fn push_fault(&self, rule: FaultRule) {
        self.proxy.state().faults.push_back(rule);
    }

    pub fn clear_faults(&self) {
        self.proxy.state().faults.clear();
    }

    /// Faults at random for every write no rule matched; `None` to stop them.
    #[allow(dead_code)] // used by some test binaries only
    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.proxy.state().random = faults;
    }

    /// When each Write request's head arrived, with its raw `Authorization` header: Writes a
    /// relay began and did not finish (its body cut short) count too.
    #[allow(dead_code)] // used by some test binaries only
    pub fn write_heads(&self) -> Vec<(std::time::Instant, Option<String>)> {
        self.proxy.state().heads.clone()
    }

    /// When each connection its client ended was ended, with the `Authorization` header of its
    /// first request (`None`: it sent none): a Write broken off before its head left shows here.
    #[allow(dead_code)] // used by some test binaries only
    pub fn connection_ends(&self) -> Vec<(std::time::Instant, Option<String>)> {
        self.proxy.state().ends.clone()
    }

    /// `true`: every request but `/healthz` hangs, never answered (OpenFGA hung as a whole).
    #[allow(dead_code)] // used by some test binaries only
    pub fn set_hanging(&self, hanging: bool) {
        self.proxy.state().hanging = hanging;
    }

    /// A delay the proxy adds to every write no fault matched. `None`: none.
    #[allow(dead_code)] // used by some test binaries only
    pub fn set_latency(&self, latency: Option<Latency>) {
        self.proxy.state().latency = latency;
    }

    /// A proxy with a body limit: a write body above `bytes` is answered 413 with the proxy's
    /// HTML page, before OpenFGA sees it. `None`: no limit.
    #[allow(dead_code)] // used by some test binaries only
    pub fn set_body_limit(&self, bytes: Option<usize>) {
        self.proxy.state().body_limit = bytes;
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
                .expect("proxy thread is running");
        } else {
            let listener = rebind(self.addr);
            self.control
                .send(Control::Listen(listener, ack))
                .expect("proxy thread is running");
        }
        done.recv().expect("proxy thread acknowledges");
        *current = refusing;
    }
}

impl Drop for Fga {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
