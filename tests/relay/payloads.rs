//! Payloads that can never be delivered are dead-lettered at once, with a reason, and never
//! hold up the rows behind them.

use crate::common::fga::Fga;
use crate::common::pg::{PROMPTLY, TestDb};
use crate::common::relay::{Env, insert_text, tk, wait_until, writes};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payloads_are_dead_lettered_with_a_reason_and_the_rows_after_them_delivered() {
    let env = Env::start().await;
    let cases = [
        (json!([1, 2]), "expected a JSON object"),
        (json!("just a string"), "expected a JSON object"),
        (json!({}), "no tuples"),
        (json!({"writes": []}), "no tuples"),
        (
            json!({"writes": "user:anne"}),
            "\"writes\" must be an array",
        ),
        (
            json!({"writes": [{"relation": "viewer", "object": "document:1"}]}),
            "writes[0].user is missing",
        ),
        (
            json!({"deletes": [{"user": 7, "relation": "viewer", "object": "document:1"}]}),
            "deletes[0].user must be a string",
        ),
        (
            json!({"writes": [{"user": "user:a", "relation": "", "object": "document:1"}]}),
            "writes[0].relation is empty",
        ),
    ];
    let mut bad = Vec::new();
    for (payload, _) in &cases {
        bad.push(env.insert(payload.clone()).await);
    }
    let good = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let _relay = env.start_relay().await;
    wait_until(PROMPTLY, "the valid row is delivered", || async {
        env.row(good).await.delivered
    })
    .await;
    for (id, (payload, reason)) in bad.iter().zip(&cases) {
        let row = env.row(*id).await;
        assert!(
            row.dead && !row.delivered,
            "{payload} should be dead: {row:?}"
        );
        let err = row.last_error.unwrap_or_default();
        assert!(
            err.contains(reason),
            "{payload}: last_error {err:?} should say {reason:?}"
        );
    }
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
}

/// OpenFGA's own verdict on a tuple (here: a type the model does not have) dead-letters that row
/// alone, with OpenFGA's message; the rows sharing its Write are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tuple_openfga_rejects_dead_letters_only_its_row() {
    let env = Env::start().await;
    let mut ids = Vec::new();
    for i in 0..100 {
        let object = if i == 42 {
            "spaceship:1".to_owned()
        } else {
            format!("document:{i}")
        };
        ids.push(
            env.insert(writes(&[tk("user:anne", "viewer", &object)]))
                .await,
        );
    }
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    let bad = env.row(ids[42]).await;
    assert!(bad.dead, "{bad:?}");
    let err = bad.last_error.unwrap_or_default();
    assert!(
        err.contains("Invalid tuple 'spaceship:1#viewer@user:anne'"),
        "{err}"
    );
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| *i != 42) {
        assert!(env.row(*id).await.delivered, "row {i}");
    }
    assert_eq!(env.fga.tuples().len(), 99);
}

/// In a database whose encoding is `SQL_ASCII` (text stored as the bytes written, none
/// checked), a payload written in another encoding is not UTF-8: its row is dead-lettered with
/// the reason and what to do, and the rows around it flow, read in the same pages. PostgreSQL
/// used to check such text against the relay's encoding before sending it, and every read that
/// reached the row failed: nothing after it was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_is_not_utf8_in_a_sql_ascii_database_is_dead_lettered_and_the_rest_flow() {
    let env = Env::with(TestDb::start_encoded("SQL_ASCII"), Fga::start()).await;
    let before = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let admin = env.db.connect().await;
    // `user:b\xe9a`: "béa" in Latin-1.
    let bad: i64 = admin
        .query_one(
            "INSERT INTO fga_outbox (payload) VALUES (('{\"writes\": [{\"user\": \"user:b' \
             || chr(233) || 'a\", \"relation\": \"viewer\", \"object\": \"document:2\"}]}')::jsonb) \
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let after = env
        .insert(writes(&[tk("user:anne", "viewer", "document:3")]))
        .await;
    let relay = env.start_relay().await;
    wait_until(PROMPTLY, "every row delivered or dead", || async {
        env.row(before).await.delivered && env.row(bad).await.dead && env.row(after).await.delivered
    })
    .await;
    let r = env.row(bad).await;
    assert!(
        r.last_error
            .as_deref()
            .is_some_and(|e| e.contains("not UTF-8") && e.contains("retry")),
        "the reason does not say what is wrong and what to do: {r:?}; relay log:\n{}",
        relay.logs()
    );
}

/// Documents PostgreSQL's jsonb takes but a full JSON decode refuses (a number beyond a double,
/// nesting deeper than 128 levels) never crash the relay: under a key it ignores they are
/// delivered; in a condition's context, which is sent on, the row is dead-lettered with the
/// reason. The rows behind them flow, and the relay stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_beyond_a_json_decoders_limits_never_crash_the_relay() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    let deep = |d: usize| "[".repeat(d) + &"]".repeat(d);
    let t = |n: usize| {
        format!(r#"{{"user": "user:o{n}", "relation": "viewer", "object": "document:o{n}""#)
    };
    let delivered = [
        format!(r#"{{"writes": [{}}}], "meta": 1e400}}"#, t(0)),
        format!(r#"{{"writes": [{}}}], "meta": {}}}"#, t(1), deep(1000)),
        format!(
            r#"{{"writes": [{}, "note": -1e-400, "x": {}}}]}}"#,
            t(2),
            deep(300)
        ),
    ];
    let dead = [
        (
            format!(
                r#"{{"writes": [{}, "condition": {{"name": "non_expired", "context": {{"expires_at": 1e400}}}}}}]}}"#,
                t(3)
            ),
            "condition.context cannot be read",
        ),
        (
            format!(
                r#"{{"writes": [{}, "condition": {{"name": "non_expired", "context": {{"d": {}}}}}}}]}}"#,
                t(4),
                deep(200)
            ),
            "condition.context cannot be read",
        ),
    ];
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for doc in &delivered {
        good.push(insert_text(&client, doc).await.unwrap());
    }
    for (doc, reason) in &dead {
        bad.push((insert_text(&client, doc).await.unwrap(), *reason));
    }
    let after = env
        .insert(writes(&[tk("user:after", "viewer", "document:1")]))
        .await;
    let mut relay = env.start_relay().await;
    env.wait_drained().await;
    assert!(relay.is_running(), "the relay died: {}", relay.logs());
    for id in good.iter().chain([&after]) {
        let row = env.row(*id).await;
        assert!(row.delivered, "row {id}: {row:?}");
    }
    for (id, reason) in bad {
        let row = env.row(id).await;
        assert!(row.dead, "row {id}: {row:?}");
        assert!(
            row.last_error.clone().unwrap_or_default().contains(reason),
            "{row:?}"
        );
    }
    for n in 0..3 {
        assert!(
            env.fga
                .has(&format!("user:o{n}"), "viewer", &format!("document:o{n}"))
        );
    }
}

/// OpenFGA's `\s` is ASCII: an object or user with a no-break space or an ideographic space is
/// OpenFGA's to accept, and is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_spaces_are_not_whitespace_to_openfga_and_are_delivered() {
    let env = Env::start().await;
    let odd = [
        tk("user:nbsp", "viewer", "document:a\u{a0}b"),
        tk("user:ideo", "viewer", "document:a\u{3000}b"),
        tk("user:a\u{a0}b", "viewer", "document:1"),
    ];
    let mut ids = Vec::new();
    for t in &odd {
        ids.push(env.insert(writes(std::slice::from_ref(t))).await);
    }
    let _relay = env.start_relay().await;
    env.wait_drained().await;
    for id in ids {
        let row = env.row(id).await;
        assert!(row.delivered, "{row:?}");
    }
    assert!(env.fga.has("user:nbsp", "viewer", "document:a\u{a0}b"));
    assert!(env.fga.has("user:ideo", "viewer", "document:a\u{3000}b"));
}

/// The property: whatever jsonb documents the outbox holds, mixed with valid payloads (which
/// carry arbitrary content under keys the relay ignores), every row ends delivered or dead, every
/// valid one delivered, and the relay stays up. A few rounds of generated documents against one
/// relay keep it to seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_jsonb_document_ends_delivered_or_dead_and_the_relay_stays_up() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let env = Env::start().await;
    let client = env.db.connect().await;
    let relay = std::sync::Mutex::new(env.start_relay().await);
    let handle = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(Config {
        cases: 6,
        failure_persistence: None,
        ..Config::default()
    });
    let round = std::sync::atomic::AtomicUsize::new(0);
    let docs = prop::collection::vec((doc(), any::<bool>()), 20..60);
    let result = runner.run(&docs, |docs| {
        let r = round.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                let mut valid = Vec::new();
                let mut any = Vec::new();
                for (i, (odd, as_extra)) in docs.iter().enumerate() {
                    let text = if *as_extra {
                        // A valid payload carrying the odd document under an ignored key.
                        format!(
                            r#"{{"writes": [{{"user": "user:p{r}x{i}", "relation": "viewer",
                                "object": "document:p{i}", "extra": {odd}}}], "meta": {odd}}}"#
                        )
                    } else {
                        odd.clone()
                    };
                    // PostgreSQL refuses some of them (e.g. \u0000): nothing to deliver.
                    if let Ok(id) = insert_text(&client, &text).await {
                        if *as_extra {
                            valid.push(id);
                        } else {
                            any.push(id);
                        }
                    }
                }
                env.wait_drained().await;
                let (running, logs) = {
                    let mut relay = relay.lock().unwrap();
                    (relay.is_running(), relay.logs())
                };
                prop_assert!(running, "the relay died:\n{}", logs);
                for id in &valid {
                    let row = env.row(*id).await;
                    prop_assert!(row.delivered, "valid row {id} not delivered: {row:?}");
                }
                for id in &any {
                    let row = env.row(*id).await;
                    prop_assert!(row.delivered || row.dead, "row {id}: {row:?}");
                }
                Ok::<(), TestCaseError>(())
            })
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Arbitrary JSON text of the kinds jsonb holds: huge and tiny exponents, deep nesting, any
/// Unicode, keys the payload knows and others.
fn doc() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let string = || "\\PC{0,10}".prop_map(|s| serde_json::to_string(&s).unwrap());
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        (any::<i32>(), -1000i32..1000).prop_map(|(m, e)| format!("{m}e{e}")),
        (1usize..400).prop_map(|d| "[".repeat(d) + &"]".repeat(d)),
        string(),
    ];
    let key = prop_oneof![
        Just("\"writes\"".to_owned()),
        Just("\"deletes\"".to_owned()),
        Just("\"user\"".to_owned()),
        Just("\"relation\"".to_owned()),
        Just("\"object\"".to_owned()),
        Just("\"condition\"".to_owned()),
        Just("\"name\"".to_owned()),
        Just("\"context\"".to_owned()),
        string(),
    ];
    leaf.prop_recursive(5, 48, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((key.clone(), inner), 0..5).prop_map(|kv| {
                let fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                format!("{{{}}}", fields.join(", "))
            }),
        ]
    })
}
