//! Tests of the OpenFGA stand-in (`tests/common/fga/`) itself, through a real HTTP client.
//! Expected statuses, codes and messages are OpenFGA's own, as its source gives them.

// Only the stand-in: the rest of `tests/common` serves the relay's tests.
mod common {
    pub mod fga;
}

use std::time::{Duration, Instant};

use common::fga::{
    Change, FakeFga, Fault, FaultRule, MODEL_ID, Model, Op, STORE_ID, STORE_NAME, StoredTuple,
};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

// ------------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------------

struct Resp {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts OpenFGA's error envelope exactly: status, body bytes (with the trailing newline)
    /// and content type.
    #[track_caller]
    fn assert_error(&self, status: u16, code: &str, message: &str) {
        let expected = format!("{}\n", json!({"code": code, "message": message}));
        assert_eq!(
            (self.status, self.body.as_str()),
            (status, expected.as_str()),
            "unexpected answer"
        );
        assert_eq!(self.header("content-type"), Some("application/json"));
    }

    #[track_caller]
    fn assert_ok(&self) {
        assert_eq!(
            (self.status, self.body.as_str()),
            (200, "{}"),
            "write not accepted"
        );
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn send(request: reqwest::RequestBuilder) -> Resp {
    let response = request.send().await.expect("an HTTP answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.expect("a body");
    Resp {
        status,
        headers,
        body,
    }
}

async fn get(fga: &FakeFga, path: &str) -> Resp {
    send(client().get(format!("{}{path}", fga.url()))).await
}

async fn post_raw(fga: &FakeFga, path: &str, body: &str) -> Resp {
    send(
        client()
            .post(format!("{}{path}", fga.url()))
            .header("content-type", "application/json")
            .body(body.to_owned()),
    )
    .await
}

async fn write(fga: &FakeFga, body: Value) -> Resp {
    post_raw(fga, &format!("/stores/{STORE_ID}/write"), &body.to_string()).await
}

async fn write_with_token(fga: &FakeFga, body: Value, authorization: &str) -> Resp {
    send(
        client()
            .post(format!("{}/stores/{STORE_ID}/write", fga.url()))
            .header("authorization", authorization)
            .body(body.to_string()),
    )
    .await
}

async fn read(fga: &FakeFga, body: Value) -> Resp {
    post_raw(fga, &format!("/stores/{STORE_ID}/read"), &body.to_string()).await
}

fn tk(user: &str, relation: &str, object: &str) -> Value {
    json!({"user": user, "relation": relation, "object": object})
}

fn writes(keys: &[Value]) -> Value {
    json!({"writes": {"tuple_keys": keys}})
}

fn deletes(keys: &[Value]) -> Value {
    json!({"deletes": {"tuple_keys": keys}})
}

fn non_expired(user: &str, expires_at: &str) -> Value {
    json!({"user": user, "relation": "viewer", "object": "document:1",
           "condition": {"name": "non_expired", "context": {"expires_at": expires_at}}})
}

// ------------------------------------------------------------------------------------------------
// Other routes
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn healthz_is_serving_and_needs_no_auth() {
    let fga = FakeFga::builder().preshared_key("secret").start();
    let r = get(&fga, "/healthz").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, r#"{"status":"SERVING"}"#)
    );
    let r = get(&fga, "/healthz?service=openfga.v1.OpenFGAService").await;
    assert_eq!(r.status, 200);
    get(&fga, "/healthz?service=other").await.assert_error(
        404,
        "undefined_endpoint",
        "service 'other' is not registered with the Health server",
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_get_the_gateways_404s() {
    let fga = FakeFga::builder().preshared_key("secret").start();
    get(&fga, "/nope")
        .await
        .assert_error(404, "undefined_endpoint", "Not Found");
    post_raw(&fga, &format!("/stores/{STORE_ID}/write/more"), "{}")
        .await
        .assert_error(404, "undefined_endpoint", "Not Found");
    get(&fga, &format!("/stores/{STORE_ID}/write"))
        .await
        .assert_error(404, "unimplemented", "Method Not Allowed");
    assert_eq!(fga.write_count(), 0);
}

#[tokio::test]
async fn get_store() {
    let fga = FakeFga::start();
    let r = get(&fga, &format!("/stores/{STORE_ID}")).await;
    assert_eq!(r.status, 200);
    let store = r.json();
    assert_eq!(store["id"], STORE_ID);
    assert_eq!(store["name"], STORE_NAME);
    assert_eq!(store["deleted_at"], Value::Null);
    let created = store["created_at"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.len() >= 20, "{created}");
    assert_eq!(store["updated_at"], store["created_at"]);
    assert!(r.header("x-request-id").is_some());

    get(&fga, "/stores/01ARZ3NDEKTSV4RRFFQ69G5FAV")
        .await
        .assert_error(404, "store_id_not_found", "Store ID not found");
    get(&fga, "/stores/not-a-store").await.assert_error(
        400,
        "validation_error",
        r#"invalid GetStoreRequest.StoreId: value does not match regex pattern "^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$""#,
    );
}

#[tokio::test]
async fn list_stores() {
    let fga = FakeFga::start();
    let r = get(&fga, "/stores").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["stores"].as_array().unwrap().len(), 1);
    assert_eq!(v["stores"][0]["id"], STORE_ID);
    assert_eq!(v["continuation_token"], "");

    let v = get(&fga, "/stores?name=relay-test&page_size=1")
        .await
        .json();
    assert_eq!(v["stores"][0]["name"], STORE_NAME);
    let v = get(&fga, "/stores?name=relay").await.json();
    assert_eq!(v["stores"], json!([]), "the name filter is exact");

    get(&fga, "/stores?page_size=0").await.assert_error(
        400,
        "page_size_invalid",
        "invalid ListStoresRequest.PageSize: value must be inside range [1, 100]",
    );
    get(&fga, "/stores?page_size=abc").await.assert_error(
        400,
        "validation_error",
        r#"parsing field "page_size": strconv.ParseInt: parsing "abc": invalid syntax"#,
    );
    get(&fga, "/stores?continuation_token=abc")
        .await
        .assert_error(
            400,
            "invalid_continuation_token",
            "Invalid continuation token",
        );
    get(&fga, "/stores?continuation_token=a.b").await.assert_error(
        400,
        "validation_error",
        r#"invalid ListStoresRequest.ContinuationToken: value does not match regex pattern "^$|^[A-Za-z0-9-_]+={0,2}$""#,
    );
}

// ------------------------------------------------------------------------------------------------
// Write: success
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn write_applies_and_answers_like_openfga() {
    let fga = FakeFga::start();
    let r = write(
        &fga,
        json!({"writes": {"tuple_keys": [
            tk("user:anne", "member", "organization:acme"),
            non_expired("user:bob", "2030-01-01T00:00:00Z"),
        ]}}),
    )
    .await;
    r.assert_ok();
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("openfga-authorization-model-id"), Some(MODEL_ID));

    assert!(fga.has("user:anne", "member", "organization:acme"));
    assert_eq!(
        fga.condition_of("user:bob", "viewer", "document:1"),
        Some(json!({"name": "non_expired", "context": {"expires_at": "2030-01-01T00:00:00Z"}}))
    );
    assert_eq!(
        fga.tuples(),
        vec![
            StoredTuple::new("user:bob", "viewer", "document:1")
                .with_condition("non_expired", json!({"expires_at": "2030-01-01T00:00:00Z"})),
            StoredTuple::new("user:anne", "member", "organization:acme"),
        ]
    );

    let records = fga.writes();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, 200);
    assert_eq!(records[0].authorization, None);
    assert_eq!(
        records[0].body["writes"]["tuple_keys"][0]["user"],
        "user:anne"
    );
    assert_eq!(fga.write_count(), 1);
}

#[tokio::test]
async fn deletes_apply_before_writes_and_the_changelog_keeps_order() {
    let fga = FakeFga::start();
    fga.insert_tuple(StoredTuple::new("user:anne", "viewer", "document:1"));
    write(
        &fga,
        json!({
            "writes": {"tuple_keys": [tk("user:bob", "viewer", "document:1")]},
            "deletes": {"tuple_keys": [tk("user:anne", "viewer", "document:1")]},
        }),
    )
    .await
    .assert_ok();
    write(&fga, writes(&[tk("user:carl", "editor", "document:1")]))
        .await
        .assert_ok();
    let ops: Vec<(Op, String)> = fga
        .changelog()
        .into_iter()
        .map(|c: Change| (c.op, c.user))
        .collect();
    assert_eq!(
        ops,
        vec![
            (Op::Delete, "user:anne".to_owned()),
            (Op::Write, "user:bob".to_owned()),
            (Op::Write, "user:carl".to_owned()),
        ],
        "insert_tuple is not a change; the delete precedes the write of its request"
    );
    assert!(!fga.has("user:anne", "viewer", "document:1"));
}

#[tokio::test]
async fn unknown_fields_are_ignored_and_an_empty_body_is_an_empty_request() {
    let fga = FakeFga::start();
    write(
        &fga,
        json!({"writes": {"tuple_keys": [tk("user:anne", "owner", "document:1")], "on_duplicates": "ignore"},
               "store_id": "ignored: the path wins", "extra": [1, 2]}),
    )
    .await
    .assert_ok();
    // Fields that are unknown where they stand are skipped whatever their type: an
    // `on_missing` among the writes, a `condition` on a delete. Escaped names are names.
    write(
        &fga,
        json!({"writes": {"tuple_keys": [tk("user:b", "owner", "document:1")], "on_missing": 5}}),
    )
    .await
    .assert_ok();
    write(
        &fga,
        json!({"deletes": {"tuple_keys": [{"user": "user:b", "relation": "owner", "object": "document:1", "condition": "x"}],
                           "on_duplicate": []}}),
    )
    .await
    .assert_ok();
    post_raw(
        &fga,
        &format!("/stores/{STORE_ID}/write"),
        r#"{"wri\u0074es":{"tuple_keys":[{"user":"user:c","relation":"owner","object":"document:1"}]}} trailing bytes are never read"#,
    )
    .await
    .assert_ok();
    assert!(fga.has("user:c", "owner", "document:1"));
    let r = post_raw(&fga, &format!("/stores/{STORE_ID}/write"), "").await;
    r.assert_error(
        400,
        "invalid_write_input",
        "Invalid input. Make sure you provide at least one write, or at least one delete",
    );
    assert_eq!(
        r.header("openfga-authorization-model-id"),
        Some(MODEL_ID),
        "errors after model resolution carry the header"
    );
    assert_eq!(fga.writes()[4].body, Value::Null);
}

// ------------------------------------------------------------------------------------------------
// Write: decoding and PGV
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn malformed_json() {
    let fga = FakeFga::start();
    let path = format!("/stores/{STORE_ID}/write");
    post_raw(&fga, &path, r#"{"writes":{"tuple_keys":["#)
        .await
        .assert_error(400, "validation_error", "malformed JSON");
    post_raw(&fga, &path, r#"{"writes" x}"#).await.assert_error(
        400,
        "validation_error",
        "invalid character 'x' after object key",
    );
    post_raw(&fga, &path, "[]").await.assert_error(
        400,
        "validation_error",
        "syntax error (line 1:1): unexpected token [",
    );
    post_raw(&fga, &path, r#"{"writes":{"tuple_keys":[{"user":5}]}}"#)
        .await
        .assert_error(
            400,
            "validation_error",
            "(line 1:34): invalid value for string field user: 5",
        );
    post_raw(&fga, &path, r#"{"writes":"x"}"#)
        .await
        .assert_error(
            400,
            "validation_error",
            r#"syntax error (line 1:11): unexpected token "x""#,
        );
    // protojson's checks run in document order and stop at the first failure.
    post_raw(&fga, &path, r#"{"authorization_model_id":5,"writes":"x"}"#)
        .await
        .assert_error(
            400,
            "validation_error",
            "(line 1:27): invalid value for string field authorization_model_id: 5",
        );
    post_raw(&fga, &path, "{\n  \"writes\": 7\n}")
        .await
        .assert_error(
            400,
            "validation_error",
            "syntax error (line 2:13): unexpected token 7",
        );
    let dup = r#"{"writes":{"tuple_keys":[{"user":"user:a","user":"user:b"}]}}"#;
    post_raw(&fga, &path, dup).await.assert_error(
        400,
        "validation_error",
        &format!(
            "(line 1:{}): duplicate field \"user\"",
            dup.rfind(r#""user""#).unwrap() + 1
        ),
    );
    let dup_context = r#"{"writes":{"tuple_keys":[{"user":"user:a","relation":"viewer","object":"document:1","condition":{"name":"non_expired","context":{"a":{"b":1,"b":2}}}}]}}"#;
    post_raw(&fga, &path, dup_context).await.assert_error(
        400,
        "validation_error",
        &format!(
            "(line 1:{}): duplicate map key \"b\"",
            dup_context.rfind(r#""b""#).unwrap() + 1
        ),
    );
    post_raw(&fga, &path, r#"{"writes":{"tuple_keys":[null]}}"#)
        .await
        .assert_error(
            400,
            "validation_error",
            "syntax error (line 1:26): unexpected token null",
        );
    // The recorded body of a non-JSON request is its text.
    assert_eq!(fga.writes()[1].body, json!(r#"{"writes" x}"#));
    assert_eq!(fga.writes()[1].status, 400);
}

#[tokio::test]
async fn pgv_rules() {
    let fga = FakeFga::start();
    let r = post_raw(
        &fga,
        "/stores/not-a-ulid/write",
        &writes(&[tk("user:a", "viewer", "document:1")]).to_string(),
    )
    .await;
    r.assert_error(
        400,
        "validation_error",
        r#"invalid WriteRequest.StoreId: value does not match regex pattern "^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$""#,
    );
    write(&fga, json!({"writes": {"tuple_keys": []}}))
        .await
        .assert_error(
            400,
            "validation_error",
            "invalid WriteRequestWrites.TupleKeys: value must contain at least 1 item(s)",
        );
    let long_user = format!("user:{}", "x".repeat(508));
    write(&fga, writes(&[tk(&long_user, "viewer", "document:1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            "invalid TupleKey.User: value length must be at most 512 bytes",
        );
    write(&fga, deletes(&[tk("user:a", "has:colon", "document:1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            r#"invalid TupleKeyWithoutCondition.Relation: value does not match regex pattern "^[^:#@\\s]{1,50}$""#,
        );
    write(&fga, writes(&[tk("user:a", "viewer", "document: 1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            r#"invalid TupleKey.Object: value does not match regex pattern "^[^\\s]{2,256}$""#,
        );
    write(
        &fga,
        writes(&[json!({"user": "user:a", "relation": "viewer", "object": "document:1", "condition": {"name": "x"}})]),
    )
    .await
    .assert_error(
        400,
        "validation_error",
        r#"invalid RelationshipCondition.Name: value does not match regex pattern "^[^\\s]{2,256}$""#,
    );
    let mut body = writes(&[tk("user:a", "viewer", "document:1")]);
    body["authorization_model_id"] = json!("nope");
    write(&fga, body).await.assert_error(
        400,
        "validation_error",
        r#"invalid WriteRequest.AuthorizationModelId: value does not match regex pattern "^[ABCDEFGHJKMNPQRSTVWXYZ0-9]{26}$""#,
    );
    // ValidateAll joins every failure with "; ", and the sanitizer keeps what follows the last
    // "| caused by:": here the nested TupleKeys failure, not the StoreId one.
    post_raw(&fga, "/stores/bad/write", r#"{"writes":{"tuple_keys":[]}}"#)
        .await
        .assert_error(
            400,
            "validation_error",
            "invalid WriteRequestWrites.TupleKeys: value must contain at least 1 item(s)",
        );
    assert!(fga.tuples().is_empty());
}

#[tokio::test]
async fn oversized_request_is_refused_by_grpc() {
    let fga = FakeFga::start();
    let mut t = non_expired("user:anne", &"x".repeat(700_000));
    t["relation"] = json!("viewer");
    let r = write(&fga, writes(&[t])).await;
    assert_eq!(r.status, 500);
    let v = r.json();
    assert_eq!(v["code"], "resource_exhausted");
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.starts_with("grpc: received message larger than max (")
            && msg.ends_with(" vs. 616448)"),
        "{msg}"
    );
}

// ------------------------------------------------------------------------------------------------
// Write: model resolution and validation against the model
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn model_resolution() {
    let fga = FakeFga::start();
    let mut body = writes(&[tk("user:a", "viewer", "document:1")]);
    body["authorization_model_id"] = json!(MODEL_ID);
    write(&fga, body.clone()).await.assert_ok();

    body["authorization_model_id"] = json!("01ARZ3NDEKTSV4RRFFQ69G5FAV");
    write(&fga, body).await.assert_error(
        400,
        "authorization_model_not_found",
        "Authorization Model '01ARZ3NDEKTSV4RRFFQ69G5FAV' not found",
    );

    let other = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    let r = post_raw(
        &fga,
        &format!("/stores/{other}/write"),
        &deletes(&[tk("user:a", "viewer", "document:1")]).to_string(),
    )
    .await;
    r.assert_error(
        400,
        "latest_authorization_model_not_found",
        &format!("No authorization models found for store '{other}'"),
    );
    assert_eq!(r.header("openfga-authorization-model-id"), None);

    let fga = FakeFga::builder().no_model().start();
    // Resolved before "no writes and no deletes" is looked at.
    write(&fga, json!({})).await.assert_error(
        400,
        "latest_authorization_model_not_found",
        &format!("No authorization models found for store '{STORE_ID}'"),
    );
}

#[tokio::test]
async fn writes_are_validated_against_the_model() {
    let fga = FakeFga::start();
    let cases: Vec<(Value, &str)> = vec![
        (
            tk("user:maria", "viewer", "unknown:1"),
            "Invalid tuple 'unknown:1#viewer@user:maria'. Reason: type 'unknown' not found",
        ),
        (
            tk("user:maria", "unknown", "document:1"),
            "Invalid tuple 'document:1#unknown@user:maria'. Reason: relation 'document#unknown' not found",
        ),
        (
            tk("organization:fga", "viewer", "document:1"),
            "Invalid tuple 'document:1#viewer@organization:fga'. Reason: type 'organization' is not an allowed type restriction for 'document#viewer'",
        ),
        (
            tk("team:eng#member", "viewer", "document:1"),
            "Invalid tuple 'document:1#viewer@team:eng#member'. Reason: type 'team' not found",
        ),
        (
            tk("group:eng#owner", "viewer", "document:1"),
            "Invalid tuple 'document:1#viewer@group:eng#owner'. Reason: relation 'group#owner' not found",
        ),
        (
            tk("group:eng#member", "editor", "document:1"),
            "Invalid tuple 'document:1#editor@group:eng#member'. Reason: 'group#member' is not an allowed type restriction for 'document#editor'",
        ),
        (
            tk("user:*", "editor", "document:1"),
            "Invalid tuple 'document:1#editor@user:*'. Reason: the typed wildcard 'user:*' is not an allowed type restriction for 'document#editor'",
        ),
        (
            tk("user:maria", "", "document:1"),
            "Invalid tuple 'document:1#@user:maria'. Reason: the 'relation' field is malformed",
        ),
        (
            tk("user:maria", "viewer", "invalid"),
            "Invalid tuple 'invalid#viewer@user:maria'. Reason: invalid 'object' field format",
        ),
        (
            tk("user:maria", "viewer", "document:*"),
            "Invalid tuple 'document:*#viewer@user:maria'. Reason: the 'object' field cannot reference a typed wildcard",
        ),
        (
            tk("", "viewer", "document:1"),
            "Invalid tuple 'document:1#viewer@'. Reason: the 'user' field is malformed",
        ),
        (
            tk("maria", "viewer", "document:1"),
            "Invalid tuple 'document:1#viewer@maria'. Reason: the 'user' field must be an object (e.g. document:1) or an 'object#relation' or a typed wildcard (e.g. group:*)",
        ),
        (
            json!({"user": "user:anne", "relation": "editor", "object": "document:1", "condition": {"name": "non_expired"}}),
            "Invalid tuple 'document:1#editor@user:anne (condition non_expired)'. Reason: invalid condition for type restriction",
        ),
        (
            json!({"user": "user:anne", "relation": "viewer", "object": "document:1", "condition": {"name": "c2"}}),
            "Invalid tuple 'document:1#viewer@user:anne (condition c2)'. Reason: undefined condition",
        ),
        (
            json!({"user": "user:anne", "relation": "viewer", "object": "document:1", "condition": {"name": "non_expired", "context": {"bogus": 1}}}),
            "Invalid tuple 'document:1#viewer@user:anne (condition non_expired)'. Reason: found invalid context parameter: bogus",
        ),
    ];
    for (t, message) in cases {
        // A valid write first: the first failing write is named, nothing is applied.
        write(&fga, writes(&[tk("user:ok", "viewer", "document:1"), t]))
            .await
            .assert_error(400, "validation_error", message);
    }
    // OpenFGA's documented example (`org:fga`) needs a model with an `org` type.
    let fga2 = FakeFga::builder()
        .model(Model::default().with_type("org"))
        .start();
    write(&fga2, writes(&[tk("org:fga", "viewer", "document:1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            "Invalid tuple 'document:1#viewer@org:fga'. Reason: type 'org' is not an allowed type restriction for 'document#viewer'",
        );
    // Context too large: 40024 = proto.Size of Struct{"expires_at": <40000-byte string>}.
    write(&fga, writes(&[non_expired("user:anne", &"x".repeat(40_000))]))
        .await
        .assert_error(
            400,
            "validation_error",
            "Invalid tuple 'document:1#viewer@user:anne'. Reason: condition context size limit exceeded: 40024 bytes exceeds 32768 bytes",
        );
    assert!(fga.tuples().is_empty(), "nothing applied");
    // Everything the default model allows.
    write(
        &fga,
        writes(&[
            tk("user:anne", "viewer", "document:1"),
            tk("user:*", "viewer", "document:1"),
            tk("group:eng#member", "viewer", "document:1"),
            non_expired("user:bob", "2030-01-01T00:00:00Z"),
            tk("organization:acme", "parent", "document:1"),
            tk("organization:acme", "parent", "capture_job:7"),
            tk("capture_job:7", "parent", "archive:9"),
        ]),
    )
    .await
    .assert_ok();
}

#[tokio::test]
async fn conditions_required_and_implicit_tuples() {
    let model = Model::empty()
        .with_type("user")
        .with_relation("doc", "viewer", &["user with cond"])
        .with_relation("group", "member", &["user", "group#member"])
        .with_condition("cond", &["x"]);
    let fga = FakeFga::builder().model(model).start();
    write(&fga, writes(&[tk("user:anne", "viewer", "doc:1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            "Invalid tuple 'doc:1#viewer@user:anne'. Reason: condition is missing",
        );
    write(&fga, writes(&[tk("group:1#member", "member", "group:1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            "Invalid tuple 'group:1#member@group:1#member'. Reason: cannot write a tuple that is implicit",
        );
    let with_c = json!({"user": "user:anne", "relation": "viewer", "object": "doc:1",
                        "condition": {"name": "cond", "context": {"x": 1.0}}});
    write(&fga, writes(&[with_c])).await.assert_ok();
    assert_eq!(
        fga.condition_of("user:anne", "viewer", "doc:1"),
        Some(json!({"name": "cond", "context": {"x": 1}})),
        "context numbers are doubles, printed as protojson prints them"
    );
}

#[tokio::test]
async fn deletes_need_only_a_well_formed_user() {
    let fga = FakeFga::start();
    write(&fga, deletes(&[tk("a b", "viewer", "document:1")]))
        .await
        .assert_error(
            400,
            "validation_error",
            "Invalid tuple 'document:1#viewer@a b'. Reason: the 'user' field is malformed",
        );
    // A bare id passes `IsValidUser`; the delete then finds nothing.
    write(&fga, deletes(&[tk("anne", "nonsense", "nothing:1")]))
        .await
        .assert_error(
            400,
            "write_failed_due_to_invalid_input",
            "cannot delete a tuple which does not exist: user: 'anne', relation: 'nonsense', object: 'nothing:1': tuple to be written already existed or the tuple to be deleted did not exist",
        );
}

#[tokio::test]
async fn duplicates_and_size_limit() {
    let fga = FakeFga::builder().max_tuples_per_write(3).start();
    let a = tk("user:0", "viewer", "document:0");
    write(&fga, writes(&[a.clone(), a.clone()]))
        .await
        .assert_error(
            400,
            "cannot_allow_duplicate_tuples_in_one_request",
            "duplicate tuple in write: user: 'user:0', relation: 'viewer', object: 'document:0'",
        );
    // The condition is not part of the key.
    let mut a_cond = non_expired("user:0", "2030-01-01T00:00:00Z");
    a_cond["object"] = json!("document:0");
    write(
        &fga,
        json!({"writes": {"tuple_keys": [a_cond]}, "deletes": {"tuple_keys": [a.clone()]}}),
    )
    .await
    .assert_error(
        400,
        "cannot_allow_duplicate_tuples_in_one_request",
        "duplicate tuple in write: user: 'user:0', relation: 'viewer', object: 'document:0'",
    );
    let four: Vec<Value> = (0..4)
        .map(|i| tk(&format!("user:{i}"), "viewer", "document:0"))
        .collect();
    write(
        &fga,
        json!({"writes": {"tuple_keys": four[..2]}, "deletes": {"tuple_keys": four[2..]}}),
    )
    .await
    .assert_error(
        400,
        "exceeded_entity_limit",
        "The number of write operations exceeds the allowed limit of 3",
    );
    write(&fga, writes(&four[..3])).await.assert_ok();
}

// ------------------------------------------------------------------------------------------------
// Write: the datastore transaction
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn error_mode_and_atomicity() {
    let fga = FakeFga::start();
    write(&fga, writes(&[tk("user:maria", "viewer", "document:1")]))
        .await
        .assert_ok();
    let before = fga.tuples();
    // A new tuple and an existing one: the request fails whole.
    write(
        &fga,
        writes(&[tk("user:new", "viewer", "document:1"), tk("user:maria", "viewer", "document:1")]),
    )
    .await
    .assert_error(
        400,
        "write_failed_due_to_invalid_input",
        "cannot write a tuple which already exists: user: 'user:maria', relation: 'viewer', object: 'document:1': tuple to be written already existed or the tuple to be deleted did not exist",
    );
    // An existing delete and a missing one.
    write(
        &fga,
        deletes(&[tk("user:maria", "viewer", "document:1"), tk("user:ghost", "viewer", "document:1")]),
    )
    .await
    .assert_error(
        400,
        "write_failed_due_to_invalid_input",
        "cannot delete a tuple which does not exist: user: 'user:ghost', relation: 'viewer', object: 'document:1': tuple to be written already existed or the tuple to be deleted did not exist",
    );
    assert_eq!(fga.tuples(), before);
    assert_eq!(fga.changelog().len(), 1);
    let mut explicit = writes(&[tk("user:maria", "viewer", "document:1")]);
    explicit["writes"]["on_duplicate"] = json!("error");
    assert_eq!(write(&fga, explicit).await.status, 400);
}

#[tokio::test]
async fn ignore_modes() {
    let fga = FakeFga::start();
    write(
        &fga,
        writes(&[
            tk("user:maria", "viewer", "document:1"),
            non_expired("user:bob", "2030-01-01T00:00:00Z"),
        ]),
    )
    .await
    .assert_ok();
    let changes = fga.changelog().len();

    // Same tuples, same conditions: no-ops, plus one new tuple.
    let body = json!({
        "writes": {"on_duplicate": "ignore", "tuple_keys": [
            tk("user:maria", "viewer", "document:1"),
            non_expired("user:bob", "2030-01-01T00:00:00Z"),
            tk("user:carl", "viewer", "document:1"),
        ]},
        "deletes": {"on_missing": "ignore", "tuple_keys": [tk("user:ghost", "viewer", "document:1")]},
    });
    write(&fga, body.clone()).await.assert_ok();
    assert_eq!(
        fga.changelog().len(),
        changes + 1,
        "only user:carl is a change"
    );
    write(&fga, body).await.assert_ok();
    assert_eq!(
        fga.changelog().len(),
        changes + 1,
        "a replay changes nothing"
    );

    // Same key, different condition: 409.
    let conflict = json!({"writes": {"on_duplicate": "ignore", "tuple_keys": [
        non_expired("user:bob", "2031-01-01T00:00:00Z")]}});
    write(&fga, conflict).await.assert_error(
        409,
        "Aborted",
        "transactional write failed due to conflict: attempted to write a tuple which already exists with a different condition: user: 'user:bob', relation: 'viewer', object: 'document:1'",
    );
    let unconditioned = json!({"writes": {"on_duplicate": "ignore", "tuple_keys": [
        tk("user:bob", "viewer", "document:1")]}});
    assert_eq!(write(&fga, unconditioned).await.status, 409);

    // proto.Equal tells a missing context from an empty one; the stored one reads back empty.
    write(
        &fga,
        writes(&[
            json!({"user": "user:dan", "relation": "viewer", "object": "document:1",
                         "condition": {"name": "non_expired"}}),
        ]),
    )
    .await
    .assert_ok();
    let no_context = json!({"writes": {"on_duplicate": "ignore", "tuple_keys": [
        {"user": "user:dan", "relation": "viewer", "object": "document:1", "condition": {"name": "non_expired"}}]}});
    assert_eq!(write(&fga, no_context).await.status, 409);
    let empty_context = json!({"writes": {"on_duplicate": "ignore", "tuple_keys": [
        {"user": "user:dan", "relation": "viewer", "object": "document:1",
         "condition": {"name": "non_expired", "context": {}}}]}});
    write(&fga, empty_context).await.assert_ok();

    // Option values.
    let mut bad = writes(&[tk("user:x", "viewer", "document:1")]);
    bad["writes"]["on_duplicate"] = json!("bad_option");
    write(&fga, bad).await.assert_error(
        400,
        "validation_error",
        "invalid on_duplicate option: bad_option",
    );
    let mut bad = deletes(&[tk("user:x", "viewer", "document:1")]);
    bad["deletes"]["on_missing"] = json!("nope");
    write(&fga, bad)
        .await
        .assert_error(400, "validation_error", "invalid on_missing option: nope");
}

#[tokio::test]
async fn legacy_server_ignores_the_options() {
    let fga = FakeFga::builder().legacy().start();
    let body = json!({"writes": {"on_duplicate": "ignore", "tuple_keys": [tk("user:maria", "viewer", "document:1")]}});
    write(&fga, body.clone()).await.assert_ok();
    write(&fga, body).await.assert_error(
        400,
        "write_failed_due_to_invalid_input",
        "cannot write a tuple which already exists: user: 'user:maria', relation: 'viewer', object: 'document:1': tuple to be written already existed or the tuple to be deleted did not exist",
    );
    let missing = json!({"deletes": {"on_missing": "ignore", "tuple_keys": [tk("user:ghost", "viewer", "document:1")]}});
    assert_eq!(write(&fga, missing).await.status, 400);
    // An unknown field's value is never looked at.
    let odd = json!({"writes": {"on_duplicate": "bad_option", "tuple_keys": [tk("user:x", "viewer", "document:1")]}});
    write(&fga, odd).await.assert_ok();
}

// ------------------------------------------------------------------------------------------------
// Authentication
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn preshared_key() {
    let fga = FakeFga::builder()
        .preshared_key("k1")
        .preshared_key("k2")
        .start();
    let body = writes(&[tk("user:a", "viewer", "document:1")]);
    write(&fga, body.clone()).await.assert_error(
        401,
        "bearer_token_missing",
        "missing bearer token",
    );
    write_with_token(&fga, body.clone(), "Basic k1")
        .await
        .assert_error(401, "bearer_token_missing", "missing bearer token");
    write_with_token(&fga, body.clone(), "Bearer wrong")
        .await
        .assert_error(401, "unauthenticated", "unauthenticated");
    write_with_token(&fga, body.clone(), "Bearer k2")
        .await
        .assert_ok();
    let mut again = body.clone();
    again["writes"]["on_duplicate"] = json!("ignore");
    write_with_token(&fga, again, "bearer k1").await.assert_ok();
    // Validation runs before authentication.
    let r = post_raw(&fga, "/stores/bad/write", &body.to_string()).await;
    assert_eq!(r.status, 400);
    // Other routes need the key too.
    get(&fga, &format!("/stores/{STORE_ID}"))
        .await
        .assert_error(401, "bearer_token_missing", "missing bearer token");
    read(&fga, json!({}))
        .await
        .assert_error(401, "bearer_token_missing", "missing bearer token");
    let r = send(
        client()
            .get(format!("{}/stores", fga.url()))
            .bearer_auth("k1"),
    )
    .await;
    assert_eq!(r.status, 200);

    let auths: Vec<Option<String>> = fga.writes().into_iter().map(|w| w.authorization).collect();
    assert_eq!(
        auths,
        vec![
            None,
            Some("Basic k1".to_owned()),
            Some("Bearer wrong".to_owned()),
            Some("Bearer k2".to_owned()),
            Some("bearer k1".to_owned()),
            None,
        ]
    );
    let statuses: Vec<u16> = fga.writes().iter().map(|w| w.status).collect();
    assert_eq!(statuses, vec![401, 401, 401, 200, 200, 400]);
}

#[tokio::test]
async fn custom_bearer_check() {
    let fga = FakeFga::builder()
        .accept_bearer(|token| token.starts_with("good-"))
        .start();
    let body = writes(&[tk("user:a", "viewer", "document:1")]);
    write(&fga, body.clone()).await.assert_error(
        401,
        "bearer_token_missing",
        "missing bearer token",
    );
    // What OpenFGA's OIDC authenticator answers for a token it rejects.
    write_with_token(&fga, body.clone(), "Bearer bad-1")
        .await
        .assert_error(401, "invalid_claims", "invalid claims");
    write_with_token(&fga, body, "Bearer good-1")
        .await
        .assert_ok();
}

// ------------------------------------------------------------------------------------------------
// Faults
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn status_faults() {
    let fga = FakeFga::start();
    fga.push_fault(FaultRule::once(Fault::internal()));
    fga.push_fault(FaultRule::once(Fault::rate_limited(7)));
    fga.push_fault(FaultRule::times(Fault::aborted(), 2));
    let body = writes(&[tk("user:a", "viewer", "document:1")]);

    write(&fga, body.clone())
        .await
        .assert_error(500, "internal_error", "Internal Server Error");
    let r = write(&fga, body.clone()).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("7"));
    for _ in 0..2 {
        write(&fga, body.clone()).await.assert_error(
            409,
            "Aborted",
            "transactional write failed due to conflict: one or more tuples to write were inserted by another transaction",
        );
    }
    assert!(fga.tuples().is_empty(), "faults apply nothing");
    write(&fga, body.clone()).await.assert_ok();

    fga.push_fault(FaultRule::once(Fault::unavailable()));
    fga.clear_faults();
    let mut again = body;
    again["writes"]["on_duplicate"] = json!("ignore");
    write(&fga, again).await.assert_ok();
    let statuses: Vec<u16> = fga.writes().iter().map(|w| w.status).collect();
    assert_eq!(statuses, vec![500, 429, 409, 409, 200, 200]);
}

#[tokio::test]
async fn faults_match_by_tuple_and_only_after_auth() {
    let fga = FakeFga::builder().preshared_key("k").start();
    fga.push_fault(FaultRule::once(Fault::internal()).when_tuple("user:b", "viewer", "document:1"));
    let a = writes(&[tk("user:a", "viewer", "document:1")]);
    let b = deletes(&[tk("user:b", "viewer", "document:1")]);
    // Unauthenticated: answered 401, the fault stays.
    write(&fga, b.clone())
        .await
        .assert_error(401, "bearer_token_missing", "missing bearer token");
    write_with_token(&fga, a, "Bearer k").await.assert_ok();
    let r = write_with_token(&fga, b.clone(), "Bearer k").await;
    r.assert_error(500, "internal_error", "Internal Server Error");
    // Consumed: the delete now reaches the datastore.
    assert_eq!(write_with_token(&fga, b, "Bearer k").await.status, 400);
}

#[tokio::test]
async fn garbage_fault() {
    let fga = FakeFga::start();
    fga.push_fault(FaultRule::once(Fault::Garbage {
        status: 200,
        content_type: "text/html".to_owned(),
        body: "<html>proxy</html>".to_owned(),
    }));
    let r = write(&fga, writes(&[tk("user:a", "viewer", "document:1")])).await;
    assert_eq!((r.status, r.body.as_str()), (200, "<html>proxy</html>"));
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert!(fga.tuples().is_empty());
    assert_eq!(fga.writes()[0].status, 200);
}

#[tokio::test]
async fn delay_fault_applies_even_when_the_client_gives_up() {
    let fga = FakeFga::start();
    fga.push_fault(FaultRule::once(Fault::Delay(Duration::from_millis(300))));
    let started = Instant::now();
    write(&fga, writes(&[tk("user:a", "viewer", "document:1")]))
        .await
        .assert_ok();
    assert!(started.elapsed() >= Duration::from_millis(300));

    fga.push_fault(FaultRule::once(Fault::Delay(Duration::from_secs(1))));
    let err = client()
        .post(format!("{}/stores/{STORE_ID}/write", fga.url()))
        .body(writes(&[tk("user:b", "viewer", "document:1")]).to_string())
        .timeout(Duration::from_millis(50))
        .send()
        .await
        .expect_err("the client times out");
    assert!(err.is_timeout(), "{err:?}");
    assert!(!fga.has("user:b", "viewer", "document:1"));
    eventually(Duration::from_secs(5), "the delayed write lands", || {
        fga.has("user:b", "viewer", "document:1")
    })
    .await;
}

#[tokio::test]
async fn hang_fault_blocks_only_its_own_request_until_drop() {
    let fga = FakeFga::start();
    fga.push_fault(FaultRule::once(Fault::Hang));
    let url = format!("{}/stores/{STORE_ID}/write", fga.url());
    let hanging = tokio::spawn({
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(url)
                .body(writes(&[tk("user:h", "viewer", "document:1")]).to_string())
                .send()
                .await
        }
    });
    eventually(
        Duration::from_secs(5),
        "the hanging request arrives",
        || fga.write_count() == 1,
    )
    .await;
    // Other requests are served meanwhile.
    write(&fga, writes(&[tk("user:a", "viewer", "document:1")]))
        .await
        .assert_ok();
    let answered = client().post(&url).body("{}").send().await;
    assert_eq!(answered.expect("answered").status().as_u16(), 400);
    assert_eq!(fga.writes()[0].status, 0);
    assert!(!hanging.is_finished());
    assert!(!fga.has("user:h", "viewer", "document:1"));

    drop(fga);
    let result = tokio::time::timeout(Duration::from_secs(5), hanging)
        .await
        .expect("released on drop")
        .expect("task");
    assert!(result.is_err(), "no HTTP answer: {result:?}");
}

#[tokio::test]
async fn close_connection_fault_drops_the_connection_without_an_answer() {
    let fga = FakeFga::start();
    fga.push_fault(FaultRule::once(Fault::CloseConnection));
    let client = client();
    let url = format!("{}/stores/{STORE_ID}/write", fga.url());
    let body = writes(&[tk("user:a", "viewer", "document:1")]).to_string();
    let err = client
        .post(&url)
        .body(body.clone())
        .send()
        .await
        .expect_err("no HTTP answer");
    assert!(!err.is_timeout() && err.status().is_none(), "{err:?}");
    assert!(fga.tuples().is_empty());
    assert_eq!(fga.writes()[0].status, 0);
    // The same client goes on with a new connection.
    let r = client.post(&url).body(body).send().await.expect("answer");
    assert_eq!(r.status().as_u16(), 200);
}

// ------------------------------------------------------------------------------------------------
// Refusing connections
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn refusing_then_listening_again_on_the_same_port() {
    let fga = FakeFga::start();
    let client = client();
    let url = format!("{}/healthz", fga.url());
    // A keep-alive connection exists before the outage.
    assert_eq!(
        client.get(&url).send().await.unwrap().status().as_u16(),
        200
    );
    fga.push_fault(FaultRule::once(Fault::Hang));
    let hanging = tokio::spawn({
        let url = format!("{}/stores/{STORE_ID}/write", fga.url());
        async move { reqwest::Client::new().post(url).body("{}").send().await }
    });
    eventually(
        Duration::from_secs(5),
        "the hanging request arrives",
        || fga.write_count() == 1,
    )
    .await;

    fga.set_refusing(true);
    // The pooled connection was closed too: using it fails (how depends on timing), and a new
    // connection is refused.
    client.get(&url).send().await.expect_err("no answer");
    let err = reqwest::Client::new()
        .get(&url)
        .send()
        .await
        .expect_err("refused");
    assert!(err.is_connect(), "{err:?}");
    let err = client.get(&url).send().await.expect_err("refused");
    assert!(err.is_connect(), "{err:?}");
    let hung = tokio::time::timeout(Duration::from_secs(5), hanging)
        .await
        .expect("open connections are closed")
        .unwrap();
    assert!(hung.is_err());

    fga.set_refusing(false);
    let r = client.get(&url).send().await.expect("listening again");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(fga.url(), format!("http://{}", fga.addr()));
}

// ------------------------------------------------------------------------------------------------
// Read
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn read_filters_and_pages() {
    let fga = FakeFga::start();
    write(
        &fga,
        writes(&[
            tk("user:anne", "viewer", "document:1"),
            tk("user:bob", "viewer", "document:2"),
            non_expired("user:carl", "2030-01-01T00:00:00Z"),
            tk("user:anne", "member", "organization:acme"),
        ]),
    )
    .await
    .assert_ok();

    let r = read(&fga, json!({})).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    let tuples = v["tuples"].as_array().unwrap();
    assert_eq!(tuples.len(), 4);
    assert_eq!(
        tuples[0]["key"],
        json!({"user": "user:anne", "relation": "viewer", "object": "document:1", "condition": null})
    );
    assert_eq!(
        tuples[2]["key"]["condition"],
        json!({"name": "non_expired", "context": {"expires_at": "2030-01-01T00:00:00Z"}})
    );
    let ts = tuples[0]["timestamp"].as_str().unwrap();
    assert!(
        ts.len() >= 20 && ts.ends_with('Z') && &ts[10..11] == "T",
        "{ts}"
    );
    assert_eq!(v["continuation_token"], "");

    // Pages of 3, then the rest; the token is empty on the last page.
    let first = read(&fga, json!({"page_size": 3})).await.json();
    assert_eq!(first["tuples"].as_array().unwrap().len(), 3);
    let token = first["continuation_token"].as_str().unwrap().to_owned();
    assert!(!token.is_empty());
    let second = read(&fga, json!({"page_size": 3, "continuation_token": token}))
        .await
        .json();
    assert_eq!(second["tuples"].as_array().unwrap().len(), 1);
    assert_eq!(second["tuples"][0]["key"]["object"], "organization:acme");
    assert_eq!(second["continuation_token"], "");

    let users = |v: Value| -> Vec<String> {
        v["tuples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"]["user"].as_str().unwrap().to_owned())
            .collect()
    };
    let v = read(&fga, json!({"tuple_key": {"object": "document:1"}}))
        .await
        .json();
    assert_eq!(users(v), ["user:anne", "user:carl"]);
    let v = read(
        &fga,
        json!({"tuple_key": {"object": "document:", "user": "user:bob"}}),
    )
    .await
    .json();
    assert_eq!(users(v), ["user:bob"]);
    let v = read(
        &fga,
        json!({"tuple_key": {"object": "document:1", "relation": "viewer", "user": "user:carl"}}),
    )
    .await
    .json();
    assert_eq!(users(v), ["user:carl"]);

    read(&fga, json!({"tuple_key": {"object": "document:"}}))
        .await
        .assert_error(
            400,
            "validation_error",
            "the 'tuple_key' field was provided but the object type field is required and both the object id and user cannot be empty",
        );
    read(&fga, json!({"page_size": 0})).await.assert_error(
        400,
        "page_size_invalid",
        "invalid ReadRequest.PageSize: value must be inside range [1, 100]",
    );
    read(&fga, json!({"continuation_token": "abc"}))
        .await
        .assert_error(
            400,
            "invalid_continuation_token",
            "Invalid continuation token",
        );
    read(&fga, json!({"tuple_key": {"object": "document:1", "user": "anne"}}))
        .await
        .assert_error(
            400,
            "validation_error",
            r#"invalid ReadRequestTupleKey.User: value does not match regex pattern "^[^\\s]{1,511}:[^\\s]{1,511}$""#,
        );
    // Another store simply has no tuples.
    let r = post_raw(&fga, "/stores/01ARZ3NDEKTSV4RRFFQ69G5FAV/read", "{}").await;
    assert_eq!(r.json(), json!({"tuples": [], "continuation_token": ""}));
    assert_eq!(fga.write_count(), 1, "reads are not write records");
}

// ------------------------------------------------------------------------------------------------
// Test-side helpers of the stand-in
// ------------------------------------------------------------------------------------------------

#[tokio::test]
async fn behind_the_back_helpers() {
    let fga = FakeFga::start();
    fga.insert_tuple(StoredTuple::new("user:z", "viewer", "document:2"));
    fga.insert_tuple(
        StoredTuple::new("user:a", "viewer", "document:2")
            .with_condition("non_expired", json!({"b": 2, "a": "x"})),
    );
    fga.insert_tuple(StoredTuple::new("user:m", "editor", "document:1"));
    let tuples = fga.tuples();
    let order: Vec<(&str, &str, &str)> = tuples
        .iter()
        .map(|t| (t.object.as_str(), t.relation.as_str(), t.user.as_str()))
        .collect();
    assert_eq!(
        order,
        [
            ("document:1", "editor", "user:m"),
            ("document:2", "viewer", "user:a"),
            ("document:2", "viewer", "user:z"),
        ]
    );
    assert_eq!(
        tuples[1].condition.as_deref(),
        Some(r#"{"name":"non_expired","context":{"a":"x","b":2}}"#)
    );
    assert_eq!(
        tuples[1].condition_value(),
        fga.condition_of("user:a", "viewer", "document:2")
    );
    assert!(fga.remove_tuple("user:z", "viewer", "document:2"));
    assert!(!fga.remove_tuple("user:z", "viewer", "document:2"));
    assert!(fga.changelog().is_empty());

    // The relay sees tuples inserted behind its back.
    let mut t = non_expired("user:a", "whatever");
    t["object"] = json!("document:2");
    write(&fga, writes(&[t])).await.assert_error(
        400,
        "write_failed_due_to_invalid_input",
        "cannot write a tuple which already exists: user: 'user:a', relation: 'viewer', object: 'document:2': tuple to be written already existed or the tuple to be deleted did not exist",
    );
    fga.reset_requests();
    assert_eq!(fga.write_count(), 0);
    assert!(fga.writes().is_empty());
    assert_eq!(fga.tuples().len(), 2, "reset_requests keeps the tuples");
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

#[tokio::test]
async fn eventually_returns_as_soon_as_true() {
    let started = Instant::now();
    let mut calls = 0;
    eventually(Duration::from_secs(5), "the third call", || {
        calls += 1;
        calls == 3
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
#[should_panic(expected = "never true")]
async fn eventually_panics_at_the_deadline() {
    eventually(Duration::from_millis(50), "never true", || false).await;
}

/// The stand-in serves from its own thread: a test may block its own thread, or drive its client
/// from a current-thread runtime, without starving it.
#[test]
fn serves_while_the_test_thread_blocks() {
    let fga = FakeFga::start();
    let url = format!("{}/healthz", fga.url());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime.block_on(async {
        let pending =
            tokio::spawn(async move { reqwest::get(url).await.map(|r| r.status().as_u16()) });
        std::thread::sleep(Duration::from_millis(100));
        pending.await.unwrap().unwrap()
    });
    assert_eq!(status, 200);
    let started = Instant::now();
    drop(fga);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "drop joins quickly"
    );
}

/// Not a benchmark: shows that 100-tuple writes go through in bulk (the rate is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_many_full_writes() {
    let fga = FakeFga::start();
    let client = client();
    let url = format!("{}/stores/{STORE_ID}/write", fga.url());
    let requests = 200;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let client = client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..requests / 4 {
                let keys: Vec<Value> = (0..100)
                    .map(|i| {
                        tk(
                            &format!("user:{worker}-{n}-{i}"),
                            "viewer",
                            "document:bench",
                        )
                    })
                    .collect();
                let r = client
                    .post(&url)
                    .body(writes(&keys).to_string())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    assert_eq!(fga.write_count(), requests);
    assert_eq!(fga.tuples().len(), requests * 100);
    println!(
        "{requests} writes of 100 tuples in {elapsed:?}: {:.0} writes/s",
        requests as f64 / elapsed.as_secs_f64()
    );
}

#[test]
fn the_handle_can_be_shared_across_tasks() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<FakeFga>();
    send_sync::<FaultRule>();
}
