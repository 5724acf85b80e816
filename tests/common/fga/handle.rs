//! The running stand-in as a test holds it: starting it, reading what it received, steering its
//! faults, and stopping it.

use super::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::Value;

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

    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
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

    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
    pub fn model(mut self, model: Model) -> Self {
        self.model = Some(model);
        self
    }

    /// The store exists but has no model: writes get 400 `latest_authorization_model_not_found`
    /// (or `authorization_model_not_found` when they name [`MODEL_ID`]).
    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
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
        self.shared.state().put(key, condition, SystemTime::now());
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
    #[allow(dead_code)] // the relay's tests use it; the stand-in's own tests do not
    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.shared.state().random = faults;
    }

    /// How long every write no fault matched takes, as a real OpenFGA writing to its own
    /// database does. `None`: answered at once.
    #[allow(dead_code)] // the bench uses it; the tests do not
    pub fn set_latency(&self, latency: Option<Latency>) {
        self.shared.state().latency = latency;
    }

    /// A proxy in front of OpenFGA with a body limit: a write body above `bytes` is answered
    /// 413 with the proxy's HTML page, before OpenFGA sees it. `None`: no limit.
    #[allow(dead_code)] // the relay's tests use it; the stand-in's own tests do not
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
    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
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
