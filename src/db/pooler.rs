//! A connection pooler in transaction mode (PgBouncer's `pool_mode = transaction`, and poolers
//! like it) between the relay and PostgreSQL. It hands each transaction whichever server
//! session is free, so what the relay keeps in its session does not last: LISTEN, the
//! leadership lock (a session advisory lock) and prepared statements. Relays behind one keep
//! taking leadership from each other and deliver nothing, so the relay stops (exit 2) and says
//! what to change instead.
//!
//! Three signs, any enough: the dedicated connection's backend pid changes between two of its
//! transactions (a PostgreSQL session keeps its pid for life), another connection's transaction
//! is served by the dedicated connection's backend, or a statement a connection
//! prepared is missing (26000) or prepared twice (42P05) on the server (tokio-postgres names
//! statements once per connection, and only a server session shared with others can disagree).

use std::sync::Mutex;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// What is found, and what stops when it is.
#[derive(Debug, Default)]
pub struct PoolerCheck {
    /// Cancelled when a pooler is found (the command's own shutdown, so that it stops as on
    /// SIGTERM).
    stop: Mutex<Option<CancellationToken>>,
    /// What was found: the message the command exits with.
    found: Mutex<Option<String>>,
}

/// The guarded value, also after a panic elsewhere (plain values, never half-made).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PoolerCheck {
    /// `token` is cancelled once a pooler is found.
    pub fn stops(&self, token: &CancellationToken) {
        *locked(&self.stop) = Some(token.clone());
        if locked(&self.found).is_some() {
            token.cancel();
        }
    }

    /// Whether `e` is a sign of a pooler in transaction mode; if so, it is reported.
    pub fn check(&self, e: &tokio_postgres::Error) -> bool {
        let Some(code) = e.code() else { return false };
        let sign = if *code == SqlState::INVALID_SQL_STATEMENT_NAME {
            "a statement this connection prepared is missing on the server"
        } else if *code == SqlState::DUPLICATE_PSTATEMENT {
            "a statement this connection prepares already exists on the server"
        } else {
            return false;
        };
        self.found(format!(
            "{sign} ({}): {}",
            code.code(),
            e.as_db_error().map_or("", |d| d.message())
        ));
        true
    }

    /// Whether a session that began as backend `was` is now served by backend `now`; if so,
    /// it is reported.
    pub fn check_pid(&self, was: i32, now: i32) -> bool {
        if was == now {
            return false;
        }
        self.found(format!(
            "the dedicated connection's PostgreSQL session changed between two transactions \
             (backend pid {was}, then {now})"
        ));
        true
    }

    /// Whether another connection of the relay's, in a transaction, is served by backend
    /// `other`, the dedicated connection's own `dedicated`; if so, it is reported.
    pub fn check_shared(&self, dedicated: i32, other: i32) -> bool {
        if dedicated != other {
            return false;
        }
        self.found(format!(
            "a pooled connection's transaction was served by the dedicated connection's \
             PostgreSQL session (backend pid {dedicated})"
        ));
        true
    }

    fn found(&self, sign: String) {
        let message = format!(
            "DATABASE_URL goes through a connection pooler in transaction mode (such as \
             PgBouncer with pool_mode = transaction): {sign}. The relay keeps LISTEN, its \
             leadership lock and prepared statements in its PostgreSQL sessions, which such a \
             pooler does not keep from one transaction to the next. Point DATABASE_URL at \
             PostgreSQL directly, or at a pool in session mode (pool_mode = session)"
        );
        let mut found = locked(&self.found);
        if found.is_none() {
            error!("{message}");
            *found = Some(message);
        }
        drop(found);
        if let Some(stop) = locked(&self.stop).as_ref() {
            stop.cancel();
        }
    }

    /// The message to exit with, once a pooler was found.
    pub fn finding(&self) -> Option<String> {
        locked(&self.found).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_pid_is_found_once_and_stops() {
        let check = PoolerCheck::default();
        let stop = CancellationToken::new();
        check.stops(&stop);
        assert!(!check.check_pid(7, 7));
        assert!(check.finding().is_none() && !stop.is_cancelled());
        assert!(check.check_pid(7, 8));
        assert!(stop.is_cancelled());
        let message = check.finding().unwrap();
        assert!(message.contains("pool_mode = session"), "{message}");
        assert!(message.contains("backend pid 7, then 8"), "{message}");
        let later = CancellationToken::new();
        check.stops(&later);
        assert!(later.is_cancelled(), "found before: stops at once");
    }
}
