//! `fga-relay drain`: delivers the rows pending at its start, leading itself when it can,
//! otherwise waiting for the relay that leads; the run loop's pieces (`nap`, `guarded_stream`,
//! the terms) are `Relay`'s, in `relay/mod.rs`. It streams until nothing is left to do now, as
//! often as needed.
//!
//! Its own statements, outside the stream (how many rows are pending, how many are left; its
//! session's connect), are bounded by its timeout: nothing else ends a wait on a connection
//! whose path froze (no byte passes, nothing is closed, and the kernel still acknowledges bytes,
//! so neither keepalives nor `tcp_user_timeout` fire). A count that takes longer than a
//! heartbeat is asked again on a new connection, so that a drain whose old connections froze
//! still delivers on new ones.

use super::{NoSession, Relay, Stalls, Term};
use crate::db::hint;
use crate::delivery::{Deliverer, Mode, PassReport};
use crate::listener::Session;
use crate::pass_log::Trigger;
use crate::recurring::Recurring;
use crate::shutdown::any_cancelled;
use crate::store::StoreError;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// How long after its timeout (or a stop) `drain` waits for its last count of the rows left: a
/// count answers in milliseconds, and the drain must exit by about its timeout.
pub const LAST_COUNT_GRACE: Duration = Duration::from_secs(5);

/// How long `drain` waits before asking for leadership again on a new session, after asking
/// failed with an error.
const LEAD_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// What `drain` has said while it does not lead.
#[derive(Default)]
struct Waiting {
    /// That it waits for the relay delivering.
    announced: bool,
    /// That PostgreSQL did not let it end a leader whose lease ran out.
    refused: bool,
    /// Errors asking for leadership: said once a minute while they last.
    recurring: Recurring,
    /// Tries to open a session that stalled, in a row.
    stalls: Stalls,
}

/// What `drain`'s loop keeps from one look to the next.
struct Draining<'a> {
    /// Its shutdown and its timeout.
    stops: [&'a CancellationToken; 2],
    deliverer: Deliverer,
    waiting: Waiting,
    /// Database errors ridden out in a row.
    db_failures: u32,
}

/// How `drain` failed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A count of the rows (pending at the start, or left) got no answer before the drain had
    /// to stop, even asked again on a new connection: it cannot say what became of them.
    #[error(
        "cannot count the rows {0}: PostgreSQL did not answer before drain had to stop (its \
         timeout, and {LAST_COUNT_GRACE:?} more for its last count), even on a new connection; \
         something between the relay and PostgreSQL may have stopped passing bytes (a proxy or \
         tunnel that no longer forwards). Rows may still be pending: `fga-relay status` counts \
         them; once the path to the database works, run `fga-relay drain` again"
    )]
    Unanswered(&'static str),
}

impl Relay {
    /// `fga-relay drain`: delivers every row pending at the start, itself if it can lead,
    /// otherwise by waiting for the relay that leads. Returns how many of those rows are still
    /// pending at the end (0 is success). Leadership, if taken, is let go on every way out,
    /// errors included.
    pub async fn drain(
        &self,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> Result<i64, DrainError> {
        self.pooler.stops(&shutdown);
        let timer = CancellationToken::new();
        {
            let timer = timer.clone();
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                timer.cancel();
            });
        }
        let stops = [&shutdown, &timer];
        let stopped = || any_cancelled(&stops);
        let Some(first) = self
            .ask("pending", || self.store.max_pending_id(), stopped())
            .await
        else {
            return Err(DrainError::Unanswered("pending"));
        };
        let Some(target) = first? else {
            info!("nothing pending");
            return Ok(0);
        };
        let mut session: Option<Session> = None;
        let mut term: Option<Term> = None;
        let result = self
            .drain_through(target, &shutdown, &timer, &mut session, &mut term)
            .await;
        if let (Some(s), Some(term)) = (session.as_ref(), term.as_ref()) {
            if s.is_lost() {
                error!("lost the connection while leading");
            } else {
                self.end_term(s, term).await;
            }
        }
        result?;
        let last = async {
            stopped().await;
            tokio::time::sleep(LAST_COUNT_GRACE).await;
        };
        let Some(left) = self
            .ask("left", || self.store.pending_through(target), last)
            .await
        else {
            return Err(DrainError::Unanswered("left"));
        };
        let left = left?;
        if left > 0 {
            warn!(left, "rows still pending at the timeout");
        }
        Ok(left)
    }

    /// Runs `statement`, one of drain's own (a count, its report), as [`Relay::ask`] does, given
    /// up when `stop` ends: `drain` must exit by about its timeout whatever the path to
    /// PostgreSQL does.
    pub async fn drain_count<T, F, Fut>(
        &self,
        what: &'static str,
        statement: F,
        stop: impl Future<Output = ()>,
    ) -> Result<T, DrainError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        match self.ask(what, statement, stop).await {
            Some(answer) => Ok(answer?),
            None => Err(DrainError::Unanswered(what)),
        }
    }

    /// Runs `statement`, one of drain's own (a count), outside the stream and its guard: None if
    /// `stop` ends first. Unanswered within a heartbeat, it is asked again on a new connection,
    /// the pool's idle ones dropped first (they share the path of the one it waits on), and the
    /// first answer is taken: the first ask keeps its chance, so a count that is only slow (a
    /// large backlog) is not lost. When the first ask did not answer, the pool is emptied once
    /// it is dropped (its connection goes back to the pool, and may be frozen): whatever comes
    /// next runs on new connections.
    async fn ask<T, F, Fut>(
        &self,
        what: &str,
        statement: F,
        stop: impl Future<Output = ()>,
    ) -> Option<Result<T, StoreError>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let after = self.delivery.heartbeat_interval;
        let (answer, by_first) = async {
            let first = statement();
            tokio::pin!(first, stop);
            tokio::select! {
                r = &mut first => return (Some(r), true),
                () = &mut stop => return (None, false),
                () = tokio::time::sleep(after) => {}
            }
            warn!(after = ?after, "PostgreSQL has not answered how many rows are {what}; asking \
                again on a new connection (the one asked may have stopped passing bytes)");
            self.store.pool().retain(|_, _| false);
            tokio::select! {
                r = &mut first => (Some(r), true),
                r = statement() => (Some(r), false),
                () = &mut stop => (None, false),
            }
        }
        .await;
        // The asks given up are dropped by now, their connections back in the pool.
        if !by_first {
            self.store.pool().retain(|_, _| false);
        }
        if answer.is_none() {
            warn!(
                "PostgreSQL did not answer how many rows are {what} before the drain had to \
                stop; gave up on the connection asked"
            );
        }
        answer
    }

    /// The loop of [`Relay::drain`]; `term` is set while it leads on `session`. Each look
    /// counts the rows left, and leads and streams once while any is.
    async fn drain_through(
        &self,
        target: i64,
        shutdown: &CancellationToken,
        timer: &CancellationToken,
        session: &mut Option<Session>,
        term: &mut Option<Term>,
    ) -> Result<(), StoreError> {
        let stops = [shutdown, timer];
        // Not answered by the timeout: the last count says what is left.
        let Some(at_start) = self.count_left(target, &stops).await.transpose()? else {
            return Ok(());
        };
        info!(
            rows = at_start,
            through_id = target,
            "draining the rows pending now"
        );
        let mut draining = Draining {
            stops,
            deliverer: self.deliverer(),
            waiting: Waiting::default(),
            db_failures: 0,
        };
        loop {
            if stops.iter().any(|s| s.is_cancelled()) {
                // The last count says what is left.
                return Ok(());
            }
            let left = match self.count_left(target, &stops).await {
                // Not answered by the timeout: the last count says what is left.
                None => return Ok(()),
                Some(Ok(left)) => left,
                Some(Err(e)) => {
                    self.ride_out(e, &mut draining.db_failures, &stops).await?;
                    continue;
                }
            };
            if left == 0 {
                info!(
                    rows = at_start,
                    "none of the rows pending at the start is pending now (delivered or dead)"
                );
                return Ok(());
            }
            self.drain_once(&mut draining, session, term).await?;
        }
    }

    /// How many of the rows through `target` are pending (see [`Relay::ask`]).
    async fn count_left(
        &self,
        target: i64,
        stops: &[&CancellationToken; 2],
    ) -> Option<Result<i64, StoreError>> {
        self.ask(
            "left",
            || self.store.pending_through(target),
            any_cancelled(stops),
        )
        .await
    }

    /// Leads if it can, then streams once while it does.
    async fn drain_once(
        &self,
        d: &mut Draining<'_>,
        session: &mut Option<Session>,
        term: &mut Option<Term>,
    ) -> Result<(), StoreError> {
        if !self
            .drain_leads(&mut d.deliverer, session, term, &d.stops, &mut d.waiting)
            .await
        {
            return Ok(());
        }
        let Some(s) = session.as_ref() else {
            return Ok(());
        };
        match self.drain_stream(&mut d.deliverer, s, &d.stops).await {
            // Given up: the session is made anew.
            None => {}
            Some(Ok(report)) => {
                d.db_failures = 0;
                self.after_stream(&report, &d.stops).await;
            }
            Some(Err(e)) => self.ride_out(e, &mut d.db_failures, &d.stops).await?,
        }
        Ok(())
    }

    /// One stream while `drain` leads on `s`, until nothing is left to do now; None when it was
    /// given up (see [`Relay::guarded_stream`]).
    async fn drain_stream(
        &self,
        deliverer: &mut Deliverer,
        s: &Session,
        stops: &[&CancellationToken; 2],
    ) -> Option<Result<PassReport, StoreError>> {
        let [shutdown, timer] = *stops;
        let keep_going =
            || !shutdown.is_cancelled() && !timer.is_cancelled() && !s.is_lost() && s.lease_valid();
        let stop = [shutdown, timer, s.lost()];
        self.guarded_stream(deliverer, s, &keep_going, &stop, Mode::UntilIdle)
            .await
    }

    /// Says what a stream did; when it did nothing (rows held back are due later, or the
    /// pending count did not yet see what was just marked), waits before the next look.
    async fn after_stream(&self, report: &PassReport, stops: &[&CancellationToken]) {
        self.account(Trigger::Again, report);
        if report.did_work() {
            return;
        }
        let wait = report
            .next_due
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(50));
        debug!(wait = ?wait, "nothing to do now; looking again after the wait");
        self.nap(wait, stops).await;
    }

    /// A database error in the drain's loop: waited out (backing off) until the timeout, as
    /// `run` does, when it may heal (a lost pooled connection, a server restarting), rather than
    /// ending the drain long before it; returned otherwise (a missing table or privilege, a
    /// read-only server, a pooler's signs, 42P05 among them, which no waiting fixes). Stopped
    /// meanwhile, the loop's next look says so.
    async fn ride_out(
        &self,
        e: StoreError,
        failures: &mut u32,
        stops: &[&CancellationToken],
    ) -> Result<(), StoreError> {
        // The pooler's signs first: they are also retryable errors.
        let heals = !self.pooled(&e) && e.is_retryable() && !e.is_read_only();
        if !heals || stops.iter().any(|s| s.is_cancelled()) {
            return Err(e);
        }
        self.db_backoff(&e, failures, stops).await;
        Ok(())
    }

    /// Makes sure `drain` leads on a live session: connects anew after a loss, and takes
    /// leadership (waiting out the fence) when it has no term. False when it does not lead yet
    /// (it has waited a little, or was stopped): the caller looks again.
    async fn drain_leads(
        &self,
        deliverer: &mut Deliverer,
        session: &mut Option<Session>,
        term: &mut Option<Term>,
        stop: &[&CancellationToken],
        waiting: &mut Waiting,
    ) -> bool {
        if session.as_ref().is_none_or(Session::is_lost) {
            if let Some(old) = session.take() {
                self.abandon(&old);
            }
            *term = None;
            *session = self.drain_connect(stop, &mut waiting.stalls).await;
        }
        let Some(s) = session.as_ref() else {
            self.nap(Duration::from_millis(200), stop).await;
            return false;
        };
        if term.is_some() {
            return true;
        }
        let taken = match s.try_lead().await {
            Ok(Some(taken)) => taken,
            Ok(None) => {
                self.wait_for_leader(s, stop, waiting).await;
                return false;
            }
            // Said with its cause and next step, as `run` says it, and asked again on a new
            // session: this one may hold the leadership lock without a lease (the lock taken,
            // the lease's record refused), and asking again on it would only stack the lock.
            Err(e) => {
                self.pooler.check(&e);
                let why = self.explain(&e).await;
                hint::log("cannot ask for leadership", &why, None, &waiting.recurring);
                // As a lost session: it may hold the lock on the server still (the lock taken,
                // its answer lost), and is ended from the next one.
                if let Some(old) = session.take() {
                    self.abandon(&old);
                }
                self.nap(LEAD_AGAIN_AFTER, stop).await;
                return false;
            }
        };
        let stops: Vec<&CancellationToken> = stop.iter().copied().chain([s.lost()]).collect();
        let (t, waited) = self.begin_term(taken, &stops).await;
        *term = Some(t);
        if waited {
            deliverer.forget();
        }
        waited
    }

    /// A session for `drain`, or None (said why). Bounded (see `Relay::open_limit`), and by the
    /// drain's stop: stopped meanwhile, the caller's next look says so.
    async fn drain_connect(
        &self,
        stop: &[&CancellationToken],
        stalls: &mut Stalls,
    ) -> Option<Session> {
        tokio::select! {
            opened = self.open(false, stalls) => match opened {
                Ok(s) => Some(s),
                Err(NoSession::Failed(e)) => {
                    self.pooler.check(&e);
                    warn!(error = %crate::db::describe(&e), "cannot connect");
                    None
                }
                Err(NoSession::Stalled(limit)) => {
                    let why = hint::stalled(limit, &self.pg.get());
                    warn!(error = %why.error, next = why.next.as_deref(), "cannot connect");
                    None
                }
            },
            () = any_cancelled(stop) => {
                warn!("gave up connecting to PostgreSQL to lead: the drain had to stop \
                    first (a path to the database that lets connections in but no bytes \
                    through?)");
                None
            }
        }
    }

    /// Another relay leads: said once. A leader stopped or cut off lets its lease run out:
    /// ended, as `run` ends it, rather than waited for until the drain's timeout.
    async fn wait_for_leader(
        &self,
        s: &Session,
        stop: &[&CancellationToken],
        waiting: &mut Waiting,
    ) {
        if !std::mem::replace(&mut waiting.announced, true) {
            info!("another relay is delivering; waiting for it");
        }
        let ended = self.end_expired_leader(s, &mut waiting.refused).await;
        if let Err(e) = &ended {
            debug!(error = %crate::db::describe(e), "cannot check the leader's lease");
        }
        if !matches!(ended, Ok(true)) {
            self.nap(Duration::from_millis(100), stop).await;
        }
    }
}
