//! The commands around the daemon: migrate, sql, drain, status, retry, prune.

use crate::common::pg::{PROMPTLY, PgOptions, TestDb, count};
use crate::common::relay::{BIN, Env, assert_success, tk, wait_until, writes};
use std::process::Command;
use std::time::Duration;

/// The table as an application creates it before it has ever heard of the relay, with rows.
const APP_DDL: &str = "CREATE TABLE fga_outbox (
    id bigserial PRIMARY KEY,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    last_error text);
  CREATE INDEX fga_outbox_pending_idx ON fga_outbox (id) WHERE processed_at IS NULL;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adopts_an_existing_table_keeps_its_rows_and_they_are_delivered() {
    let db = TestDb::start();
    let client = db.connect().await;
    client.batch_execute(APP_DDL).await.unwrap();
    for i in 0..10 {
        client
            .execute(
                "INSERT INTO fga_outbox (payload) VALUES ($1)",
                &[&writes(&[tk(
                    &format!("user:u{i}"),
                    "viewer",
                    "document:1",
                )])],
            )
            .await
            .unwrap();
    }
    client
        .execute(
            "INSERT INTO fga_outbox (payload, processed_at) VALUES ($1, now())",
            &[&writes(&[tk("user:old", "viewer", "document:1")])],
        )
        .await
        .unwrap();
    let fga = crate::common::fga::Fga::start();
    // Env::with_fga runs migrate on a fresh database; here the database already has the table.
    let env = Env { db, fga };
    // Twice, and two at once: idempotent and safe concurrently.
    let quiet = |mut c: Command| c.stderr(std::process::Stdio::null()).spawn().unwrap();
    let a = quiet(env.command(&["migrate"]));
    let b = quiet(env.command(&["migrate"]));
    for mut child in [a, b] {
        assert!(child.wait().unwrap().success());
    }
    assert_success(
        &env.command(&["migrate"]).output().unwrap(),
        "third migrate",
    );
    let count: i64 = client
        .query_one("SELECT count(*) FROM fga_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 11, "every row kept");
    assert_success(
        &env.command(&["drain", "--timeout", "20s"])
            .output()
            .unwrap(),
        "drain",
    );
    assert_eq!(
        env.fga.tuples().len(),
        10,
        "the pending rows, and not the delivered one"
    );
    assert!(!env.fga.has("user:old", "viewer", "document:1"));
}

/// Delivered rows leave entries in the claim index that every pass walks until VACUUM removes
/// them, so `migrate` has the table vacuumed after 1% of its rows plus 10,000 changed, where
/// PostgreSQL's default waits for a fifth: of two tables of 200,000 rows with 20,000 rows
/// changed, autovacuum clears the outbox and leaves a copy of it without the settings alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_has_the_table_vacuumed_in_step_with_deliveries() {
    let db = TestDb::start_with(PgOptions {
        settings: vec![("autovacuum_naptime".into(), "1s".into())],
        ..PgOptions::default()
    });
    let env = Env::with(db, crate::common::fga::Fga::start()).await;
    let client = env.db.connect().await;
    client
        .batch_execute(
            "INSERT INTO fga_outbox (payload, processed_at) \
             SELECT jsonb_build_object('writes', jsonb_build_array(jsonb_build_object( \
                 'user', 'user:u' || i, 'relation', 'viewer', 'object', 'document:d'))), \
                 CASE WHEN i > 20000 THEN now() END \
             FROM generate_series(1, 200000) i; \
             CREATE TABLE control AS SELECT * FROM fga_outbox",
        )
        .await
        .unwrap();
    let stat = |column: &'static str, table: &'static str| {
        let client = &client;
        async move {
            count(
                client,
                &format!("SELECT {column} FROM pg_stat_user_tables WHERE relname = '{table}'"),
                &[],
            )
            .await
        }
    };
    // The inserts must be counted before the VACUUM, or they would count as inserted since it
    // and have autovacuum run for them, with or without the settings.
    wait_until(PROMPTLY, "the inserts are in the statistics", || async {
        stat("n_tup_ins", "fga_outbox").await >= 200_000
            && stat("n_tup_ins", "control").await >= 200_000
    })
    .await;
    client
        .batch_execute("VACUUM ANALYZE fga_outbox, control")
        .await
        .unwrap();
    assert_eq!(stat("n_ins_since_vacuum", "fga_outbox").await, 0);
    assert_eq!(stat("n_ins_since_vacuum", "control").await, 0);
    // Read after the VACUUM: autovacuum may have come for the inserts before it.
    let before = stat("autovacuum_count", "fga_outbox").await;
    let control_before = stat("autovacuum_count", "control").await;
    // The copy's 20,000 changes first, counted before the outbox's: the autovacuum that clears
    // the outbox has looked at the copy too.
    client
        .batch_execute("UPDATE control SET processed_at = now() WHERE id <= 20000")
        .await
        .unwrap();
    wait_until(
        PROMPTLY,
        "the copy's changes are in the statistics",
        || async { stat("n_dead_tup", "control").await >= 20_000 },
    )
    .await;
    // 20,000 deliveries, as the relay marks them: a page at a time.
    for page in 0..200i64 {
        client
            .execute(
                "UPDATE fga_outbox SET processed_at = now() WHERE id > $1 AND id <= $1 + 100",
                &[&(page * 100)],
            )
            .await
            .unwrap();
    }
    wait_until(
        Duration::from_secs(60),
        "autovacuum clears the delivered rows' old versions",
        || async { stat("autovacuum_count", "fga_outbox").await > before },
    )
    .await;
    assert_eq!(
        stat("autovacuum_count", "control").await,
        control_before,
        "PostgreSQL's defaults vacuumed the copy too: the test shows nothing"
    );
}

/// An operator's own autovacuum setting on the table survives `migrate`, which then adds
/// neither of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_keeps_an_operators_own_autovacuum_setting() {
    let db = TestDb::start();
    let client = db.connect().await;
    client.batch_execute(APP_DDL).await.unwrap();
    client
        .batch_execute("ALTER TABLE fga_outbox SET (autovacuum_vacuum_scale_factor = 0.05)")
        .await
        .unwrap();
    let env = Env {
        db,
        fga: crate::common::fga::Fga::start(),
    };
    for _ in 0..2 {
        assert_success(&env.command(&["migrate"]).output().unwrap(), "migrate");
    }
    let options: Vec<String> = client
        .query_one(
            "SELECT reloptions FROM pg_class WHERE oid = 'fga_outbox'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(options, ["autovacuum_vacuum_scale_factor=0.05"]);
}

#[test]
fn sql_prints_the_schema_with_the_table_name() {
    let out = Command::new(BIN)
        .args(["sql", "--table", "acl_outbox"])
        .output()
        .unwrap();
    assert_success(&out, "fga-relay sql");
    let sql = String::from_utf8(out.stdout).unwrap();
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS acl_outbox"));
    assert!(sql.contains("pg_notify('acl_outbox', TG_RELID::text)"));
    assert!(!sql.contains("fga_outbox"));
}

/// `sql`'s output is what `migrate` runs: a user's own migration tool gets the same schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_sql_creates_a_schema_the_relay_accepts() {
    let db = TestDb::start();
    let out = Command::new(BIN).arg("sql").output().unwrap();
    let client = db.connect().await;
    client
        .batch_execute(&String::from_utf8(out.stdout).unwrap())
        .await
        .unwrap();
    let env = Env {
        db,
        fga: crate::common::fga::Fga::start(),
    };
    // Nothing left for `migrate` to do (the version is recorded too).
    assert_success(
        &env.command(&["migrate", "--check"]).output().unwrap(),
        "migrate --check",
    );
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    assert_success(
        &env.command(&["drain", "--timeout", "20s"])
            .output()
            .unwrap(),
        "drain",
    );
    assert!(env.fga.has("user:anne", "viewer", "document:1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_exits_1_when_rows_are_still_pending_at_its_timeout() {
    let env = Env::start().await;
    env.fga.set_refusing(true);
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let out = env.command(&["drain", "--timeout", "2s"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = env.row(id).await;
    assert!(
        !row.delivered && !row.dead,
        "an outage dead-letters nothing: {row:?}"
    );
    assert!(
        row.attempts >= 1,
        "the failed attempts are recorded: {row:?}"
    );
    assert!(row.last_error.is_some());
    env.fga.set_refusing(false);
    assert_success(
        &env.command(&["drain", "--timeout", "20s"])
            .output()
            .unwrap(),
        "drain after",
    );
    assert!(env.row(id).await.delivered);
}

/// A drain that dead-lettered a row says so apart from the rows it delivered, names the row
/// with its error and the command that lists and retries dead rows, and exits 3 (a deploy gate
/// must not read it as delivered); `--allow-dead` exits 0. Rows dead before it started are not
/// its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_reports_dead_rows_apart_and_exits_3_unless_allowed() {
    let env = Env::start().await;
    let old = env.insert(serde_json::json!({"writes": "old"})).await;
    env.db
        .connect()
        .await
        .execute(
            "UPDATE fga_outbox SET failed_at = now() WHERE id = $1",
            &[&old],
        )
        .await
        .unwrap();
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let dead = env.insert(serde_json::json!({"writes": "nope"})).await;
    let out = env
        .command(&["drain", "--timeout", "20s"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("delivered 1, dead 1, still pending 0"),
        "{stdout}"
    );
    let reason = env.row(dead).await.last_error.unwrap();
    assert!(
        stdout.contains(&format!("dead row {dead}: {reason}")),
        "{stdout}"
    );
    assert!(!stdout.contains(&format!("dead row {old}:")), "{stdout}");
    assert!(stdout.contains("fga-relay retry --dead"), "{stdout}");
    assert!(stderr.contains("1 row(s) dead-lettered"), "{stderr}");

    env.insert(writes(&[tk("user:bob", "viewer", "document:1")]))
        .await;
    env.insert(serde_json::json!({"writes": "nope"})).await;
    let out = env
        .command(&["drain", "--timeout", "20s", "--allow-dead"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("delivered 1, dead 1, still pending 0"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_retry_and_prune() {
    let env = Env::start().await;
    let delivered = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let dead = env.insert(serde_json::json!({"writes": "nope"})).await;
    assert_success(
        &env.command(&["drain", "--timeout", "20s", "--allow-dead"])
            .output()
            .unwrap(),
        "drain",
    );
    env.insert(writes(&[tk("user:bob", "viewer", "document:1")]))
        .await;

    let status = || async {
        let out = env.command(&["status", "--json"]).output().unwrap();
        assert_success(&out, "status");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let s = status().await;
    assert_eq!(s["pending"], 1);
    assert_eq!(s["dead"], 1);
    assert_eq!(s["delivered"], 1);
    assert!(s["oldest_pending_age_seconds"].as_f64().unwrap() >= 0.0);
    assert!(
        s["last_vacuum_age_seconds"].is_null(),
        "never vacuumed: {s}"
    );
    // The delivered and the dead-lettered row each left an old version (the drain's sessions
    // report their statistics as they end).
    wait_until(PROMPTLY, "status counts the old row versions", || async {
        status().await["dead_row_versions"].as_i64() >= Some(2)
    })
    .await;
    env.db
        .connect()
        .await
        .batch_execute("VACUUM fga_outbox")
        .await
        .unwrap();
    let s = status().await;
    assert_eq!(s["dead_row_versions"], 0, "{s}");
    assert!(s["last_vacuum_age_seconds"].as_f64().unwrap() >= 0.0);

    // A dead row goes back to pending; a delivered one is left alone (exit 1: an id given was
    // left as it is).
    let out = env
        .command(&["retry", &dead.to_string(), &delivered.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        crate::common::relay::said(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 row(s)"));
    let row = env.row(dead).await;
    assert!(!row.dead && !row.delivered);

    // Prune only deletes delivered rows older than the cutoff.
    assert_success(
        &env.command(&["prune", "--older-than", "1h"])
            .output()
            .unwrap(),
        "prune 1h",
    );
    let client = env.db.connect().await;
    let n: i64 = client
        .query_one("SELECT count(*) FROM fga_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3);
    client
        .execute(
            "UPDATE fga_outbox SET processed_at = now() - interval '2 hours' WHERE id = $1",
            &[&delivered],
        )
        .await
        .unwrap();
    assert_success(
        &env.command(&["prune", "--older-than", "1h"])
            .output()
            .unwrap(),
        "prune 1h, the delivered row 2 hours old",
    );
    let n: i64 = client
        .query_one("SELECT count(*) FROM fga_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "the delivered row is gone; the pending ones stay");
    assert!(
        client
            .query_opt("SELECT 1 FROM fga_outbox WHERE id = $1", &[&delivered])
            .await
            .unwrap()
            .is_none()
    );

    let out = env.command(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pending    2"), "{text}");
    assert!(
        text.contains("old row versions awaiting vacuum: ") && text.contains("s ago)"),
        "{text}"
    );
}

/// `--help` of every command ends with an example of it, and lists the values a flag takes
/// where there are few (the log format, reconcile's --read-by).
#[test]
fn every_command_helps_with_an_example_and_possible_values() {
    let help = |args: &[&str]| -> String {
        let out = crate::common::relay::command(std::path::Path::new(BIN), args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for cmd in [
        "migrate",
        "sql",
        "run",
        "drain",
        "status",
        "retry",
        "prune",
        "reconcile",
    ] {
        let text = help(&[cmd, "--help"]);
        let example = text
            .split("Examples:")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd} --help has no example:\n{text}"));
        assert!(
            example.contains(&format!("fga-relay {cmd}")),
            "{cmd}'s example runs it:\n{text}"
        );
        assert!(
            text.contains("[possible values: text, json]"),
            "{cmd}: the log formats:\n{text}"
        );
    }
    assert!(help(&["reconcile", "--help"]).contains("[possible values: auto, store,"));
}

/// A reader that goes away (`fga-relay check | head -1`) ends every command quietly, as SIGPIPE
/// ends `cat`: status 141 (or 0 where clap prints), never a panic. stdout is a real pipe whose
/// reading end is closed before the command starts, so that its first write finds it closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_ends_quietly_when_its_reader_goes_away() {
    let env = Env::start().await;
    let dead = env.insert(serde_json::json!({"writes": "nope"})).await;
    let dead = dead.to_string();
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let commands: Vec<Vec<&str>> = vec![
        vec!["check"],
        vec!["sql"],
        vec!["sql", "--roles"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["drain", "--timeout", "20s"],
        vec!["retry", "--dead", "--dry-run"],
        vec!["retry", &dead],
        vec!["reconcile"],
        vec!["reconcile", "--json"],
        vec!["migrate", "--check"],
        vec!["migrate"],
        vec!["prune", "--older-than", "1h"],
        vec!["--help"],
        vec!["run", "--help"],
        vec!["--version"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = env
            .command(&args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("`fga-relay {}` ({}):\n{stderr}", args.join(" "), out.status);
        assert!(matches!(out.status.code(), Some(0 | 141)), "{what}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{what}"
        );
    }
}

/// `status` shows the newest dead rows with the error that killed each, and the commands that
/// list and retry them; `retry --dead --dry-run` shows every dead row's error, whatever the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_retry_dry_run_show_why_rows_are_dead() {
    let env = Env::start().await;
    let malformed = env.insert(serde_json::json!({"writes": "nope"})).await;
    let rejected = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    // A well-formed row OpenFGA refused, as the relay records it.
    env.db
        .connect()
        .await
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'OpenFGA refused it: test' \
             WHERE id = $1",
            &[&rejected],
        )
        .await
        .unwrap();
    let out = env
        .command(&["drain", "--timeout", "20s", "--allow-dead"])
        .output()
        .unwrap();
    assert_success(&out, "drain");
    let malformed_reason = env.row(malformed).await.last_error.unwrap();

    let out = env.command(&["status"]).output().unwrap();
    assert_success(&out, "status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("dead       2"), "{text}");
    assert!(
        text.contains(&format!("row {malformed}: {malformed_reason}"))
            && text.contains(&format!("row {rejected}: OpenFGA refused it: test")),
        "{text}"
    );
    assert!(
        text.contains("fga-relay retry --dead --dry-run")
            && text.contains("fga-relay retry --dead (or ID...)"),
        "{text}"
    );
    for kind in ["malformed payload", "OpenFGA refused it"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("1  ") && l.contains(kind)),
            "{kind} counted by reason:\n{text}"
        );
    }
    let out = env.command(&["status", "--json"]).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<i64> = doc["newest_dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{doc}");
    assert_eq!(doc["dead_by_reason"].as_array().unwrap().len(), 2, "{doc}");
    assert!(ids.contains(&malformed) && ids.contains(&rejected), "{doc}");

    let out = env
        .command(&["retry", "--dead", "--dry-run"])
        .output()
        .unwrap();
    assert_success(&out, "retry --dry-run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("row {malformed}: dead: {malformed_reason}"))
            && text.contains(&format!("row {rejected}: dead: OpenFGA refused it: test")),
        "{text}"
    );
}

/// A dead row an operator marked delivered by hand, leaving `failed_at` set, is delivered to every
/// count: `status` (text and `--json`), its reasons, `retry --dead --dry-run`, `retry` of its id,
/// and the relay's `fga_relay_dead_rows` agree that only the other dead row is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_row_marked_delivered_by_hand_counts_as_delivered_everywhere() {
    let env = Env::start().await;
    let fixed = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let dead = env
        .insert(writes(&[tk("user:bob", "viewer", "document:1")]))
        .await;
    let admin = env.db.connect().await;
    admin
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'OpenFGA refused it: test' \
             WHERE id = ANY($1)",
            &[&vec![fixed, dead]],
        )
        .await
        .unwrap();
    admin
        .execute(
            "UPDATE fga_outbox SET processed_at = now() WHERE id = $1",
            &[&fixed],
        )
        .await
        .unwrap();

    let out = env.command(&["status", "--json"]).output().unwrap();
    assert_success(&out, "status --json");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&doc["dead"], &doc["delivered"], &doc["pending"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!(0)
        ),
        "{doc}"
    );
    let by_reason: i64 = doc["dead_by_reason"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rows"].as_i64().unwrap())
        .sum();
    assert_eq!(by_reason, 1, "{doc}");
    let newest: Vec<i64> = doc["newest_dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(newest, [dead], "{doc}");
    let out = env.command(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("dead       1"), "{text}");

    let out = env
        .command(&["retry", "--dead", "--dry-run"])
        .output()
        .unwrap();
    assert_success(&out, "retry --dead --dry-run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("row {dead}: dead")) && !text.contains(&format!("row {fixed}:")),
        "{text}"
    );
    let out = env
        .command(&["retry", &fixed.to_string(), "--dry-run"])
        .output()
        .unwrap();
    let said = crate::common::relay::said(&out);
    assert!(said.contains("delivered, not dead"), "{said}");

    let (_relay, base) = env.spawn_relay_with_endpoint(&[]).await;
    let m = crate::common::metrics::scrape(&base).await;
    assert_eq!(m["fga_relay_dead_rows"], 1.0, "{m:?}");
}

/// `retry` says why it left each id it was given as it is: no such row, delivered, pending, or
/// dead but of another store than `--store`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_says_why_it_left_a_row_as_it_is() {
    let env = Env::start().await;
    let delivered = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let dead = env.insert(serde_json::json!({"writes": "nope"})).await;
    let out = env
        .command(&["drain", "--timeout", "20s", "--allow-dead"])
        .output()
        .unwrap();
    assert_success(&out, "drain");
    let pending = env
        .insert(writes(&[tk("user:bob", "viewer", "document:1")]))
        .await;
    let missing = pending + 1000;
    let ids = [missing, delivered, pending].map(|i| i.to_string());
    for dry_run in [true, false] {
        let mut args = vec!["retry"];
        if dry_run {
            args.push("--dry-run");
        }
        args.extend(ids.iter().map(String::as_str));
        let out = env.command(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            crate::common::relay::said(&out)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for expected in [
            format!("row {missing}: no such row; left as it is"),
            format!("row {delivered}: delivered, not dead; left as it is"),
            format!("row {pending}: pending, not dead"),
        ] {
            assert!(text.contains(&expected), "dry run {dry_run}: {text}");
        }
        assert!(!text.contains("of that store"), "{text}");
    }
    let other_store = env.fga.store_id().to_owned();
    let out = env
        .command(&["retry", "--store", &other_store, &dead.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        crate::common::relay::said(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "row {dead}: dead, but of no store (the relay's configured one), not of --store \
             {other_store}"
        )),
        "{text}"
    );
    assert!(env.row(dead).await.dead);
}

/// Usage lines show what a command takes, not the flags the environment happened to give as if
/// they were required: `retry` shows `--dead` and its ids, `check --storeid` shows no
/// `--store-id`.
#[test]
fn usage_lines_show_what_a_command_takes() {
    let env = [
        ("DATABASE_URL", "host=/nowhere"),
        ("FGA_STORE_ID", "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        ("FGA_API_URL", "http://localhost:1"),
    ];
    let usage = |args: &[&str]| -> String {
        let out = crate::common::relay::command(std::path::Path::new(BIN), args)
            .envs(env)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr
            .split("Usage: ")
            .nth(1)
            .unwrap_or_else(|| panic!("{args:?}: no usage in {stderr}"))
            .split("\n\n")
            .next()
            .unwrap()
            .to_owned()
    };
    let retry = usage(&["retry"]);
    assert!(
        retry.contains("fga-relay retry [OPTIONS] --dead") && retry.contains("<ID>..."),
        "{retry}"
    );
    assert_eq!(
        usage(&["check", "--storeid", "x"]),
        "fga-relay check [OPTIONS]"
    );
    for cmd in [
        "migrate",
        "check",
        "sql",
        "run",
        "drain",
        "status",
        "retry",
        "prune",
        "reconcile",
    ] {
        let line = usage(&[cmd, "--no-such-flag"]);
        assert!(
            line.starts_with(&format!("fga-relay {cmd} [OPTIONS]")),
            "{line}"
        );
        for given in ["--database-url", "--store-id", "--api-url"] {
            assert!(!line.contains(given), "{cmd}: {line}");
        }
    }
}

/// `migrate` says what it created or changed: every part on an empty database, the parts an
/// upgrade applies, a trigger put back, the columns an adopted table lacked; and that nothing
/// was left to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_says_what_it_created_or_changed() {
    let db = TestDb::start();
    let migrate = || {
        let out = crate::common::relay::command(std::path::Path::new(BIN), &["migrate"])
            .env("DATABASE_URL", db.url())
            .output()
            .unwrap();
        assert_success(&out, "migrate");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = migrate();
    assert!(
        out.contains("created table fga_outbox with every part of the schema (0001_outbox, ")
            && out.contains("0011_retried_index)"),
        "{out}"
    );
    let current = migrate();
    assert!(
        current.contains("schema is current (version 11): nothing to change"),
        "{current}"
    );
    let admin = db.connect().await;
    admin
        .batch_execute(
            "DROP TRIGGER fga_outbox_notify ON fga_outbox; \
             CREATE OR REPLACE FUNCTION fga_outbox_schema_version() RETURNS integer \
             LANGUAGE sql AS 'SELECT 7'",
        )
        .await
        .unwrap();
    let out = migrate();
    assert!(
        out.contains("installed the trigger fga_outbox_notify")
            && out.contains(
                "upgraded the schema from version 7 to 11: applied 0008_retried, \
                 0009_store_index, 0010_unnamed_index, 0011_retried_index"
            ),
        "{out}"
    );
    // A table the application made before it heard of the relay.
    admin
        .batch_execute(&format!(
            "DROP TABLE fga_outbox, fga_outbox_leader CASCADE; \
             DROP FUNCTION fga_outbox_schema_version(); {APP_DDL}"
        ))
        .await
        .unwrap();
    let out = migrate();
    assert!(
        out.contains("added the missing columns of fga_outbox")
            && out.contains("recorded schema version 11"),
        "{out}"
    );
    assert!(migrate().contains("nothing to change"));
}

/// Every flag `--help` shows, of every command, is in docs/configuration.md.
#[test]
fn every_flag_of_every_command_is_in_the_configuration_doc() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let flag_end = |c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let documented = |flag: &str| {
        doc.match_indices(flag)
            .any(|(i, _)| doc[i + flag.len()..].starts_with(flag_end))
    };
    let mut missing = Vec::new();
    for cmd in [
        "migrate",
        "check",
        "sql",
        "run",
        "drain",
        "status",
        "retry",
        "prune",
        "reconcile",
    ] {
        let out = crate::common::relay::command(std::path::Path::new(BIN), &[cmd, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for line in help.lines() {
            let Some(flag) = line
                .trim_start()
                .split([',', ' '])
                .find(|w| w.starts_with("--"))
            else {
                continue;
            };
            if ["--help", "--version"].contains(&flag) || !line.trim_start().starts_with('-') {
                continue;
            }
            if !documented(flag) {
                missing.push(format!("{cmd} {flag}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
}

/// Runs `command` until it exits, or kills it at `deadline` and returns None: a command stuck
/// on a lock fails the test rather than hanging it.
async fn output_within(mut command: Command, deadline: Duration) -> Option<std::process::Output> {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < deadline {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The pid of a test's session.
async fn pid_of(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// `retry --dead` while an operator holds a dead row (`FOR UPDATE`, transaction left open) gives
/// up after its lock wait, naming the session that holds the row, instead of waiting without a
/// word for as long as that transaction lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_behind_a_held_dead_row_exits_naming_the_holder() {
    let env = Env::start().await;
    let dead = env.insert(serde_json::json!({"writes": "nope"})).await;
    env.db
        .connect()
        .await
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'test' WHERE id = $1",
            &[&dead],
        )
        .await
        .unwrap();
    let holder = env.hold_row(dead).await;
    let pid = pid_of(&holder).await;
    let out = output_within(env.command(&["retry", "--dead"]), Duration::from_secs(20))
        .await
        .expect("retry exits within 20 s while the row is held");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "retry: waited 10s for a lock on fga_outbox held by session pid {pid} ("
        )) && stderr.contains("idle in transaction since")
            && stderr.contains(&format!("pg_terminate_backend({pid})"))
            && stderr.contains("run retry again"),
        "{stderr}"
    );
    assert!(env.row(dead).await.dead, "the row is left as it was");
    drop(holder);
}

/// `status` behind `LOCK fga_outbox IN ACCESS EXCLUSIVE MODE` held by another session exits 1,
/// naming it, rather than hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_behind_a_table_lock_exits_naming_the_holder() {
    behind_a_table_lock_exits_naming_the_holder("status", 1).await;
}

/// Runs `command` while another session (application_name `maintenance`) holds `LOCK
/// fga_outbox IN ACCESS EXCLUSIVE MODE`: it exits with `code` within 30 s, naming that session
/// and what to do.
async fn behind_a_table_lock_exits_naming_the_holder(command: &str, code: i32) {
    let env = Env::start().await;
    let holder = env.db.connect().await;
    holder
        .batch_execute(
            "SET application_name = 'maintenance'; BEGIN; \
             LOCK fga_outbox IN ACCESS EXCLUSIVE MODE",
        )
        .await
        .unwrap();
    let pid = pid_of(&holder).await;
    let out = output_within(env.command(&[command]), Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("{command} exits within 30 s while the table is locked"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{command}: waited 10s for a lock on fga_outbox held by session pid {pid} \
             (maintenance, idle in transaction since"
        )) && stderr.contains(&format!("run {command} again")),
        "{stderr}"
    );
    drop(holder);
}

/// `check` behind the same lock reports the wait as a failed check line and goes on, rather
/// than hanging after the privileges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_behind_a_table_lock_fails_a_line_naming_the_holder() {
    let env = Env::start().await;
    env.insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let holder = env.db.connect().await;
    holder
        .batch_execute("BEGIN; LOCK fga_outbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let pid = pid_of(&holder).await;
    let out = output_within(env.command(&["check"]), Duration::from_secs(20))
        .await
        .expect("check exits within 20 s while the table is locked");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "FAIL  pending rows: check: waited 10s for a lock on fga_outbox held by session \
             pid {pid} ("
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok    store:"),
        "the checks after it ran: {stdout}"
    );
    drop(holder);
}

/// Inserts a row already dead (as the relay leaves one it gave up on); returns its id.
async fn insert_dead(client: &tokio_postgres::Client, payload: serde_json::Value) -> i64 {
    client
        .query_one(
            "INSERT INTO fga_outbox (payload, failed_at, last_error) \
             VALUES ($1, now(), 'OpenFGA refused it: test') RETURNING id",
            &[&payload],
        )
        .await
        .unwrap()
        .get(0)
}

/// Inserts a row already delivered; returns its id.
async fn insert_delivered(client: &tokio_postgres::Client, payload: serde_json::Value) -> i64 {
    client
        .query_one(
            "INSERT INTO fga_outbox (payload, processed_at) VALUES ($1, now()) RETURNING id",
            &[&payload],
        )
        .await
        .unwrap()
        .get(0)
}

/// `retry ID...` exits 1 when it left an id it was given as it is (a script running `retry 123`
/// must be able to tell that nothing was done), still saying why for each and still sending the
/// dead ones back; 0 when it sent back every one. `--dry-run` exits as the retry would, and
/// `--dead` with no dead row has nothing left undone: 0. An id given twice counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_exits_1_when_an_id_given_was_left_as_it_is() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let dead = insert_dead(&admin, writes(&[tk("user:anne", "viewer", "document:1")])).await;
    let other = insert_dead(&admin, writes(&[tk("user:bob", "viewer", "document:1")])).await;
    let delivered =
        insert_delivered(&admin, writes(&[tk("user:carl", "viewer", "document:1")])).await;
    let missing = delivered + 1000;
    let run = |args: &[String]| {
        let mut all = vec!["retry"];
        all.extend(args.iter().map(String::as_str));
        env.command(&all).output().unwrap()
    };
    let ids = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>();
    let dry = |ids: &[i64]| {
        let mut args = vec!["--dry-run".to_owned()];
        args.extend(ids.iter().map(i64::to_string));
        args
    };

    let out = run(&dry(&[dead, missing]));
    let said = crate::common::relay::said(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("row {missing}: no such row; left as it is"))
            && said.contains("1 dead row(s) would be sent back")
            && said.contains("1 of the 2 rows given would be left as it is"),
        "{said}"
    );
    assert!(env.row(dead).await.dead, "a dry run changes nothing");
    let out = run(&dry(&[dead]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        crate::common::relay::said(&out)
    );

    // An id given twice is one row, said once.
    let out = run(&ids(&[dead, delivered, delivered]));
    let said = crate::common::relay::said(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let left = format!("row {delivered}: delivered, not dead; left as it is");
    assert!(
        said.matches(&left).count() == 1
            && said.contains("1 row(s) sent back to pending")
            && said.contains("1 of the 2 rows given was left as it is")
            && said.contains("fga-relay retry --dead --dry-run"),
        "{said}"
    );
    let row = env.row(dead).await;
    assert!(
        !row.dead && !row.delivered,
        "the dead one went back: {row:?}"
    );
    // Pending now: nothing more to do for it.
    let out = run(&ids(&[dead]));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        crate::common::relay::said(&out)
    );

    let out = run(&ids(&[other]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        crate::common::relay::said(&out)
    );
    let out = run(&["--dead".to_owned()]);
    let said = crate::common::relay::said(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("0 row(s) sent back to pending"), "{said}");
}

/// `retry --dry-run` previews a dead row's operations as the relay treats them when it reads the
/// row back: an operation is skipped when a later delivered row of the same store touches its
/// tuple, and a row naming the configured store's id (`--store-id`, `FGA_STORE_ID`) is of one
/// store with the rows naming none. A dead grant naming no store with a later delivered revoke
/// naming the configured id, and the reverse, are shown skipped, and the relay skips them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_dry_run_takes_the_configured_store_named_or_not_as_one_store() {
    let env = Env::start().await;
    let configured = env.fga.store_id().to_owned();
    let admin = env.db.connect().await;
    let anne = tk("user:anne", "viewer", "document:1");
    let bob = tk("user:bob", "viewer", "document:1");
    let grant_naming_none = insert_dead(&admin, writes(std::slice::from_ref(&anne))).await;
    let revoke_naming_it = insert_delivered(
        &admin,
        serde_json::json!({"deletes": [anne], "store_id": configured}),
    )
    .await;
    let grant_naming_it = insert_dead(
        &admin,
        serde_json::json!({"writes": [bob], "store_id": configured}),
    )
    .await;
    let revoke_naming_none = insert_delivered(&admin, crate::common::relay::deletes(&[bob])).await;

    let out = env
        .command(&["retry", "--dead", "--dry-run"])
        .output()
        .unwrap();
    assert_success(&out, "retry --dead --dry-run");
    let text = String::from_utf8_lossy(&out.stdout);
    for (grant, revoke, user) in [
        (grant_naming_none, revoke_naming_it, "anne"),
        (grant_naming_it, revoke_naming_none, "bob"),
    ] {
        assert!(
            text.contains(&format!(
                "row {grant}: skip write document:1#viewer@user:{user} (superseded by row \
                 {revoke}, delivered)"
            )),
            "{text}"
        );
    }
    assert!(!text.contains("replay"), "{text}");

    // Without the configured store, the dry run says what it cannot tell, and how to tell it.
    let out = env
        .command(&["retry", "--dead", "--dry-run"])
        .env_remove("FGA_STORE_ID")
        .output()
        .unwrap();
    let said = crate::common::relay::said(&out);
    assert!(
        said.contains("--store-id") && said.contains("FGA_STORE_ID"),
        "{said}"
    );

    // What the relay does with them, once they come back: it skips both.
    assert_success(
        &env.command(&["retry", "--dead"]).output().unwrap(),
        "retry --dead",
    );
    assert_success(
        &env.command(&["drain", "--timeout", "20s"])
            .output()
            .unwrap(),
        "drain",
    );
    for grant in [grant_naming_none, grant_naming_it] {
        let row = env.row(grant).await;
        assert!(
            row.delivered
                && row
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("skipped")),
            "{row:?}"
        );
    }
    assert!(env.fga.tuples().is_empty(), "{:?}", env.fga.tuples());
}

/// `prune --older-than 0s` (or any duration under a minute) would delete delivered rows down to
/// those delivered moments ago, which `retry`'s look for superseded operations and `reconcile`
/// read: it is refused (exit 2), saying what to give instead, and nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_refuses_a_zero_duration_saying_what_to_give() {
    let env = Env::start().await;
    let admin = env.db.connect().await;
    let delivered =
        insert_delivered(&admin, writes(&[tk("user:anne", "viewer", "document:1")])).await;
    admin
        .execute(
            "UPDATE fga_outbox SET processed_at = now() - interval '1 hour' WHERE id = $1",
            &[&delivered],
        )
        .await
        .unwrap();
    for zero in ["0s", "0ms", " 0s ", "1ms", "59s"] {
        let out = env
            .command(&["prune", "--older-than", zero])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{zero:?}: {err}");
        assert!(
            err.contains("--older-than") && err.contains("90d") && err.lines().count() == 1,
            "{zero:?}: {err}"
        );
    }
    assert_eq!(
        count(&admin, "SELECT count(*) FROM fga_outbox", &[]).await,
        1,
        "nothing deleted"
    );
    assert_success(
        &env.command(&["prune", "--older-than", "1m"])
            .output()
            .unwrap(),
        "prune 1m",
    );
    assert_eq!(
        count(&admin, "SELECT count(*) FROM fga_outbox", &[]).await,
        0
    );
}

/// `reconcile` behind `LOCK fga_outbox IN ACCESS EXCLUSIVE MODE` held by another session exits
/// with its error status (2: 1 says drift), naming that session, as the other commands do,
/// rather than hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_behind_a_table_lock_exits_naming_the_holder() {
    behind_a_table_lock_exits_naming_the_holder("reconcile", 2).await;
}

/// A row dead-lettered by a transaction that began before `drain` started and committed after
/// drain counted the rows pending (an operator's `UPDATE … SET failed_at = now()` left open
/// a while, as the runbook's fix for a deleted store's rows is written) was pending at the
/// drain's start: the drain counts it dead and exits 3, rather than exit 0 with the row counted
/// nowhere (its `failed_at`, the transaction's start, is older than the drain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_counts_a_row_dead_lettered_by_a_transaction_begun_before_it() {
    let env = Env::start().await;
    // Among the rows the drain counts (by id, from the lowest pending to the highest), one
    // delivered and one dead before it started, which are not its.
    let delivered = env
        .insert(writes(&[tk("user:bob", "viewer", "document:1")]))
        .await;
    let dead_before = insert_dead(
        &env.db.connect().await,
        writes(&[tk("user:carl", "viewer", "document:1")]),
    )
    .await;
    let id = env
        .insert(writes(&[tk("user:anne", "viewer", "document:1")]))
        .await;
    let operator = env.db.connect().await;
    operator.batch_execute("BEGIN").await.unwrap();
    operator
        .execute(
            "UPDATE fga_outbox SET failed_at = now(), last_error = 'given up on by hand' \
             WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let dir =
        std::env::temp_dir().join(format!("fga-relay-drain-test-{}-{id}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let mut drain = env
        .command(&["drain", "--timeout", "30s"])
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    // It counted the rows pending (the row among them: its change is not committed) before it
    // leads.
    wait_until(PROMPTLY, "drain leads", || async {
        std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .contains("delivering (leader)")
    })
    .await;
    operator.batch_execute("COMMIT").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(status) = drain.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = drain.kill();
            panic!(
                "drain did not exit:\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let out = std::fs::read_to_string(&stdout).unwrap();
    let err = std::fs::read_to_string(&stderr).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(3), "{out}\n{err}");
    assert!(
        out.contains("delivered 1, dead 1, still pending 0")
            && out.contains(&format!("dead row {id}: given up on by hand"))
            && !out.contains(&format!("dead row {dead_before}:")),
        "{out}"
    );
    assert!(env.row(delivered).await.delivered);
}
