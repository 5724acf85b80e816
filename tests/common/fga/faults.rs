//! Faults a test injects into Write requests (not something OpenFGA does): which rule a request
//! takes, and what each fault answers.

use super::*;
use std::time::Duration;

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
    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
    CloseConnection,
    /// Answer with an arbitrary body, as a proxy in front of OpenFGA might; nothing applied.
    Garbage {
        status: u16,
        content_type: String,
        body: String,
    },
    /// A redirect from something in front of OpenFGA (`Location: location`); nothing applied.
    #[allow(dead_code)] // the relay's tests use it; the stand-in's own tests do not
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
    #[allow(dead_code)] // the stand-in's own tests use it; the relay's tests do not
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
}

impl Shared {
    pub(super) fn take_fault(&self, req: &WriteReq<'_>) -> Option<Fault> {
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
}
