//! The relay's dedicated connection: it LISTENs, holds the leadership lock, and holds the wake
//! lock while the relay sleeps.
//!
//! tokio-postgres hands notifications only to whoever drives the `Connection` with
//! `poll_message` (awaiting the connection as a future drops them), so a task here drives it and
//! turns each notification into a wake-up. A [`tokio::sync::Notify`] coalesces them: a burst of
//! notifications while the relay is draining costs one more pass, not one each.
//!
//! A heartbeat query notices a connection that died silently (a network cut sends no error)
//! within two heartbeat intervals; the session is then *lost* and the relay makes a new one.
//! While the session leads, the heartbeat renews the lease (see [`crate::leadership`]), and the
//! session counts as lost as soon as its lease has run out by the relay's own clock: a relay
//! that was stopped, or cut off, must not send once another may have taken over.

use crate::leadership::{Backend, Lease, Taken};
use crate::lease_clock::LeaseInstant;
use crate::renewals::Renewals;
use crate::schema::{LEADER_LOCK_CLASS, WAKE_LOCK_CLASS};
use crate::send_window::SendWindow;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The payload prefix of the notification a relay sends itself to check that notifications
/// reach it. Writers' notifications carry their table's oid (empty from an older trigger).
const PROBE_PREFIX: &str = "fga-relay probe ";

/// What the wake-up trigger of the table `oid` sends: `TG_RELID::text`, unsigned (the relay
/// keeps the oid's bits as an integer, the advisory locks' key).
fn wake_payload(oid: i32) -> String {
    (oid as u32).to_string()
}

/// How long the relay waits for writers to let go of the wake lock before it reads on a timer
/// for a while (see [`Session::take_wake_lock`]): writers' transactions are mostly a few
/// milliseconds; the heartbeat queued behind the wait is delayed by at most this.
pub const WAKE_LOCK_WAIT: Duration = Duration::from_millis(100);

/// How long a new session waits for its own test notification (see
/// `Session::check_notifications`).
pub const NOTIFICATION_PROBE_WAIT: Duration = Duration::from_secs(2);

/// What one heartbeat found.
enum Beat {
    /// Standing by, on the session it began on.
    Alive,
    /// Leading: the lease runs on.
    Renewed,
    /// Leading: the record names another session, on the session it began on.
    TakenOver,
    /// Another PostgreSQL session answered (a pooler in transaction mode, reported).
    Moved,
}

/// The pid of the session that answers, by a simple query (no prepared statement, which a
/// pooler could lose).
async fn backend_pid(client: &Client) -> Result<Option<i32>, tokio_postgres::Error> {
    Ok(first_int(
        &client.simple_query("SELECT pg_backend_pid()").await?,
    ))
}

/// The first column of the first row of a simple query's answer, as an integer.
fn first_int(answer: &[tokio_postgres::SimpleQueryMessage]) -> Option<i32> {
    answer.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
        _ => None,
    })
}

/// A dedicated connection and the tasks that watch it.
pub struct Session {
    client: Arc<Client>,
    /// Signalled by each notification on the channel.
    wake: Arc<Notify>,
    /// Cancelled when the connection ends or a heartbeat fails.
    lost: CancellationToken,
    /// The table's oid: the second key of the leadership and wake locks.
    oid: i32,
    /// This session's backend on the server.
    backend: Backend,
    lease: Arc<Lease>,
    pooler: Arc<crate::db::pooler::PoolerCheck>,
    /// While leading: until when a Write may leave, the lease by our own clock (see
    /// `send_window`).
    term: SendWindow,
    /// What the heartbeat did about the lease: said when the lease is found run out.
    renewals: Renewals,
    tasks: Vec<JoinHandle<()>>,
}

/// What a session is for.
pub struct SessionOptions<'a> {
    /// LISTEN on this channel (the `run` daemon); `None` for `drain`, which only leads.
    pub channel: Option<&'a str>,
    pub heartbeat: Duration,
    /// Called for each notification received.
    pub on_notification: Arc<dyn Fn() + Send + Sync>,
    /// The lease this session renews while it leads.
    pub lease: Arc<Lease>,
    /// Told when the session finds a pooler in transaction mode in between.
    pub pooler: Arc<crate::db::pooler::PoolerCheck>,
}

impl Session {
    /// Connects, starts the driver and the heartbeat, and LISTENs.
    pub async fn connect(
        cfg: &crate::db::PgConnect,
        oid: i32,
        opts: SessionOptions<'_>,
    ) -> Result<Session, tokio_postgres::Error> {
        let (client, connection) = crate::db::connect_dedicated(cfg).await?;
        let client = Arc::new(client);
        let wake = Arc::new(Notify::new());
        let lost = CancellationToken::new();
        // Until the session is made, a way out (an error, or the caller giving the connect up
        // at its bound) ends the driver and the heartbeat, and with them the connection: left
        // running, a heartbeat on a healthy connection would keep it open for good.
        let unmade = lost.clone().drop_guard();
        let probe = Arc::new(Notify::new());
        let probe_payload = format!("{PROBE_PREFIX}{}", fastrand::u64(..));

        let driver = tokio::spawn(drive(
            connection,
            Ears {
                wake: wake.clone(),
                lost: lost.clone(),
                probe: probe.clone(),
                probe_payload: probe_payload.clone(),
                on_notification: opts.on_notification.clone(),
                // Tables of one name in two schemas share the channel; each trigger names its
                // own.
                ours: wake_payload(oid),
            },
        ));

        let term = SendWindow::default();
        let renewals = Renewals::default();
        // The session's pid, once read: the heartbeat starts before.
        let first_pid = Arc::new(std::sync::OnceLock::new());
        let heartbeat = tokio::spawn(beat(Pulse {
            client: client.clone(),
            lost: lost.clone(),
            every: opts.heartbeat,
            lease: opts.lease.clone(),
            term: term.clone(),
            renewals: renewals.clone(),
            pooler: opts.pooler.clone(),
            first_pid: first_pid.clone(),
        }));

        crate::db::setup_session(cfg, &client).await?;
        let backend = crate::leadership::backend(&client).await?;
        let _ = first_pid.set(backend.pid);
        let session = Session {
            client,
            wake,
            lost,
            oid,
            backend,
            lease: opts.lease,
            pooler: opts.pooler,
            term,
            renewals,
            tasks: vec![driver, heartbeat],
        };
        // The session's own drop ends them from here on.
        unmade.disarm();
        if let Some(channel) = opts.channel {
            session
                .client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await?;
            session
                .check_notifications(channel, &probe, &probe_payload)
                .await?;
        }
        Ok(session)
    }

    /// Sends a notification to ourselves and waits briefly for it: through PgBouncer in
    /// transaction mode (or anything else that breaks LISTEN), it never arrives, and the relay
    /// can only find rows by sweeping. Says so loudly; does not fail.
    async fn check_notifications(
        &self,
        channel: &str,
        probe: &Notify,
        payload: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let arrived = probe.notified();
        self.client
            .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
            .await?;
        if tokio::time::timeout(NOTIFICATION_PROBE_WAIT, arrived)
            .await
            .is_err()
        {
            warn!(
                channel,
                "a test notification did not come back: notifications are not reaching this \
                 relay (is DATABASE_URL going through PgBouncer in transaction mode?). New rows \
                 will be found only by the sweep; point the relay at PostgreSQL directly or at a \
                 session-mode pool"
            );
        } else {
            info!(channel, "listening");
        }
        Ok(())
    }

    /// Whether the connection is gone (closed, failed, or silent past a heartbeat).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Resolves when the connection is gone.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Resolves at the next notification (or at once if one came since the last wait).
    pub fn wake(&self) -> &Notify {
        &self.wake
    }

    /// Tries to become the relay that delivers. Never blocks: a standby tries again later. On
    /// success, leadership is recorded with a fresh lease, which the heartbeat renews from now
    /// on; the caller must wait as [`Taken`] says before its first Write.
    pub async fn try_lead(&self) -> Result<Option<Taken>, tokio_postgres::Error> {
        if !self.try_lock(LEADER_LOCK_CLASS).await? {
            return Ok(None);
        }
        let sent = LeaseInstant::now();
        let taken = self.lease.take(&self.client).await?;
        self.renewals.answered(sent, true);
        self.term
            .open_until(sent + self.lease.lease - self.lease.margin);
        Ok(Some(taken))
    }

    /// Until when this session's Writes may leave; give it to every Write sent under its lease.
    pub fn send_window(&self) -> &SendWindow {
        &self.term
    }

    /// Whether this session leads and its lease still holds by our own clock. Past its end the
    /// session counts as lost at once: another relay may have ended it and be delivering.
    pub fn lease_valid(&self) -> bool {
        let now = LeaseInstant::now();
        match self.term.end() {
            Some(until) if now < until => true,
            Some(until) => {
                if !self.lost.is_cancelled() {
                    self.renewals.say_lapse(until, now);
                    self.lost.cancel();
                }
                false
            }
            None => false,
        }
    }

    /// Lets go of leadership, recording that this relay's own Writes are finished: the next
    /// leader waits only for `inherited`.
    pub async fn release_lead(
        &self,
        inherited: Option<SystemTime>,
    ) -> Result<(), tokio_postgres::Error> {
        self.term.close();
        self.lease.release(&self.client, inherited).await?;
        self.unlock(LEADER_LOCK_CLASS).await
    }

    /// Ends the session holding leadership if its lease has run out. Returns its pid, and
    /// whether PostgreSQL let us end it.
    pub async fn end_expired_leader(&self) -> Result<Option<(i32, bool)>, tokio_postgres::Error> {
        self.lease
            .end_expired(&self.client, (LEADER_LOCK_CLASS, self.oid))
            .await
    }

    /// Ends an earlier session of this relay's own (see [`Lease::end_session`]).
    pub async fn end_session(&self, backend: Backend) -> Result<bool, tokio_postgres::Error> {
        self.lease
            .end_session(&self.client, backend, (LEADER_LOCK_CLASS, self.oid))
            .await
    }

    /// The pid of the PostgreSQL session answering now: [`Session::backend`]'s, unless a
    /// pooler in transaction mode is in between.
    async fn current_pid(&self) -> Result<Option<i32>, tokio_postgres::Error> {
        backend_pid(&self.client).await
    }

    /// Looks for a pooler in transaction mode at once, rather than at its first lost statement:
    /// this session asks its pid, a pooled connection then holds a transaction open, and this
    /// session asks again. Through PostgreSQL (or a session-mode pool) the two are different
    /// sessions, each with a pid of its own for life. A transaction-mode pool hands the
    /// transaction the server session this connection let go just before (PgBouncer reuses the
    /// last one freed), or serves this connection from another than the one it began on. The
    /// pid is asked right before the transaction, once the pooled connection is made and set
    /// up: asked only at connect, another of the relay's statements freeing a server session in
    /// between could leave the one this session began on free for it to come back to. Reported
    /// to the session's `PoolerCheck`, which stops the relay; a failure to ask is left to the
    /// relay's usual paths.
    pub async fn probe_pooler(&self, pool: &deadpool_postgres::Pool) {
        // Taken out of the pool, closed when done: a probe cut short (its deadline) must not
        // give a connection back to the pool inside its transaction.
        let Ok(conn) = pool.get().await.map(deadpool_postgres::Object::take) else {
            return;
        };
        let before = self.current_pid().await.ok().flatten();
        let Ok(held) = conn.simple_query("BEGIN; SELECT pg_backend_pid()").await else {
            return;
        };
        let after = self.current_pid().await.ok().flatten();
        let _ = conn.simple_query("ROLLBACK").await;
        let was = self.backend.pid;
        if let Some(held) = first_int(&held)
            && (self.pooler.check_shared(was, held)
                || before.is_some_and(|before| self.pooler.check_shared(before, held)))
        {
            return;
        }
        for now in [before, after].into_iter().flatten() {
            if self.pooler.check_pid(was, now) {
                return;
            }
        }
    }

    /// This session's backend on the server.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Takes the wake lock before sleeping: from then on every writer notifies. `Ok(false)`:
    /// writers held it for all of [`WAKE_LOCK_WAIT`].
    ///
    /// It waits for the writers that hold it rather than only trying: under a steady stream of
    /// writers whose transactions overlap, some writer holds it at almost every instant, and a
    /// relay that only tried would rarely get it, and read on a timer instead of on
    /// notifications. While the relay's exclusive request is queued, writers' shared *tries*
    /// fail (PostgreSQL grants no lock that conflicts with a request waiting ahead of it), so
    /// they notify; those holding it commit and let go. The wait is bounded: a writer's
    /// transaction may stay open for minutes, and this connection also renews the lease.
    pub async fn take_wake_lock(&self) -> Result<bool, tokio_postgres::Error> {
        // One simple-query message runs as one implicit transaction: SET LOCAL bounds only this
        // wait, and the session-level lock, once granted, outlives the transaction. The keys
        // are this relay's own integers.
        let sql = format!(
            "SET LOCAL lock_timeout = '{}ms'; SELECT pg_advisory_lock({WAKE_LOCK_CLASS}, {})",
            WAKE_LOCK_WAIT.as_millis(),
            self.oid
        );
        match self.client.simple_query(&sql).await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the wake lock on waking: writers stop notifying while the relay is busy.
    pub async fn release_wake_lock(&self) -> Result<(), tokio_postgres::Error> {
        self.unlock(WAKE_LOCK_CLASS).await
    }

    async fn try_lock(&self, class: i32) -> Result<bool, tokio_postgres::Error> {
        let row = self
            .client
            .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&class, &self.oid])
            .await?;
        row.try_get(0)
    }

    async fn unlock(&self, class: i32) -> Result<(), tokio_postgres::Error> {
        self.client
            .query_one("SELECT pg_advisory_unlock($1, $2)", &[&class, &self.oid])
            .await?;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.lost.cancel();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What the dedicated connection's driver tells of what arrives on it.
struct Ears {
    wake: Arc<Notify>,
    lost: CancellationToken,
    /// The probe `check_notifications` sends itself, and where it says it arrived.
    probe: Arc<Notify>,
    probe_payload: String,
    on_notification: Arc<dyn Fn() + Send + Sync>,
    /// The payload of this table's trigger.
    ours: String,
}

/// Drives the dedicated connection until it ends or the session is lost: notifications wake
/// the stream (or answer the probe), notices are logged; an end of any kind loses the session.
async fn drive(
    mut connection: tokio_postgres::Connection<tokio_postgres::Socket, crate::db::TlsStream>,
    ears: Ears,
) {
    let Ears {
        wake,
        lost,
        probe,
        probe_payload,
        on_notification,
        ours,
    } = ears;
    loop {
        let msg = tokio::select! {
            m = poll_fn(|cx| connection.poll_message(cx)) => m,
            _ = lost.cancelled() => break,
        };
        match msg {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if n.payload() == probe_payload {
                    probe.notify_one();
                } else if n.payload() == ours || n.payload().is_empty() {
                    on_notification();
                    wake.notify_one();
                }
            }
            Some(Ok(AsyncMessage::Notice(n))) => {
                debug!(notice = %n.message(), "PostgreSQL notice");
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                warn!(error = %crate::db::describe(&e), "dedicated connection failed");
                break;
            }
            None => {
                warn!("dedicated connection closed by the server");
                break;
            }
        }
    }
    lost.cancel();
}

/// What the heartbeat needs.
struct Pulse {
    client: Arc<Client>,
    lost: CancellationToken,
    every: Duration,
    lease: Arc<Lease>,
    /// The send window the renewals move on.
    term: SendWindow,
    renewals: Renewals,
    pooler: Arc<crate::db::pooler::PoolerCheck>,
    /// The session's pid, once read.
    first_pid: Arc<std::sync::OnceLock<i32>>,
}

/// Beats until the session is lost: renews the lease while leading, and loses the session when
/// a beat fails, goes unanswered, or finds the session taken over or moved.
async fn beat(pulse: Pulse) {
    let every = pulse.every;
    // On a fixed cadence, not a heartbeat after the previous answer: renewals that
    // each take most of a heartbeat must not add up. Renewal k+1 is due one
    // heartbeat after renewal k was due and is answered within a heartbeat of that
    // (or the connection counts as dead), so it is answered before renewal k's
    // window (sent + lease - margin, the lease at least three heartbeats and the
    // margin one) ends; a term taken between two ticks is renewed at the next.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let due = tokio::select! {
            due = ticks.tick() => due,
            _ = pulse.lost.cancelled() => return,
        };
        let sent = LeaseInstant::now();
        let leading = pulse.term.end().is_some();
        // Only a renewal that may still extend the lease: one sent past its end (the process
        // continued after a stop) is not waited for.
        if pulse.term.end().is_some_and(|end| sent < end) {
            pulse.renewals.sent(sent);
        }
        let found = tokio::time::timeout_at(due + every, pulse.check(leading)).await;
        if !pulse.take(found, sent) {
            pulse.lost.cancel();
            return;
        }
    }
}

impl Pulse {
    /// One beat: a renewal while leading, else (or when the renewal found the record taken)
    /// the session's pid, whose change is a pooler in transaction mode (see `db::pooler`), not
    /// a takeover.
    async fn check(&self, leading: bool) -> Result<Beat, tokio_postgres::Error> {
        if leading && self.lease.renew(&self.client).await? {
            return Ok(Beat::Renewed);
        }
        let now = backend_pid(&self.client).await?;
        if let (Some(&was), Some(now)) = (self.first_pid.get(), now)
            && self.pooler.check_pid(was, now)
        {
            return Ok(Beat::Moved);
        }
        Ok(if leading {
            Beat::TakenOver
        } else {
            Beat::Alive
        })
    }

    /// Takes in what the beat sent at `sent` found (`Err`: no answer within a heartbeat).
    /// False when the session is lost.
    fn take(
        &self,
        found: Result<Result<Beat, tokio_postgres::Error>, tokio::time::error::Elapsed>,
        sent: LeaseInstant,
    ) -> bool {
        match found {
            Ok(Ok(Beat::Alive)) => true,
            Ok(Ok(Beat::Renewed)) => {
                self.renewed(sent);
                true
            }
            // Taken over while it was leading; a term let go meanwhile loses nothing.
            Ok(Ok(Beat::TakenOver)) => {
                let still = self.term.end().is_some();
                if still {
                    warn!("another relay has taken over leadership");
                }
                !still
            }
            Ok(Ok(Beat::Moved)) => false,
            Ok(Err(e)) => {
                self.pooler.check(&e);
                warn!(error = %crate::db::describe(&e), "heartbeat failed");
                false
            }
            Err(_) => {
                warn!(timeout = ?self.every, "heartbeat got no answer: the connection is dead");
                false
            }
        }
    }

    /// A renewal sent at `sent` was answered: the lease runs on from then.
    fn renewed(&self, sent: LeaseInstant) {
        let took = LeaseInstant::now().saturating_duration_since(sent);
        if took > self.every / 2 {
            // A renewal has one heartbeat to answer before the lease runs out by this relay's
            // clock: past half of it, said before it is too late.
            warn!(took = ?took, heartbeat = ?self.every, "the lease's renewal was slow to \
                answer: PostgreSQL may be waiting on its disk (a renewal commits durably); a \
                longer --heartbeat-interval and --leader-lease give it room");
        }
        // Too late to extend a lease already run out: that one stays run out.
        let in_time = self
            .term
            .extend_to(sent + self.lease.lease - self.lease.margin);
        self.renewals.answered(sent, in_time);
    }
}

#[cfg(test)]
mod tests {
    use super::wake_payload;

    #[test]
    fn the_wake_payload_is_the_oid_as_postgresql_prints_it() {
        assert_eq!(wake_payload(16_384), "16384");
        // An oid past 2^31 (a cluster that has made many objects) is negative as an integer.
        assert_eq!(wake_payload(i32::MIN), "2147483648");
        assert_eq!(wake_payload(-1), "4294967295");
    }
}
