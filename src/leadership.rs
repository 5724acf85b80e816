//! Leadership as a lease, in the one-row leader table (see `sql/schema/0004_lease.sql`).
//!
//! The relay holding the leadership lock renews its lease at every heartbeat, on the session
//! that holds the lock, and stops sending as soon as its lease has run out by its own clock. A
//! relay that cannot take the lock ends the holder's session once its lease has run out, so
//! that a stopped relay, or one whose every byte is lost while the server's side of its socket
//! stays open, cannot keep leadership. The record also says when Writes may start again
//! (`not_before`), which every new leader waits for, whoever let go and however.

use crate::config::TableName;
use crate::schema::render;
use std::time::{Duration, SystemTime};
use tokio_postgres::Client;

/// Who leads, for how long, and the rendered statements that say so.
#[derive(Debug)]
pub struct Lease {
    /// This relay's name in the leader record.
    pub holder: String,
    /// How long leadership lasts without a renewal.
    pub lease: Duration,
    /// How long before the end of the lease (by PostgreSQL's record) the leader stops sending.
    pub margin: Duration,
    /// How long after a lease's end a Write of its holder may still land.
    pub fence: Duration,
    take: String,
    renew: String,
    release: String,
    end_expired: String,
    end_session: String,
}

/// What taking leadership found.
#[derive(Debug, Clone)]
pub struct Taken {
    /// The previous holder, if any.
    pub previous: Option<String>,
    /// When the previous holder took leadership (PostgreSQL's clock): its term, which tells
    /// this relay's own last term from a take of its own whose answer it never saw.
    pub previous_term: Option<SystemTime>,
    /// When this relay took it now: this term.
    pub term: SystemTime,
    /// When the previous leaders' Writes are all over (PostgreSQL's clock), if ever recorded.
    pub not_before: Option<SystemTime>,
    /// How long from now until then.
    pub wait: Duration,
    /// PostgreSQL's clock when the record was taken.
    pub now: SystemTime,
}

/// A PostgreSQL session, by what identifies it even after its pid is reused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backend {
    pub pid: i32,
    pub started: SystemTime,
}

impl Lease {
    pub fn new(
        table: &TableName,
        holder: String,
        lease: Duration,
        margin: Duration,
        fence: Duration,
    ) -> Lease {
        let r = |sql: &str| render(sql, table);
        Lease {
            holder,
            lease,
            margin,
            fence,
            take: r(include_str!("../sql/queries/take_leadership.sql")),
            renew: r(include_str!("../sql/queries/renew_lease.sql")),
            release: r(include_str!("../sql/queries/release_leadership.sql")),
            end_expired: r(include_str!("../sql/queries/end_expired_leader.sql")),
            end_session: include_str!("../sql/queries/end_session.sql").to_owned(),
        }
    }

    /// The lease and the fence, in seconds, as the statements take them.
    fn seconds(&self) -> (f64, f64) {
        (self.lease.as_secs_f64(), self.fence.as_secs_f64())
    }

    /// Records this relay as the leader, on the session that just took the lock.
    pub async fn take(&self, client: &Client) -> Result<Taken, tokio_postgres::Error> {
        let (lease, fence) = self.seconds();
        let row = client
            .query_one(&self.take, &[&self.holder, &lease, &fence])
            .await?;
        let wait: f64 = row.try_get("wait_seconds")?;
        Ok(Taken {
            previous: row.try_get("previous_holder")?,
            previous_term: row.try_get("previous_term")?,
            term: row.try_get("term")?,
            not_before: row.try_get("not_before")?,
            wait: Duration::try_from_secs_f64(wait).unwrap_or_default(),
            now: row.try_get("now")?,
        })
    }

    /// Renews the lease; false when another relay has taken over.
    pub async fn renew(&self, client: &Client) -> Result<bool, tokio_postgres::Error> {
        let (lease, fence) = self.seconds();
        let n = client
            .execute(&self.renew, &[&self.holder, &lease, &fence])
            .await?;
        Ok(n == 1)
    }

    /// Records a release with this relay's own Writes finished: the next leader waits only for
    /// `inherited`, what this one had to wait for.
    pub async fn release(
        &self,
        client: &Client,
        inherited: Option<SystemTime>,
    ) -> Result<(), tokio_postgres::Error> {
        client
            .execute(&self.release, &[&self.holder, &inherited])
            .await?;
        Ok(())
    }

    /// Ends the session holding the leadership lock if its lease has run out; returns its pid.
    pub async fn end_expired(
        &self,
        client: &Client,
        lock: (i32, i32),
    ) -> Result<Option<(i32, bool)>, tokio_postgres::Error> {
        let row = client
            .query_opt(
                &self.end_expired,
                &[&lock.0, &lock.1, &self.lease.as_secs_f64()],
            )
            .await?;
        row.map(|r| Ok((r.try_get("pid")?, r.try_get("ended")?)))
            .transpose()
    }

    /// Ends one session of this relay's own that it has given up on (its connection lost), if
    /// it still holds the leadership lock (`lock`'s keys) on the server. Returns whether it was
    /// ended.
    pub async fn end_session(
        &self,
        client: &Client,
        backend: Backend,
        lock: (i32, i32),
    ) -> Result<bool, tokio_postgres::Error> {
        let row = client
            .query_opt(
                &self.end_session,
                &[&backend.pid, &backend.started, &lock.0, &lock.1],
            )
            .await?;
        Ok(match row {
            Some(r) => r.try_get("ended")?,
            None => false,
        })
    }
}

/// This session's pid and start time.
pub async fn backend(client: &Client) -> Result<Backend, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(Backend {
        pid: row.try_get(0)?,
        started: row.try_get(1)?,
    })
}

/// A name for this run of this process in the leader record: host and pid for people, and a
/// random tag, because a restarted container has the same host name and pid (1) as the one that
/// crashed, and must not take that one's unclean exit for its own.
pub fn identity() -> String {
    // gethostname(2), not /proc/sys/kernel/hostname: the shipped unit's ProcSubset=pid hides
    // the latter.
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!(
        "{host} pid {} run {:08x}",
        std::process::id(),
        fastrand::u32(..)
    )
}
