//! What a database error means to whoever runs the relay, and the next step. The relay retries
//! for ever, and the errors it meets are of two kinds: those that heal by themselves (a server
//! restarting, a lost connection), and those that last until someone acts, which are told apart
//! here so that they can be said at ERROR with what to do:
//! - authentication refused (SQLSTATE 28P01, 28000): the role is named, never the password or
//!   the connection string;
//! - a missing privilege (42501): what the role lacks and the GRANT that gives it, in the words
//!   of `fga-relay check`, from the same query ([`super::probe::privileges`]);
//! - no server where the relay looked, when nothing named one (no `DATABASE_URL`, no `PGHOST`):
//!   no database is configured, and the Unix sockets it tried are named. (A socket missing where
//!   the settings point is said with its path, but as a server that may still be starting.)

use super::PgConnect;
use crate::config::TableName;
use crate::recurring::Recurring;
use std::fmt;
use std::path::Path;
use std::time::Duration;
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tracing::{debug, error, warn};

/// A database error, with what it means.
#[derive(Debug)]
pub struct Explained {
    /// Set when it lasts until someone acts: its kind, for [`Recurring`].
    pub lasting: Option<&'static str>,
    /// What the server or the connection said (never the connection string).
    pub error: String,
    /// What to do about it, when that is known.
    pub next: Option<String>,
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.next {
            Some(next) => write!(f, "{}: {next}", self.error),
            None => f.write_str(&self.error),
        }
    }
}

const AUTHENTICATION: &str = "authentication";
const PRIVILEGE: &str = "privilege";
const NO_DATABASE: &str = "no database";

/// A session that did not open within `limit`, and nothing refused it: no server answered
/// (a TCP connect that timed out is an error, said as one), or one let the connection in and
/// answered nothing after, or answered too slowly. `pg`: where it was opened, named without
/// the password.
pub fn stalled(limit: Duration, pg: &PgConnect) -> Explained {
    Explained {
        lasting: None,
        error: format!(
            "PostgreSQL ({}) did not finish opening the connection within {}",
            super::target::of_config(&pg.config),
            humantime::format_duration(limit)
        ),
        next: Some(format!(
            "look for a server that is stopped or out of resources, or a proxy, pooler or \
             firewall in between that lets connections in but no bytes through; on a slow \
             link, raise connect_timeout (in DATABASE_URL, or PGCONNECT_TIMEOUT; {} by \
             default): the bound is twice it for each host, and a heartbeat, and doubles after \
             each such try, up to eight times",
            humantime::format_duration(super::DEFAULT_CONNECT_TIMEOUT)
        )),
    }
}

/// What `e`, met connecting with `pg` or on such a connection, means.
pub fn explain(e: &tokio_postgres::Error, pg: &PgConnect) -> Explained {
    let error = super::describe(e);
    let role = pg
        .config
        .get_user()
        .unwrap_or("(the operating system's user)");
    match e.code() {
        Some(c)
            if *c == SqlState::INVALID_PASSWORD
                || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            Explained {
                lasting: Some(AUTHENTICATION),
                error,
                next: Some(format!(
                    "PostgreSQL does not let the role {role} in: check its password \
                     (DATABASE_URL, PGPASSWORD or the password file) and pg_hba.conf"
                )),
            }
        }
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => Explained {
            lasting: Some(PRIVILEGE),
            error,
            next: Some(format!(
                "the role {role} lacks a privilege the relay needs: `fga-relay check` names it"
            )),
        },
        Some(_) => Explained {
            lasting: None,
            error,
            next: None,
        },
        None => match missing_sockets(e, pg) {
            Some(sockets) if pg.hosts_defaulted => Explained {
                lasting: Some(NO_DATABASE),
                error: format!(
                    "no database is configured: neither DATABASE_URL (or its file) nor PGHOST \
                     names a server, and no PostgreSQL socket is at {}",
                    sockets.join(" or ")
                ),
                next: Some("set DATABASE_URL to the outbox's database".to_owned()),
            },
            Some(sockets) => Explained {
                lasting: None,
                error: format!("no PostgreSQL socket at {}", sockets.join(" or ")),
                next: Some(
                    "is the server running, with its socket in that directory \
                     (unix_socket_directories)?"
                        .to_owned(),
                ),
            },
            None => Explained {
                lasting: None,
                error,
                next: None,
            },
        },
    }
}

/// [`explain`], and for a missing privilege what exactly the role lacks, asked on a connection of
/// `pool` (the same role) as `fga-relay check` asks it.
pub async fn explain_with_grants(
    e: &tokio_postgres::Error,
    pg: &PgConnect,
    pool: &deadpool_postgres::Pool,
    table: &TableName,
) -> Explained {
    let mut explained = explain(e, pg);
    if explained.lasting != Some(PRIVILEGE) {
        return explained;
    }
    let ask = async {
        let client = pool.get().await.ok()?;
        super::probe::privileges(&client, table).await.err()
    };
    // Bounded: explaining must not hold up the loop that retries (a pool with no connection to
    // spare keeps the generic next step).
    if let Ok(Some(lacks)) = tokio::time::timeout(ASK_LIMIT, ask).await {
        explained.next = Some(lacks);
    }
    explained
}

/// How long asking what the role lacks may take.
const ASK_LIMIT: Duration = Duration::from_secs(5);

/// The Unix sockets tried, when every host is a socket directory and none had the socket.
fn missing_sockets(e: &tokio_postgres::Error, pg: &PgConnect) -> Option<Vec<String>> {
    let io = std::error::Error::source(e)?.downcast_ref::<std::io::Error>()?;
    if io.kind() != std::io::ErrorKind::NotFound {
        return None;
    }
    let ports = pg.config.get_ports();
    let mut sockets = Vec::new();
    for (i, host) in pg.config.get_hosts().iter().enumerate() {
        let Host::Unix(dir) = host else { return None };
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        sockets.push(socket_path(dir, port));
    }
    (!sockets.is_empty()).then_some(sockets)
}

/// Where a server on `port` listens in `dir`, as libpq names the socket.
fn socket_path(dir: &Path, port: u16) -> String {
    dir.join(format!(".s.PGSQL.{port}")).display().to_string()
}

/// Logs an error of a connection the relay retries (`what`: what it was doing): one that lasts
/// at ERROR with the next step, when `recurring` says it is due (else at DEBUG, so that the log
/// is not a line every few seconds); the others at WARN.
/// Returns whether it was one that lasts (then said, or held back as said within the minute).
pub fn log(
    what: &str,
    explained: &Explained,
    retry_in: Option<Duration>,
    recurring: &Recurring,
) -> bool {
    let next = explained.next.as_deref().unwrap_or("");
    // Not recorded when unknown (the caller's caller decides).
    let retry_in = retry_in.map(tracing::field::debug);
    match explained.lasting {
        Some(kind) if recurring.due(kind) => error!(
            error = %explained.error,
            retry_in,
            "{what}: {next}; retrying (said again every minute while it lasts)"
        ),
        Some(_) => debug!(error = %explained.error, retry_in, "{what}: {next}; retrying"),
        None if next.is_empty() => warn!(error = %explained.error, retry_in, "{what}"),
        None => warn!(error = %explained.error, retry_in, "{what}: {next}"),
    }
    explained.lasting.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: Option<&str>) -> PgConnect {
        let db = crate::config::DbSettings {
            url: url.map(|u| crate::config::Secret::new(u.to_owned())),
            table: TableName::parse_setting("t", "fga_outbox").unwrap(),
        };
        super::super::pg_config(&db, "test").unwrap()
    }

    #[tokio::test]
    async fn no_server_where_nothing_named_one_says_no_database_is_configured_and_where() {
        let dir = std::env::temp_dir().join(format!("hint-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("host={} port=6543 user=relay", dir.display());
        let named = pg(Some(&url));
        let e = super::super::connect_dedicated(&named).await.err().unwrap();
        let said = explain(&e, &named);
        let socket = format!("{}/.s.PGSQL.6543", dir.display());
        assert_eq!(said.lasting, None, "{said}");
        assert!(said.error.contains(&socket), "{said}");
        assert!(!said.error.contains("no database is configured"), "{said}");
        // The same error where the sockets were libpq's defaults, not named.
        let mut defaulted = named.clone();
        defaulted.hosts_defaulted = true;
        let said = explain(&e, &defaulted).to_string();
        assert!(
            said.contains("no database is configured") && said.contains(&socket),
            "{said}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
