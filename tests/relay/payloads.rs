//! Payloads that can never be delivered are dead-lettered at once, with a reason, and never
//! hold up the rows behind them.

use crate::common::pg::PROMPTLY;
use crate::common::relay::{Env, tk, wait_until, writes};
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
