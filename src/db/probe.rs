//! What `fga-relay check` asks PostgreSQL, changing nothing: whether the connection reaches a
//! session of its own (not a transaction pooler's, where LISTEN and the relay's session-level
//! advisory locks silently fail), and whether the role has what `run` needs.

use super::PgConnect;
use crate::config::TableName;
use crate::schema::render;
use std::time::Duration;
use tokio_postgres::Client;

/// What one probe found: passed (with what it saw), or failed (with why).
pub type Probe = Result<String, String>;

const PRIVILEGES: &str = include_str!("../../sql/queries/check_privileges.sql");
const PENDING_RELATIONS: &str = include_str!("../../sql/queries/check_pending_relations.sql");
const TABLE_OWNER: &str = include_str!("../../sql/queries/table_owner.sql");

/// How long the other connections' transactions may keep the first from getting a backend:
/// past it, the first waits for a server connection a pooler has lent out.
const POOL_WAIT: Duration = Duration::from_secs(3);

/// Connections that open a transaction beside the first: a pooler lends each an idle server
/// connection, and the one the first connection just used is among them.
const OTHERS: usize = 3;

/// The backend pid, by the simple query protocol: one message, one transaction, so that a
/// pooler cannot split a statement's parse and execution over two server connections.
async fn backend_pid(client: &Client, sql: &str) -> Result<i32, String> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| super::describe(&e))?;
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
            _ => None,
        })
        .ok_or_else(|| "no backend pid in the answer".to_owned())
}

const PID: &str = "SELECT pg_backend_pid()";
const BEGIN_PID: &str = "BEGIN; SELECT pg_backend_pid()";
const POOLER: &str = "a transaction pooler is in between; point the relay at PostgreSQL itself \
                      or at a session-mode pool";

/// A transaction pooler (PgBouncer's `pool_mode = transaction`, and others) lends each client
/// a server session per transaction. Seen from the client: transactions that other connections
/// open after the first connection's statement run on the backend that statement ran on (the
/// pooler hands out the server connection just released), and while they are open the first
/// connection's next statement runs on another backend, or waits. Directly on PostgreSQL (or
/// through a session pooler) each connection keeps a backend of its own.
pub async fn not_a_transaction_pooler(pg: &PgConnect, first: &Client) -> Probe {
    let pid = backend_pid(first, PID).await?;
    let mut others = Vec::new();
    let verdict = async {
        for _ in 0..OTHERS {
            let (other, conn) = super::connect_dedicated(pg)
                .await
                .map_err(|e| format!("another connection failed: {}", super::describe(&e)))?;
            others.push((other, tokio::spawn(conn)));
            let Some((other, _)) = others.last() else {
                continue;
            };
            let other_pid = backend_pid(other, BEGIN_PID)
                .await
                .map_err(|e| format!("BEGIN failed (a statement pooler?): {e}"))?;
            if other_pid == pid {
                return Err(format!(
                    "two connections ran on one PostgreSQL session (backend pid {pid}): {POOLER}"
                ));
            }
        }
        match tokio::time::timeout(POOL_WAIT, backend_pid(first, PID)).await {
            Ok(Ok(again)) if again == pid => {
                Ok(format!("a session of its own (backend pid {pid})"))
            }
            Ok(Ok(again)) => Err(format!(
                "the connection moved from backend pid {pid} to {again} between transactions: \
                 {POOLER}"
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!(
                "the connection waited {}s for a server session while other connections' \
                 transactions were open: {POOLER}",
                POOL_WAIT.as_secs()
            )),
        }
    }
    .await;
    for (other, driver) in others {
        let _ = other.batch_execute("ROLLBACK").await;
        drop(other);
        let _ = driver.await;
    }
    verdict
}

/// The grants `run` needs (sql/roles.sql), a writable primary, and LISTEN.
pub async fn privileges(client: &Client, table: &TableName) -> Probe {
    let row = client
        .query_one(
            &render(PRIVILEGES, table),
            &[&table.as_str(), &format!("{table}_leader")],
        )
        .await
        .map_err(|e| super::describe(&e))?;
    let get = |name: &str| row.try_get::<_, bool>(name).unwrap_or(false);
    let role: String = row.try_get("role").unwrap_or_default();
    if get("standby") {
        return Err("the server is a standby (in recovery): connect to the primary".into());
    }
    if get("read_only") {
        return Err(format!(
            "default_transaction_read_only is on for {role}: the relay marks rows delivered"
        ));
    }
    let mut missing = Vec::new();
    if !get("select_outbox") {
        missing.push(format!("SELECT on {table}"));
    }
    if !get("update_delivery_columns") {
        missing.push(format!(
            "UPDATE (processed_at, failed_at, attempts, last_error) on {table}"
        ));
    }
    if !get("use_leader") {
        missing.push(format!("SELECT, INSERT, UPDATE on {table}_leader"));
    }
    if !missing.is_empty() {
        return Err(format!(
            "{role} lacks {}: GRANT {table}_relay TO {role} (see `fga-relay sql --roles`)",
            missing.join(", ")
        ));
    }
    // LISTEN needs no grant, but fails where the relay could not work (a standby, a pooler
    // that refuses it).
    client
        .batch_execute(&format!("LISTEN {table}; UNLISTEN {table}"))
        .await
        .map_err(|e| format!("LISTEN failed: {}", super::describe(&e)))?;
    Ok(format!(
        "{role} may read {table}, mark rows, lead ({table}_leader) and LISTEN"
    ))
}

/// The (object type, relation) pairs the oldest pending rows name: a sample, for the model
/// check.
pub async fn pending_relations(
    client: &Client,
    table: &TableName,
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let rows = client.query(&render(PENDING_RELATIONS, table), &[]).await?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
        .collect())
}

/// The role that owns `table` (`None`: there is no such table), for a command refused what only
/// the owner may do to say as which role to run it.
pub async fn table_owner(
    client: &Client,
    table: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client.query_opt(TABLE_OWNER, &[&table]).await?;
    row.map(|r| r.try_get(0)).transpose()
}
