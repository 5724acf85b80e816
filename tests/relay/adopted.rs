//! Tables `migrate` adopts as they are: an application's own outbox, with its own defaults and
//! types. Whatever it allows, a row is delivered or dead-lettered and the rest flows; what the
//! relay cannot read at all is refused at once, with the fix.

use crate::common::fga::Fga;
use crate::common::relay::{Env, insert_with, tk, writes};
use std::time::Duration;

/// `migrate` adopts the application's own outbox table as it is. A table whose `created_at`
/// (or `attempts`) allows NULL, as a hand-written `created_at timestamptz DEFAULT now()` does,
/// gets a NULL there from any ORM that inserts every column of its model: that row cannot be
/// decoded, and must be dead-lettered with the reason (or delivered) while the rest flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_with_a_null_created_at_in_an_adopted_table_does_not_stop_delivery() {
    let mut stuck = Vec::new();
    for column in ["created_at", "attempts"] {
        let db = crate::common::pg::TestDb::start();
        let client = db.connect().await;
        client
            .batch_execute(
                "CREATE TABLE fga_outbox (id bigserial PRIMARY KEY, payload jsonb NOT NULL,
                     created_at timestamptz DEFAULT now(), processed_at timestamptz,
                     attempts integer DEFAULT 0, last_error text)",
            )
            .await
            .unwrap();
        let env = Env::with(db, Fga::start()).await;
        let odd = client
            .query_one(
                &format!(
                    "INSERT INTO fga_outbox (payload, {column}) VALUES ($1, NULL) RETURNING id"
                ),
                &[&writes(&[tk("user:null", "viewer", "document:1")])],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        let mut others = Vec::new();
        for i in 0..5 {
            let row = writes(&[tk(&format!("user:u{i}"), "viewer", "document:2")]);
            others.push(insert_with(&client, row).await);
        }
        let relay = env.start_relay().await;
        let flowed = env
            .all_delivered_within(&others, Duration::from_secs(30))
            .await;
        // Not `Env::row`: its `attempts` may be NULL here.
        let (delivered, dead): (bool, bool) = client
            .query_one(
                "SELECT processed_at IS NOT NULL, failed_at IS NOT NULL FROM fga_outbox \
                 WHERE id = $1",
                &[&odd],
            )
            .await
            .map(|r| (r.get(0), r.get(1)))
            .unwrap();
        if !flowed || !(delivered || dead) {
            let logs = relay.logs();
            stuck.push(format!(
                "{column} NULL in one row: the others flowed: {flowed}, that row delivered \
                 {delivered}, dead {dead}, `database error while delivering` lines: {}, last: {:?}",
                logs.matches("database error while delivering").count(),
                logs.lines().last().unwrap_or("")
            ));
        }
    }
    assert!(stuck.is_empty(), "{stuck:#?}");
}

/// `migrate` adopts an application's table whose `id` is a `serial` (integer), the most common
/// hand-written primary key. The relay reads ids as bigint, and every pass failed on it, with
/// the relay up and leading: `migrate` and `run` refuse such a table instead, naming the column
/// and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_table_with_a_serial_id_is_refused_naming_the_column() {
    let db = crate::common::pg::TestDb::start();
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE fga_outbox (id serial PRIMARY KEY, payload jsonb NOT NULL,
                 created_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz)",
        )
        .await
        .unwrap();
    let env = Env {
        db,
        fga: Fga::start(),
    };
    let out = env.command(&["migrate"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "migrate: {said}");
    assert!(
        said.contains("column fga_outbox.id is integer") && said.contains("TYPE bigint"),
        "migrate refused without naming the column and the fix: {said}"
    );
    // `run` refuses it too, at once, rather than lead and fail every pass.
    let run = env.command(&["run"]).output().unwrap();
    assert_eq!(
        run.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
