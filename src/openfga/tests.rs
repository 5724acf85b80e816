//! The Write body, the classification of answers and `Retry-After`.

use super::classify::redirected;
use super::*;
use crate::payload::{Condition, Op, TupleKey};
use serde_json::{Map, Value, json};
use std::time::Duration;

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
    // Ids may hold an apostrophe: `user:ann'e` is not `user:ann`, whose notation it begins
    // with; the rejected tuple is in no operation here, so the Write is split to find it.
    match c(
        400,
        body(
            "validation_error",
            "Invalid tuple 'document:1#viewer@user:ann'e'. Reason: type 'user' not found",
        ),
    ) {
        WriteError::Rejected { op: None, .. } => {}
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
    // A stored model this OpenFGA cannot use fails every Write alike: never the rows' fault.
    assert_eq!(
        c(
            400,
            body(
                "validation_error",
                "invalid authorization model encountered: the relation type 'usez' on 'viewer' \
                 in object type 'document' is not valid"
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
    assert_eq!(parse_retry_after("1800"), Some(Duration::from_secs(1800)));
    // "Now" and "too long" leave the relay's own backoff in place.
    assert_eq!(parse_retry_after(" 0 "), None);
    assert_eq!(parse_retry_after("1801"), None);
    assert_eq!(parse_retry_after("100000"), None);
    assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), None);
    assert_eq!(parse_retry_after("soon"), None);
    // A date a minute ahead: about a minute (the clock moves on between the two calls, and
    // the header has whole seconds).
    let ahead = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60));
    let d = parse_retry_after(&ahead).unwrap_or_else(|| panic!("{ahead} not read"));
    assert!(
        d > Duration::from_secs(55) && d <= Duration::from_secs(60),
        "{ahead}: {d:?}"
    );
}
