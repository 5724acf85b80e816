//! Faults a test injects through the proxy into Write requests, and into the relay's other
//! requests (ListStores, GetStore, Read): what a real OpenFGA cannot be made to do on demand.
//! Which rule a request takes, and what each fault answers.

use std::time::Duration;

/// A fault to inject into requests of its route (Writes, unless told). Rules are consumed in FIFO
/// order: each request takes the first rule of its route that matches it and has `times > 0`.
#[derive(Clone, Debug)]
pub struct FaultRule {
    pub fault: Fault,
    pub times: usize,
    /// The requests the rule is for.
    pub route: Route,
    /// `(user, relation, object)`: the rule matches only requests that write or delete this tuple.
    pub only_if_tuple: Option<(String, String, String)>,
    /// A store id: the rule matches only Writes to this store (`/stores/{id}/write`).
    pub only_if_store: Option<String>,
}

impl FaultRule {
    pub fn once(fault: Fault) -> Self {
        Self::times(fault, 1)
    }

    pub fn times(fault: Fault, n: usize) -> Self {
        FaultRule {
            fault,
            times: n,
            route: Route::Write,
            only_if_tuple: None,
            only_if_store: None,
        }
    }

    /// For ListStores requests instead of Writes: `--store-name` cannot be resolved while the
    /// rule lasts.
    pub fn on_list_stores(mut self) -> Self {
        self.route = Route::ListStores;
        self
    }

    /// For GetStore requests instead of Writes: the relay asks whether a store still exists
    /// before it writes to it (the first Write, then every 10 s).
    pub fn on_get_store(mut self) -> Self {
        self.route = Route::GetStore;
        self
    }

    /// For Read requests instead of Writes: the relay reads a tuple back after an older
    /// OpenFGA's "already exists".
    pub fn on_read(mut self) -> Self {
        self.route = Route::Read;
        self
    }

    /// Only Writes to this store.
    pub fn when_store(mut self, store: &str) -> Self {
        self.only_if_store = Some(store.to_owned());
        self
    }

    pub fn when_tuple(mut self, user: &str, relation: &str, object: &str) -> Self {
        self.only_if_tuple = Some((user.to_owned(), relation.to_owned(), object.to_owned()));
        self
    }
}

/// The requests a [`FaultRule`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /stores/{id}/write`.
    Write,
    /// `GET /stores`: ListStores, through which the relay resolves `--store-name`.
    ListStores,
    /// `GET /stores/{id}`: GetStore.
    GetStore,
    /// `POST /stores/{id}/read`: Read.
    Read,
}

impl Route {
    /// The route of a request a fault can be injected into; `None` for any other.
    pub(super) fn of(method: &str, path: &str) -> Option<Route> {
        let rest = path.strip_prefix("/stores")?;
        if !rest.is_empty() && !rest.starts_with('/') {
            return None;
        }
        let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
        match (method, parts.as_slice()) {
            ("GET", [""]) => Some(Route::ListStores),
            ("GET", [_]) => Some(Route::GetStore),
            ("POST", [_, "write"]) => Some(Route::Write),
            ("POST", [_, "read"]) => Some(Route::Read),
            _ => None,
        }
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
    /// or when the `Fga` is dropped.
    Hang,
    /// Close the TCP connection without any HTTP response; nothing applied.
    /// No test drops a single connection today (`set_refusing` drops them all).
    #[allow(dead_code)]
    CloseConnection,
    /// Answer with an arbitrary body, as a proxy in front of OpenFGA might; nothing applied.
    Garbage {
        status: u16,
        content_type: String,
        body: String,
    },
    /// Pass the Write on (OpenFGA applies it), then answer the inner fault instead of
    /// OpenFGA's answer: a server whose deadline or connection failed after it committed.
    Applied(Box<Fault>),
    /// A redirect from something in front of OpenFGA (`Location: location`); nothing applied.
    Redirect { status: u16, location: String },
}

/// How long a write takes (see `Fga::set_latency`).
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // the bench uses it; the tests do not
pub enum Latency {
    Fixed(Duration),
    /// Log-normal around this median (σ = 1): p90 3.6×, p99 10× the median, a long tail as
    /// a database behind a server has.
    LongTail(Duration),
}

impl Latency {
    pub(super) fn draw(self) -> Duration {
        match self {
            Latency::Fixed(d) => d,
            Latency::LongTail(median) => {
                // Box–Muller: a standard normal from two uniforms.
                let (u1, u2) = (fastrand::f64().max(1e-12), fastrand::f64());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                median.mul_f64(z.exp())
            }
        }
    }
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

    /// OpenFGA's own request deadline (`--request-timeout`) ran out; the Write may have been
    /// committed (wrap in [`Fault::Applied`] for that case).
    pub fn deadline_exceeded() -> Fault {
        Fault::status(504, "deadline_exceeded", "Request Deadline Exceeded")
    }

    /// The datastore throttled the request.
    pub fn resource_exhausted() -> Fault {
        Fault::status(
            500,
            "resource_exhausted",
            "resource exhausted: the datastore is throttling requests",
        )
    }

    /// The concurrent-insert race: 409 with the literal code "Aborted".
    pub fn aborted() -> Fault {
        Fault::status(
            409,
            "Aborted",
            "transactional write failed due to conflict: one or more tuples to write were inserted by another transaction",
        )
    }
}

impl RandomFaults {
    /// This Write's fault, if the draw gives one.
    pub(super) fn draw(&self) -> Option<Fault> {
        let draw = fastrand::f64();
        if draw < self.internal {
            Some(Fault::internal())
        } else if draw < self.internal + self.rate_limited {
            Some(Fault::Status {
                status: 429,
                code: "rate_limit_exceeded".to_owned(),
                message: "Rate Limit exceeded".to_owned(),
                retry_after: self.retry_after.clone(),
            })
        } else {
            None
        }
    }
}
