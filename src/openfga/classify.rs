//! What each answer of OpenFGA's means for the rows of a Write: every failure is classified as
//! [`WriteError`], using the exact answers OpenFGA gives (status, `code` and `message`, as its
//! source produces them): transient (retry the request), rejected for one tuple (dead-letter
//! that row), already applied (an older server's answer to a duplicate write or a missing
//! delete: success for that tuple), or configuration (nothing a row can fix).

use crate::payload::Op;
use serde::Deserialize;
use std::time::Duration;

/// What a failed Write means for the rows in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// Retry: the next attempt may succeed (network, timeout, 5xx, 429, a write race).
    Transient,
    /// The row holding the named operation can never be delivered as it is.
    Permanent,
    /// The relay's settings or OpenFGA's state: loud errors, keep retrying, dead-letter nothing
    /// (but a row that alone keeps getting such an answer while other Writes succeed).
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
    /// The Write's body refused to leave: the leader's lease had run out (the relay was stopped
    /// or cut off). Nothing of it reached OpenFGA; the rows are for the next leader.
    #[error("the leadership lease ran out before the Write left; it was not sent")]
    NotSent,
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
    /// The store or model the Write's rows name does not exist (a row's `store_id` or
    /// `authorization_model_id`): none of them can ever be delivered as it is.
    #[error("{message}")]
    UnknownTarget { message: String },
    /// The request body is larger than OpenFGA, or a proxy in front of it, takes (413, or gRPC's
    /// receive limit): a Write of several rows is halved, as are the parts of a row sent in
    /// parts; a row sent whole, or one tuple, can never be delivered.
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
            WriteError::NotSent | WriteError::Transient { .. } | WriteError::Throttled { .. } => {
                FailureClass::Transient
            }
            WriteError::Rejected { .. }
            | WriteError::AlreadyApplied { .. }
            | WriteError::UnknownTarget { .. }
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

/// OpenFGA's error body.
#[derive(Deserialize, Default)]
pub(super) struct ErrorBody {
    #[serde(default)]
    pub(super) code: String,
    #[serde(default)]
    pub(super) message: String,
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
    match parsed {
        Some(answer) => classify_answer(status, retry_after, answer, ops),
        None => WriteError::Unexpected {
            status,
            excerpt: excerpt(body),
        },
    }
}

/// Classifies an error answer in OpenFGA's shape (`code`, `message`) to a Write carrying `ops`,
/// other than 408, 413, 429 and 5xx: by its code, and for a 400 by what its message names.
fn classify_answer(
    status: u16,
    retry_after: Option<Duration>,
    ErrorBody { code, message }: ErrorBody,
    ops: &[&Op],
) -> WriteError {
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
                // The store's model (the latest, or the one FGA_MODEL_ID pins) is one this
                // OpenFGA cannot use: every Write would fail alike, whatever its rows.
                || message.contains("invalid authorization model encountered")
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

/// The operation named as `Invalid tuple 'object#relation@user'` (or `'… (condition c)'`, with
/// its own condition), followed by `. Reason…` or nothing. Ids may hold an apostrophe but never
/// a space: `user:o` must not take the blame for `'document:1#viewer@user:o'x'`.
fn find_by_notation(message: &str, ops: &[&Op]) -> Option<usize> {
    ops.iter().position(|op| {
        let k = op.key();
        let needle = format!("Invalid tuple '{}#{}@{}", k.object, k.relation, k.user);
        let closing = match op {
            Op::Write {
                condition: Some(c), ..
            } => format!(" (condition {})'", c.name),
            _ => "'".to_owned(),
        };
        message.match_indices(&needle).any(|(i, _)| {
            message[i + needle.len()..]
                .strip_prefix(&closing)
                .is_some_and(|after| after.is_empty() || after.starts_with(". "))
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

pub(super) fn excerpt(body: &[u8]) -> String {
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

/// A redirect, which is never followed: a configuration error naming where it pointed.
pub(super) fn redirected(status: u16, headers: &reqwest::header::HeaderMap) -> WriteError {
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

/// Whether `e` (or a cause) is a TLS handshake that got an answer that is not TLS: an https://
/// URL for a server, or a port, that speaks plain HTTP. rustls says only "received corrupt
/// message of type InvalidContentType".
pub(super) fn not_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        ) {
            return true;
        }
        // An I/O error hides the error it carries from `source()` (and may carry another I/O
        // error): look inside.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}

/// What follows such an error: what it means, and what to do.
pub(super) const NOT_TLS: &str = "the server did not answer in TLS; if it speaks plain HTTP use \
                                  an http:// URL, else the port of its TLS listener";

/// An error and its causes, as [`error_chain`], with [`NOT_TLS`] after it where that applies.
pub(super) fn error_chain_tls(e: &(dyn std::error::Error + 'static)) -> String {
    if not_tls(e) {
        format!("{}: {NOT_TLS}", error_chain(e))
    } else {
        error_chain(e)
    }
}

/// An error and its causes, `: `-separated.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
