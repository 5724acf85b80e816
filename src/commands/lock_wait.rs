//! A command's wait for a lock another session holds. Its sessions give up after
//! [`crate::db::COMMAND_LOCK_TIMEOUT`] (55P03; `reconcile --repair`'s lock sooner); the command
//! then exits 1 (`reconcile` 2, its status for an error) saying what it waited for, which
//! sessions held it, and what to do. By then the wait is
//! over and PostgreSQL no longer says who blocked it, so a watcher asks while the command runs:
//! from its second second on, once a second, on a connection of its own, which sessions block
//! the command's (`pg_blocking_pids`), keeping the last answer.

use super::failure::Failure;
use crate::config::DbSettings;
use crate::db::PgConnect;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LOCK_HOLDERS: &str = include_str!("../../sql/queries/lock_holders.sql");

/// How often the watcher asks, and how long a command runs before it starts: most commands end
/// sooner, and open no second connection.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A session holding a lock a command waited for.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Holder {
    pub pid: i32,
    pub application_name: String,
    /// None where this role may not see it.
    pub state: Option<String>,
    /// When it entered that state (UTC, HH:MM:SS).
    pub since: Option<String>,
}

/// The watcher: stops when dropped.
pub(super) struct LockWatch {
    latest: Arc<Mutex<Vec<Holder>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LockWatch {
    /// Watches the sessions named as `pg` names them (`application_name`).
    pub fn start(pg: &PgConnect) -> LockWatch {
        let latest = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(watch(pg.clone(), latest.clone()));
        LockWatch { latest, task }
    }

    /// The sessions the last look found blocking the command's (none when none did, or the
    /// watcher could not look).
    pub fn holders(&self) -> Vec<Holder> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for LockWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch(pg: PgConnect, latest: Arc<Mutex<Vec<Holder>>>) {
    tokio::time::sleep(LOOK_EVERY).await;
    // A watcher that cannot connect leaves the message without names; the command goes on.
    let Ok((client, conn)) = crate::db::connect_dedicated(&pg).await else {
        return;
    };
    let driver = tokio::spawn(conn);
    let name = pg.application_name().to_owned();
    loop {
        let Ok(rows) = client.query(LOCK_HOLDERS, &[&name]).await else {
            break;
        };
        let found: Vec<Holder> = rows
            .iter()
            .filter_map(|r| {
                Some(Holder {
                    pid: r.try_get(0).ok()?,
                    application_name: r.try_get(1).ok()?,
                    state: r.try_get(2).ok()?,
                    since: r.try_get(3).ok()?,
                })
            })
            .collect();
        // A look between two waits finds nothing: the last wait's holders stay.
        if !found.is_empty() {
            *latest.lock().unwrap_or_else(|e| e.into_inner()) = found;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    drop(client);
    let _ = driver.await;
}

/// Runs `work`, a command's, watched: a lock it waited for in vain fails it with [`message`].
/// `command` is the subcommand (`retry`); its sessions are named `fga-relay <command>`.
pub(super) async fn bounded<T>(
    command: &str,
    db: &DbSettings,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let pg = crate::db::pg_config(db, &format!("fga-relay {command}"))?;
    let watch = LockWatch::start(&pg);
    match work.await {
        Err(Failure::LockWait(_, waited)) => Err(Failure::LockWait(
            message(command, db.table.as_str(), waited, &watch.holders()),
            waited,
        )),
        done => done,
    }
}

/// One line: what `command` waited for, who held it, and what to do.
pub(super) fn message(command: &str, table: &str, waited: Duration, holders: &[Holder]) -> String {
    let waited = format!(
        "{command}: waited {}s for a lock on {table}",
        waited.as_secs()
    );
    match holders {
        [] => format!(
            "{waited} held by another session, which let go or could not be seen before it \
             could be named; the sessions holding locks on it: SELECT l.pid, a.application_name, \
             a.state, a.state_change FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE \
             l.relation = '{table}'::regclass; end the long transaction among them and run \
             {command} again"
        ),
        [one] => format!(
            "{waited} held by session {}; end that transaction (or \
             pg_terminate_backend({})) and run {command} again",
            describe(one),
            one.pid
        ),
        many => format!(
            "{waited} held by sessions {}; end their transactions (or pg_terminate_backend() \
             each: {}) and run {command} again",
            many.iter().map(describe).collect::<Vec<_>>().join(", "),
            many.iter()
                .map(|h| h.pid.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// "pid 1234 (psql, idle in transaction since 12:00:01 UTC)".
fn describe(h: &Holder) -> String {
    let name = if h.application_name.is_empty() {
        "no application_name"
    } else {
        &h.application_name
    };
    let state = match (&h.state, &h.since) {
        (Some(state), Some(since)) => format!("{state} since {since} UTC"),
        (Some(state), None) => state.clone(),
        // Another role's session, to a role that may not read all statistics.
        _ => "state not visible to this role".to_owned(),
    };
    format!("pid {} ({name}, {state})", h.pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::COMMAND_LOCK_TIMEOUT;

    fn holder(pid: i32) -> Holder {
        Holder {
            pid,
            application_name: "psql".into(),
            state: Some("idle in transaction".into()),
            since: Some("12:00:01".into()),
        }
    }

    #[test]
    fn names_the_holder_and_what_to_do() {
        assert_eq!(
            message("retry", "fga_outbox", COMMAND_LOCK_TIMEOUT, &[holder(1234)]),
            "retry: waited 10s for a lock on fga_outbox held by session pid 1234 (psql, idle in \
             transaction since 12:00:01 UTC); end that transaction (or \
             pg_terminate_backend(1234)) and run retry again"
        );
    }

    #[test]
    fn names_every_holder() {
        let m = message(
            "status",
            "fga_outbox",
            COMMAND_LOCK_TIMEOUT,
            &[holder(1), holder(2)],
        );
        assert!(m.contains("sessions pid 1 (psql"), "{m}");
        assert!(m.contains("pid 2 (psql"), "{m}");
        assert!(m.ends_with("each: 1, 2) and run status again"), "{m}");
    }

    #[test]
    fn says_how_to_find_a_holder_it_could_not_name() {
        let m = message("prune", "fga_outbox", COMMAND_LOCK_TIMEOUT, &[]);
        assert!(m.contains("pg_locks"), "{m}");
        assert!(m.ends_with("run prune again"), "{m}");
    }

    #[test]
    fn an_unseen_state_says_so() {
        let h = Holder {
            state: None,
            since: None,
            application_name: String::new(),
            ..holder(7)
        };
        assert_eq!(
            describe(&h),
            "pid 7 (no application_name, state not visible to this role)"
        );
    }
}
