//! `fga-relay reconcile`: the delivered rows against what OpenFGA holds; drift made behind the
//! relay's back is found, repaired through the outbox, and then reported clean.

use crate::common::fga::{Fga, StoredTuple};
use crate::common::relay::{Env, assert_success, deletes, tk, writes};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What one `fga-relay reconcile` said.
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// The `--json` document.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "not one JSON document ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// The findings of the `--json` document as `status object#relation@user`, in order.
    fn findings(&self) -> Vec<String> {
        self.json()["findings"]
            .as_array()
            .expect("findings is an array")
            .iter()
            .map(|f| {
                format!(
                    "{} {}#{}@{}",
                    f["status"].as_str().unwrap(),
                    f["object"].as_str().unwrap(),
                    f["relation"].as_str().unwrap(),
                    f["user"].as_str().unwrap()
                )
            })
            .collect()
    }
}

impl From<std::process::Output> for Outcome {
    fn from(out: std::process::Output) -> Outcome {
        Outcome {
            code: out.status.code().expect("exited, not killed"),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    }
}

fn reconcile(env: &Env, args: &[&str]) -> Outcome {
    let mut all = vec!["reconcile"];
    all.extend_from_slice(args);
    env.command(&all)
        .output()
        .expect("run fga-relay reconcile")
        .into()
}

/// Delivers what is pending; rows some tests make undeliverable on purpose end dead, which
/// `drain` exits 3 for unless allowed.
fn drain(env: &Env) {
    assert_success(
        &env.command(&["drain", "--timeout", "20s", "--allow-dead"])
            .output()
            .unwrap(),
        "drain",
    );
}

/// Makes a delivered row look delivered 100 days ago (older than `prune --older-than 90d`).
async fn age(admin: &tokio_postgres::Client, id: i64) {
    admin
        .execute(
            "UPDATE fga_outbox SET processed_at = now() - interval '100 days' WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
}

async fn count(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one("SELECT count(*) FROM fga_outbox", &[])
        .await
        .unwrap()
        .get(0)
}

/// `prune --older-than 90d`, which must succeed; what it said.
fn prune(env: &Env) -> String {
    let out = env
        .command(&["prune", "--older-than", "90d"])
        .output()
        .unwrap();
    assert_success(&out, "prune");
    String::from_utf8(out.stdout).unwrap()
}

fn expect_code(o: &Outcome, code: i32, what: &str) {
    assert_eq!(
        o.code, code,
        "{what}: exit status\nstdout:\n{}\nstderr:\n{}",
        o.stdout, o.stderr
    );
}

fn cond(expires_at: &str) -> Value {
    json!({"name": "non_expired", "context": {"expires_at": expires_at}})
}

/// The issue's scenario: a clean store reports clean; a tuple removed, one added that the outbox
/// deleted last, and a condition changed, all behind the relay's back, are found; `--repair`
/// enqueues corrections that the relay delivers; then the store reports clean again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_behind_the_relays_back_is_found_repaired_and_then_reported_clean() {
    let env = Env::start().await;
    let mut bob = tk("user:bob", "viewer", "document:2");
    bob["condition"] = cond("2030-01-01T00:00:00Z");
    let anne = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let bob_row = env.insert(writes(&[bob])).await;
    env.insert(writes(&[tk("user:carl", "viewer", "document:3")]))
        .await;
    let carl_deleted = env
        .insert(deletes(&[tk("user:carl", "viewer", "document:3")]))
        .await;
    env.insert(writes(&[tk("user:dan", "editor", "document:4")]))
        .await;
    drain(&env);

    // Clean: text and JSON.
    let clean = reconcile(&env, &[]);
    expect_code(&clean, 0, "a clean store");
    assert!(clean.stdout.contains("4 in step"), "{}", clean.stdout);
    assert!(clean.stdout.trim_end().ends_with("in step"));
    let clean = reconcile(&env, &["--json"]);
    expect_code(&clean, 0, "a clean store, --json");
    let doc = clean.json();
    assert_eq!(doc["tuples"], 4);
    assert_eq!(doc["in_step"], 4);
    assert_eq!(doc["drift"], 0);
    assert_eq!(doc["findings"], json!([]));
    assert_eq!(doc["not_in_outbox"], 0);

    // Drift, behind the relay's back.
    assert!(env.fga.remove_tuple("user:anne", "viewer", "document:1"));
    env.fga
        .insert_tuple(StoredTuple::new("user:carl", "viewer", "document:3"));
    env.fga.insert_tuple(
        StoredTuple::new("user:bob", "viewer", "document:2")
            .with_condition("non_expired", json!({"expires_at": "2020-01-01T00:00:00Z"})),
    );

    let found = reconcile(&env, &["--json"]);
    expect_code(&found, 1, "drift");
    assert_eq!(
        found.findings(),
        [
            "missing document:1#viewer@user:anne",
            "condition document:2#viewer@user:bob",
            "unexpected document:3#viewer@user:carl",
        ]
    );
    let doc = found.json();
    assert_eq!(
        (
            &doc["missing"],
            &doc["unexpected"],
            &doc["condition_mismatch"]
        ),
        (&json!(1), &json!(1), &json!(1))
    );
    assert_eq!((&doc["drift"], &doc["in_step"]), (&json!(3), &json!(1)));
    let f = &doc["findings"];
    assert_eq!(f[0]["row"], anne);
    assert_eq!(f[1]["row"], bob_row);
    assert_eq!(f[1]["condition"], cond("2030-01-01T00:00:00Z"));
    assert_eq!(f[1]["openfga_condition"], cond("2020-01-01T00:00:00Z"));
    assert_eq!(f[2]["row"], carl_deleted);

    let text = reconcile(&env, &[]);
    expect_code(&text, 1, "drift, text");
    for needle in [
        "missing     document:1#viewer@user:anne",
        "unexpected  document:3#viewer@user:carl",
        "condition   document:2#viewer@user:bob",
        "drift: 3 tuple(s)",
    ] {
        assert!(text.stdout.contains(needle), "{needle}:\n{}", text.stdout);
    }

    // Repair: two rows, deletes before writes, marked as reconcile's own.
    let repaired = reconcile(&env, &["--repair", "--json"]);
    expect_code(&repaired, 1, "--repair still reports the drift it found");
    let r = &repaired.json()["repair"];
    assert_eq!((&r["rows"], &r["operations"]), (&json!(2), &json!(4)));
    assert_eq!(r["left_alone"], 0);
    let client = env.db.connect().await;
    let rows: Vec<(i64, Value)> = client
        .query(
            "SELECT id, payload FROM fga_outbox WHERE payload->>'source' = 'fga-relay reconcile' \
             ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(r["first_id"], rows[0].0);
    assert_eq!(r["last_id"], rows[1].0);
    assert_eq!(
        rows[0].1["deletes"],
        json!([
            tk("user:bob", "viewer", "document:2"),
            tk("user:carl", "viewer", "document:3")
        ])
    );
    assert!(rows[0].1.get("writes").is_none());
    let mut bob = tk("user:bob", "viewer", "document:2");
    bob["condition"] = cond("2030-01-01T00:00:00Z");
    assert_eq!(
        rows[1].1["writes"],
        json!([tk("user:anne", "viewer", "document:1"), bob])
    );

    // Before the relay delivers them, the corrected tuples are pending, not drift.
    let waiting = reconcile(&env, &["--json"]);
    expect_code(&waiting, 0, "corrections pending");
    assert_eq!(waiting.json()["pending"], 3);

    drain(&env);
    let after = reconcile(&env, &["--json"]);
    expect_code(&after, 0, "after the repair was delivered");
    assert_eq!(after.json()["in_step"], 4);
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
    assert!(!env.fga.has("user:carl", "viewer", "document:3"));
    assert_eq!(
        env.fga.condition_of("user:bob", "viewer", "document:2"),
        Some(cond("2030-01-01T00:00:00Z"))
    );
}

/// A tuple whose last operation waits in a pending row, or sits in a dead one, is reported as
/// such: OpenFGA cannot be expected to hold it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_and_dead_rows_are_reported_as_such_not_as_drift() {
    let env = Env::start().await;
    env.insert(writes(&[tk("user:gus", "viewer", "document:7")]))
        .await;
    drain(&env);
    // Pending: a new tuple, and a delete of a tuple OpenFGA holds.
    env.insert(writes(&[tk("user:fay", "viewer", "document:6")]))
        .await;
    env.insert(deletes(&[tk("user:gus", "viewer", "document:7")]))
        .await;
    // Dead.
    let dead = env
        .insert(writes(&[tk("user:eve", "viewer", "document:5")]))
        .await;
    let client = env.db.connect().await;
    client
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'test' WHERE id = $1",
            &[&dead],
        )
        .await
        .unwrap();
    // A row that is not even a payload: dead, and no tuple of anybody's.
    let garbage = env.insert(json!(["not", "a", "payload"])).await;
    client
        .execute(
            "UPDATE fga_outbox SET failed_at = now() WHERE id = $1",
            &[&garbage],
        )
        .await
        .unwrap();

    let o = reconcile(&env, &["--json"]);
    expect_code(&o, 0, "pending and dead rows only");
    let doc = o.json();
    assert_eq!((&doc["pending"], &doc["dead"]), (&json!(2), &json!(1)));
    assert_eq!((&doc["tuples"], &doc["drift"]), (&json!(3), &json!(0)));
    assert_eq!(o.findings(), ["dead document:5#viewer@user:eve"]);
    assert_eq!(doc["findings"][0]["row"], dead);
    let text = reconcile(&env, &[]);
    expect_code(&text, 0, "text");
    assert!(
        text.stdout
            .contains("not compared: 2 in pending rows, 1 in dead rows"),
        "{}",
        text.stdout
    );
}

/// `--since` checks only the tuples of recent rows (read one by one); the whole check finds the
/// older drift too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_checks_only_the_tuples_of_recent_rows() {
    let env = Env::start().await;
    let old = env
        .insert(writes(&[tk("user:old", "viewer", "document:1")]))
        .await;
    env.insert(writes(&[tk("user:new", "viewer", "document:1")]))
        .await;
    drain(&env);
    env.db
        .connect()
        .await
        .execute(
            "UPDATE fga_outbox SET created_at = now() - interval '2 hours' WHERE id = $1",
            &[&old],
        )
        .await
        .unwrap();
    env.fga.remove_tuple("user:old", "viewer", "document:1");
    env.fga.remove_tuple("user:new", "viewer", "document:1");

    let recent = reconcile(&env, &["--since", "1h", "--json"]);
    expect_code(&recent, 1, "--since 1h");
    assert_eq!(recent.findings(), ["missing document:1#viewer@user:new"]);
    let doc = recent.json();
    assert_eq!(doc["tuples"], 1);
    assert_eq!(doc["rows"]["from"], old + 1);
    assert_eq!(doc["not_in_outbox"], Value::Null);
    // The same through the whole store.
    let store = reconcile(&env, &["--since", "1h", "--read-by", "store", "--json"]);
    expect_code(&store, 1, "--since 1h --read-by store");
    assert_eq!(store.findings(), recent.findings());

    let whole = reconcile(&env, &["--json"]);
    expect_code(&whole, 1, "the whole outbox");
    assert_eq!(
        whole.findings(),
        [
            "missing document:1#viewer@user:new",
            "missing document:1#viewer@user:old"
        ]
    );
    // Nothing recent at all: nothing to check.
    let none = reconcile(&env, &["--since", "1ms", "--json"]);
    expect_code(&none, 0, "--since 1ms");
    assert_eq!(none.json()["tuples"], 0);
}

/// A dead grant retried after a later revoke of its tuple was delivered (the relay skips the
/// grant as superseded and marks the row delivered, now), and a dead grant marked delivered by
/// hand over its dead letter: both rows are delivered after the revokes, out of id order. Prune
/// takes rows by age, so it would delete the revokes and keep the grants, which `reconcile`
/// would then read as the tuples' last operations (missing), and `--repair` would grant again
/// what was revoked. Prune keeps every row from the first such row up, until that row is old
/// enough to go itself; the rows below it go as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_keeps_the_rows_a_retried_row_was_skipped_for_so_repair_revives_no_revoked_grant() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let age = |id| age(&admin, id);
    let count = || count(&admin);
    let prune = || prune(&env);
    let carl = env
        .insert(writes(&[tk("user:carl", "viewer", "document:3")]))
        .await;
    let anne = || tk("user:anne", "viewer", "document:1");
    let bob = || tk("user:bob", "viewer", "document:2");
    let anne_grant = env.insert(writes(&[anne()])).await;
    let bob_grant = env.insert(writes(&[bob()])).await;
    admin
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'rejected' \
             WHERE id = ANY($1)",
            &[&vec![anne_grant, bob_grant]],
        )
        .await
        .unwrap();
    let anne_revoke = env.insert(deletes(&[anne()])).await;
    let bob_revoke = env.insert(deletes(&[bob()])).await;
    drain(&env);
    assert_success(
        &env.command(&["retry", &anne_grant.to_string()])
            .output()
            .unwrap(),
        "retry",
    );
    drain(&env);
    let retried = env.row(anne_grant).await;
    assert!(
        retried.delivered
            && retried
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("superseded")),
        "the retried grant is skipped and marked delivered: {retried:?}"
    );
    admin
        .execute(
            "UPDATE fga_outbox SET processed_at = now() WHERE id = $1",
            &[&bob_grant],
        )
        .await
        .unwrap();
    for id in [carl, anne_revoke, bob_revoke] {
        age(id).await;
    }

    let out = prune();
    let o = reconcile(&env, &["--repair", "--json"]);
    drain(&env);
    for (user, object) in [("user:anne", "document:1"), ("user:bob", "document:2")] {
        assert!(
            !env.fga.has(user, "viewer", object),
            "reconcile --repair granted {user} again; prune said:\n{out}\nreconcile said:\n{}",
            o.stdout
        );
    }
    expect_code(&o, 0, "after prune");
    assert_eq!(o.json()["drift"], 0, "{}", o.stdout);
    assert!(
        out.contains("1 delivered row(s) deleted")
            && out.contains(&format!("kept its store's rows from id {anne_grant} up")),
        "{out}"
    );
    assert_eq!(count().await, 4, "only the row below the retried one goes");

    // Once the grants are as old as the revokes, all of them go.
    age(anne_grant).await;
    age(bob_grant).await;
    let out = prune();
    assert!(
        out.contains("4 delivered row(s) deleted") && !out.contains("kept"),
        "{out}"
    );
    assert_eq!(count().await, 0);
}

/// A dead grant, then a revoke of its tuple delivered and gone old: `retry` of the grant must
/// find the revoke to skip the grant as superseded, so prune keeps it (and only the rows on the
/// dead rows' tuples: an unrelated old row goes), and says so. Also across the two spellings of
/// the configured store: a dead row naming none, a revoke naming the configured id. Once the
/// grants are retried (and skipped), their revokes are held by the retried rows' rule instead,
/// and nothing is granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_keeps_the_rows_on_a_dead_rows_tuples_so_retry_revives_no_revoked_grant() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let anne = || tk("user:anne", "viewer", "document:1");
    let bob = || tk("user:bob", "viewer", "document:2");
    let anne_grant = env.insert(writes(&[anne()])).await;
    let bob_grant = env.insert(writes(&[bob()])).await;
    admin
        .execute(
            // Dead since before the revokes were delivered, as it would be: a later row on
            // a tuple is sent only once the row before it is delivered or dead.
            "UPDATE fga_outbox SET failed_at = now() - interval '101 days', \
             last_error = 'rejected' WHERE id = ANY($1)",
            &[&vec![anne_grant, bob_grant]],
        )
        .await
        .unwrap();
    let anne_revoke = env.insert(deletes(&[anne()])).await;
    let mut bob_revoke = deletes(&[bob()]);
    bob_revoke["store_id"] = json!(env.fga.store_id());
    let bob_revoke = env.insert(bob_revoke).await;
    let carl = env
        .insert(writes(&[tk("user:carl", "viewer", "document:3")]))
        .await;
    drain(&env);
    for id in [anne_revoke, bob_revoke, carl] {
        age(&admin, id).await;
    }
    // More old rows than one batch of prune holds, after the kept ones: the batches go on past
    // them.
    admin
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) \
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                        'user', 'user:u' || g, 'relation', 'viewer', 'object', 'document:1'))), \
                    now() - interval '100 days' \
             FROM generate_series(1, 1500) g",
            &[],
        )
        .await
        .unwrap();

    let out = prune(&env);
    assert!(
        out.contains("1501 delivered row(s) deleted")
            && out.contains(&format!(
                "kept 2 delivered row(s) older than --older-than on the tuples of dead rows \
                 below them (the lowest: row {anne_grant})"
            )),
        "{out}"
    );
    assert_eq!(
        count(&admin).await,
        4,
        "the unrelated row goes, the revokes stay"
    );

    let retry = env.command(&["retry", "--dead"]).output().unwrap();
    assert_success(&retry, "retry");
    drain(&env);
    for (user, object, id) in [
        ("user:anne", "document:1", anne_grant),
        ("user:bob", "document:2", bob_grant),
    ] {
        let row = env.row(id).await;
        assert!(
            !env.fga.has(user, "viewer", object),
            "the retried grant of {user} was replayed over its revoke; prune said:\n{out}\n\
             the row: {row:?}"
        );
        assert!(row.delivered, "{row:?}");
    }
}

/// A delivered row kept for a dead row's tuple must not outlive a later row on
/// another of its tuples. A dead grant of bob; then a row granting anne and bob (held: the dead
/// row is below it on bob's tuple); then a revoke of anne. All old. Prune keeps the middle row
/// for the dead one and deletes the revoke (no dead row touches anne's tuple): `reconcile` then
/// reads the middle row's grant as anne's last operation and `--repair` grants anne again,
/// though the revoke came later in id order. Without a retry or anything by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_no_later_row_on_a_kept_rows_tuples() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let anne = || tk("user:anne", "viewer", "document:1");
    let bob = || tk("user:bob", "viewer", "document:2");
    let dead = env.insert(writes(&[bob()])).await;
    admin
        .execute(
            "UPDATE fga_outbox SET failed_at = now() - interval '101 days', \
             last_error = 'rejected' WHERE id = $1",
            &[&dead],
        )
        .await
        .unwrap();
    let both = env.insert(writes(&[anne(), bob()])).await;
    // More old rows than a batch of prune between: the revoke is in a later batch than the row
    // kept for the dead one.
    admin
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) \
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                        'user', 'user:u' || g, 'relation', 'viewer', 'object', 'document:9'))), \
                    now() - interval '100 days' \
             FROM generate_series(1, 1500) g",
            &[],
        )
        .await
        .unwrap();
    let anne_revoke = env.insert(deletes(&[anne()])).await;
    drain(&env);
    assert!(!env.fga.has("user:anne", "viewer", "document:1"));
    for id in [both, anne_revoke] {
        age(&admin, id).await;
    }
    let out = prune(&env);
    let o = reconcile(&env, &["--repair", "--json"]);
    drain(&env);
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "reconcile --repair granted anne again; prune said:\n{out}\nreconcile said:\n{}\nrows left: {}",
        o.stdout,
        count(&admin).await
    );
}

/// `prune --store` takes one spelling of the configured store: `--store none`
/// deletes the rows naming no store and keeps those naming the configured id, though they are one
/// store for the relay and for `reconcile`. A grant naming the configured id, then a revoke
/// naming none, both old: `prune --store none` deletes the revoke alone, `reconcile` reads the
/// grant as the tuple's last operation, and `--repair` grants it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_store_none_keeps_no_grant_naming_the_configured_id_below_its_revoke() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let anne = || tk("user:anne", "viewer", "document:1");
    let mut grant = writes(&[anne()]);
    grant["store_id"] = json!(env.fga.store_id());
    let grant = env.insert(grant).await;
    let revoke = env.insert(deletes(&[anne()])).await;
    drain(&env);
    assert!(!env.fga.has("user:anne", "viewer", "document:1"));
    for id in [grant, revoke] {
        age(&admin, id).await;
    }
    let out = env
        .command(&["prune", "--older-than", "90d", "--store", "none"])
        .output()
        .unwrap();
    assert_success(&out, "prune --store none");
    let o = reconcile(&env, &["--repair", "--json"]);
    drain(&env);
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "reconcile --repair granted anne again; prune said:\n{}\nreconcile said:\n{}",
        String::from_utf8_lossy(&out.stdout),
        o.stdout
    );
}

/// The runbook's way with a malformed dead row ("fix the writer, then fix or replace the row ...
/// then retry"). A grant dead for a malformed payload (its object left out), then a revoke of
/// the tuple it meant, delivered and old: which tuple the dead row meant is not known, so prune
/// keeps its whole store above it; once the row is corrected in place and retried, the relay
/// finds the revoke and skips the grant. Read as touching no tuple, the revoke went and the
/// revoked tuple was granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrected_malformed_dead_row_finds_its_revoke_after_prune() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let anne = || tk("user:anne", "viewer", "document:1");
    let dead = admin
        .query_one(
            "INSERT INTO fga_outbox (payload, failed_at, last_error) VALUES \
             ('{\"writes\": [{\"user\": \"user:anne\", \"relation\": \"viewer\"}]}', \
              now() - interval '101 days', 'malformed payload: test') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    let revoke = env.insert(deletes(&[anne()])).await;
    drain(&env);
    age(&admin, revoke).await;
    let out = prune(&env);
    admin
        .execute(
            "UPDATE fga_outbox SET payload = $2 WHERE id = $1",
            &[&dead, &writes(&[anne()])],
        )
        .await
        .unwrap();
    let retry = env.command(&["retry", &dead.to_string()]).output().unwrap();
    assert_success(&retry, "retry");
    drain(&env);
    assert!(
        !env.fga.has("user:anne", "viewer", "document:1"),
        "the corrected grant was replayed over its revoke; prune said:\n{out}\nrow: {:?}",
        env.row(dead).await
    );
}

/// The dead rows prune keeps rows for, at their edges: one retried long ago and dead again since
/// (it died first before the cutoff: the revoke after it was delivered then), and, with the
/// configured store not given, one naming the configured store's id above a revoke naming none
/// (the same store, for all prune can tell). Both revokes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_keeps_the_rows_on_a_tuple_of_a_row_dead_again_or_of_either_spelling() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let carol = || tk("user:carol", "viewer", "document:1");
    let dave = || tk("user:dave", "viewer", "document:2");
    let mut dave_grant = writes(&[dave()]);
    dave_grant["store_id"] = json!(env.fga.store_id());
    for (grant, failed, retried) in [
        (writes(&[carol()]), "0 days", Some("101 days")),
        (dave_grant, "101 days", None),
    ] {
        admin
            .execute(
                "INSERT INTO fga_outbox (payload, failed_at, retried_at, last_error) VALUES \
                 ($1, now() - $2::text::interval, now() - $3::text::interval, 'rejected')",
                &[&grant, &failed, &retried],
            )
            .await
            .unwrap();
    }
    let revokes = [
        env.insert(deletes(&[carol()])).await,
        env.insert(deletes(&[dave()])).await,
    ];
    drain(&env);
    for id in revokes {
        age(&admin, id).await;
    }
    let out = env
        .command(&["prune", "--older-than", "90d"])
        .env_remove("FGA_STORE_ID")
        .output()
        .unwrap();
    assert_success(&out, "prune");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("0 delivered row(s) deleted") && said.contains("kept 2 delivered row(s)"),
        "{said}"
    );
    assert_eq!(count(&admin).await, 4);
}

/// `FGA_STORE_ID` set but empty is unset, as for every setting: prune then keeps the rows naming
/// no store above a retried row of any store (they may be that store's, if it is the configured
/// one). Taken as a store id '' instead, they were their own store and went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_takes_an_empty_store_id_as_unset() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let retried = admin
        .query_one(
            "INSERT INTO fga_outbox (payload, retried_at) VALUES ($1, now()) RETURNING id",
            &[&json!({"store_id": env.fga.store_id(), "writes": [
                tk("user:anne", "viewer", "document:1")]})],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    let unnamed = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    admin
        .execute(
            "UPDATE fga_outbox SET processed_at = now() - interval '100 days' WHERE id = $1",
            &[&unnamed],
        )
        .await
        .unwrap();
    let out = env
        .command(&["prune", "--older-than", "90d"])
        .env("FGA_STORE_ID", "")
        .output()
        .unwrap();
    assert_success(&out, "prune");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("0 delivered row(s) deleted")
            && said.contains(&format!("kept its store's rows from id {retried} up")),
        "{said}"
    );
    assert_eq!(count(&admin).await, 2);
}

/// Tuples the application wrote to OpenFGA directly are not the outbox's to judge: counted, and
/// listed with `--all`, but not drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuples_the_outbox_never_mentions_are_counted_and_listed_with_all() {
    let env = Env::start().await;
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    drain(&env);
    env.fga
        .insert_tuple(StoredTuple::new("user:zed", "owner", "document:9"));

    let o = reconcile(&env, &["--json"]);
    expect_code(&o, 0, "a tuple of the application's own");
    assert_eq!(o.json()["not_in_outbox"], 1);
    assert_eq!(o.findings(), Vec::<String>::new());
    let text = reconcile(&env, &[]);
    assert!(
        text.stdout
            .contains("OpenFGA holds 1 other tuple(s) the outbox does not mention"),
        "{}",
        text.stdout
    );
    let all = reconcile(&env, &["--all", "--json"]);
    expect_code(&all, 0, "--all");
    assert_eq!(all.findings(), ["unknown document:9#owner@user:zed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_2() {
    let env = Env::start().await;
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let bad = reconcile(&env, &["--since", "soon"]);
    expect_code(&bad, 2, "a bad --since");
    assert!(bad.stderr.contains("--since"), "{}", bad.stderr);
    let bad = reconcile(&env, &["--all", "--read-by", "tuple"]);
    expect_code(&bad, 2, "--all without the whole store");

    env.fga.set_refusing(true);
    let down = reconcile(&env, &[]);
    expect_code(&down, 2, "OpenFGA unreachable");
    assert!(
        down.stderr.contains("cannot reach OpenFGA"),
        "{}",
        down.stderr
    );
    assert_eq!(down.stdout, "", "no report when nothing could be compared");
    env.fga.set_refusing(false);

    let mut c = env.command(&["reconcile"]);
    c.env(
        "DATABASE_URL",
        "host=/nonexistent user=nobody dbname=nothing",
    );
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "PostgreSQL unreachable");
}

/// A row still being inserted when the check starts (its id below rows already committed) is
/// waited for, not missed; a tuple that a row arriving during the check touches is reported as
/// changed, not judged against a stale expectation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_in_flight_are_waited_for_and_tuples_changed_meanwhile_are_not_judged() {
    let env = Env::start().await;
    env.insert(writes(&[tk("user:yan", "viewer", "document:1")]))
        .await;
    drain(&env);
    // A writer's transaction takes an id and stays open; a later row commits first.
    let mut writer = env.db.connect().await;
    let tx = writer.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO fga_outbox (payload) VALUES ($1)",
        &[&writes(&[tk("user:xia", "viewer", "document:2")])],
    )
    .await
    .unwrap();
    env.insert(writes(&[tk("user:zoe", "viewer", "document:3")]))
        .await;

    let mut child = env
        .command(&["reconcile", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Until reconcile is waiting for that transaction.
    let watcher = env.db.connect().await;
    crate::common::relay::wait_until(
        crate::common::pg::PROMPTLY,
        "reconcile waits for the open transaction",
        || async {
            crate::common::pg::count(
                &watcher,
                "SELECT count(*) FROM pg_stat_activity \
                     WHERE application_name = 'fga-relay reconcile' AND query LIKE '%virtualxid%'",
                &[],
            )
            .await
                > 0
        },
    )
    .await;
    // Meanwhile the application revokes yan's access: a row after the check's line.
    env.insert(deletes(&[tk("user:yan", "viewer", "document:1")]))
        .await;
    drain(&env);
    assert!(
        child.try_wait().unwrap().is_none(),
        "reconcile went on without the open transaction's row"
    );
    tx.commit().await.unwrap();

    let o = Outcome::from(child.wait_with_output().unwrap());
    expect_code(&o, 0, "nothing to judge");
    let doc = o.json();
    // xia (the late row, still pending), zoe (delivered by that drain: in step), yan (changed
    // while checking).
    assert_eq!(doc["tuples"], 3, "the late row was counted:\n{}", o.stdout);
    assert_eq!(
        (&doc["pending"], &doc["in_step"], &doc["changed"]),
        (&json!(1), &json!(1), &json!(1))
    );
    assert_eq!(doc["drift"], 0);
}

/// One `reconcile --json`, timed, with the peak resident memory it logged (`VmHWM`: that of
/// its own program only; `wait4`'s `ru_maxrss` would count the test process too, whose address
/// space the child had until `exec`).
fn measured(env: &Env) -> (Outcome, Duration, u64) {
    let started = Instant::now();
    let o = reconcile(env, &["--json"]);
    let elapsed = started.elapsed();
    let peak = o
        .stderr
        .split("peak_rss_kib=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak_rss_kib in the log:\n{}", o.stderr));
    (o, elapsed, peak)
}

/// Rows `from..=through`, delivered, one tuple each: row `i` writes tuple `i` when `i` is a
/// multiple of ten (and the tuple is put in OpenFGA), and deletes it otherwise (a revoke whose
/// grant was pruned long ago). So the outbox speaks of as many tuples as it has rows, and OpenFGA
/// holds a tenth of them: reconcile pages through the store with OpenFGA's Read, 100 tuples a
/// request, which a test can afford for 10,000 tuples, not for 100,000.
async fn delivered_rows(env: &Env, from: i64, through: i64) {
    env.db
        .connect()
        .await
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) \
             SELECT jsonb_build_object(CASE WHEN i % 10 = 0 THEN 'writes' ELSE 'deletes' END, \
                 jsonb_build_array(jsonb_build_object( \
                     'user', 'user:u' || i, 'relation', 'viewer', 'object', 'document:d' || i))), \
                 now() \
             FROM generate_series($1::bigint, $2::bigint) AS i",
            &[&from, &through],
        )
        .await
        .unwrap();
    for i in (from..=through).filter(|i| i % 10 == 0) {
        env.fga.insert_tuple(StoredTuple::new(
            &format!("user:u{i}"),
            "viewer",
            &format!("document:d{i}"),
        ));
    }
}

/// 100,000 delivered rows reconcile with the memory 1,000 take: the relay holds pages, not the
/// outbox. Measured, not trusted: the peak resident memory of the process, both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_outbox_reconciles_in_bounded_memory() {
    const SMALL: i64 = 1_000;
    const LARGE: i64 = 100_000;
    let env = Env::with_fga(Fga::start()).await;
    delivered_rows(&env, 1, SMALL).await;
    let (small, small_time, small_peak) = measured(&env);
    expect_code(&small, 0, "1,000 rows");
    assert_eq!(small.json()["in_step"], SMALL);

    delivered_rows(&env, SMALL + 1, LARGE).await;
    // Drift far apart, so that the large check has something to find: two tuples missing, one
    // present that was revoked.
    env.fga.remove_tuple("user:u70", "viewer", "document:d70");
    env.fga
        .remove_tuple("user:u99990", "viewer", "document:d99990");
    env.fga
        .insert_tuple(StoredTuple::new("user:u50001", "viewer", "document:d50001"));
    let (large, large_time, large_peak) = measured(&env);
    expect_code(&large, 1, "100,000 rows, three tuples drifted");
    let doc = large.json();
    assert_eq!(doc["tuples"], LARGE);
    assert_eq!(doc["in_step"], LARGE - 3);
    assert_eq!(
        large.findings(),
        [
            "unexpected document:d50001#viewer@user:u50001",
            "missing document:d70#viewer@user:u70",
            "missing document:d99990#viewer@user:u99990"
        ]
    );
    eprintln!(
        "reconcile of {SMALL} rows: {small_time:?}, peak RSS {small_peak} KiB; \
         of {LARGE} rows: {large_time:?}, peak RSS {large_peak} KiB"
    );
    // Holding the 100,000 expected tuples in memory would take over 10 MiB more (three
    // strings each, in a map); pages of a thousand take a few hundred KiB.
    assert!(
        large_peak < small_peak + 4 * 1024,
        "peak RSS grew from {small_peak} KiB (1,000 rows) to {large_peak} KiB (100,000 rows)"
    );
}

/// A row whose condition context holds what jsonb takes but JSON cannot (a number beyond a
/// double) never crashes the check: it ends with an error (exit status 2) that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_context_beyond_json_ends_the_check_with_an_error_not_a_panic() {
    let env = Env::start().await;
    let client = env.db.connect().await;
    crate::common::relay::insert_text(
        &client,
        r#"{"writes": [{"user": "user:big", "relation": "viewer", "object": "document:big",
            "condition": {"name": "non_expired", "context": {"expires_at": 1e400}}}]}"#,
    )
    .await
    .unwrap();
    drain(&env);
    let o = reconcile(&env, &["--json"]);
    expect_code(&o, 2, "reconcile over an undecodable condition");
    assert!(o.stderr.contains("cannot compare"), "{}", o.stderr);
}

/// `--repair` behind another session's lock on the table (an operator's `LOCK ... IN SHARE
/// MODE`, which reads pass and the repair's lock does not) gives up after its own 5 s, exits 2
/// naming the session that held the lock and what to do, and enqueues nothing. It said "writers
/// kept it busy", whoever held the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_behind_a_table_lock_exits_naming_the_holder_and_enqueues_nothing() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    drain(&env);
    assert!(env.fga.remove_tuple("user:anne", "viewer", "document:1"));
    let before = count(&admin).await;
    let holder = env.db.connect().await;
    holder
        .batch_execute("SET application_name = 'maintenance'; BEGIN; LOCK fga_outbox IN SHARE MODE")
        .await
        .unwrap();
    let pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let o = reconcile(&env, &["--repair"]);
    expect_code(&o, 2, "a repair behind a lock");
    assert!(
        o.stderr.contains(&format!(
            "reconcile: waited 5s for a lock on fga_outbox held by session pid {pid} \
             (maintenance, idle in transaction since"
        )) && o.stderr.contains("run reconcile again"),
        "{}",
        o.stderr
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(count(&admin).await, before, "nothing enqueued");
}
