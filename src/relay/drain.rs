//! `fga-relay drain`: delivers the rows pending at its start, leading itself when it can,
//! otherwise waiting for the relay that leads; the run loop's pieces (`nap`, `guarded_stream`,
//! the terms) are `Relay`'s, in `relay/mod.rs`. It streams until nothing is left to do now, as
//! often as needed.

use super::{Relay, Term};
use crate::delivery::{Deliverer, Mode};
use crate::listener::Session;
use crate::pass_log::Trigger;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

impl Relay {
    /// `fga-relay drain`: delivers every row pending at the start, itself if it can lead,
    /// otherwise by waiting for the relay that leads. Returns how many of those rows are still
    /// pending at the end (0 is success). Leadership, if taken, is let go on every way out,
    /// errors included.
    pub async fn drain(
        &self,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> Result<i64, crate::store::StoreError> {
        self.pooler.stops(&shutdown);
        let timer = CancellationToken::new();
        {
            let timer = timer.clone();
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                timer.cancel();
            });
        }
        let Some(target) = self.store.max_pending_id().await? else {
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
        self.store.pending_through(target).await
    }

    /// The loop of [`Relay::drain`]; `term` is set while it leads on `session`.
    async fn drain_through(
        &self,
        target: i64,
        shutdown: &CancellationToken,
        timer: &CancellationToken,
        session: &mut Option<Session>,
        term: &mut Option<Term>,
    ) -> Result<(), crate::store::StoreError> {
        let at_start = self.store.pending_through(target).await?;
        info!(
            rows = at_start,
            through_id = target,
            "draining the rows pending now"
        );
        let mut deliverer = self.deliverer();
        let mut waiting_logged = false;
        let mut db_failures = 0u32;
        // A lost pooled connection, a server restarting: waited out until the timeout, as `run`
        // does, rather than ending the drain long before it. A missing table or privilege, or a
        // read-only server, ends it.
        let ride_out = |e: &crate::store::StoreError| {
            // First: a pooler's signs (42P05 among them) are also errors no waiting fixes.
            !self.pooled(e)
                && e.is_retryable()
                && !e.is_read_only()
                && !timer.is_cancelled()
                && !shutdown.is_cancelled()
        };
        loop {
            let left = match self.store.pending_through(target).await {
                Ok(left) => left,
                Err(e) if ride_out(&e) => {
                    // Stopped meanwhile: the loop's next look says so.
                    self.db_backoff(&e, &mut db_failures, &[shutdown, timer])
                        .await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if left == 0 {
                info!(
                    rows = at_start,
                    "none of the rows pending at the start is pending now (delivered or dead)"
                );
                return Ok(());
            }
            if timer.is_cancelled() || shutdown.is_cancelled() {
                warn!(left, "rows still pending at the timeout");
                return Ok(());
            }
            if !self
                .drain_leads(
                    &mut deliverer,
                    session,
                    term,
                    &[shutdown, timer],
                    &mut waiting_logged,
                )
                .await
            {
                continue;
            }
            let Some(s) = session.as_ref() else {
                continue;
            };
            let keep_going = || {
                !shutdown.is_cancelled() && !timer.is_cancelled() && !s.is_lost() && s.lease_valid()
            };
            let stop = [shutdown, timer, s.lost()];
            let Some(report) = self
                .guarded_stream(&mut deliverer, s, &keep_going, &stop, Mode::UntilIdle)
                .await
            else {
                continue;
            };
            let report = match report {
                Ok(report) => {
                    db_failures = 0;
                    report
                }
                Err(e) if ride_out(&e) => {
                    // Stopped meanwhile: the loop's next look says so.
                    self.db_backoff(&e, &mut db_failures, &[shutdown, timer])
                        .await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.account(Trigger::Again, &report);
            // Nothing left to do now: rows held back are due later, or the pending count did not
            // yet see what was just marked.
            let wait = (!report.did_work()).then(|| {
                report
                    .next_due
                    .map(|at| at.saturating_duration_since(Instant::now()))
                    .unwrap_or(Duration::from_millis(50))
            });
            if let Some(w) = wait {
                debug!(wait = ?w, "nothing to do now; looking again after the wait");
                self.nap(w, &[shutdown, timer]).await;
            }
        }
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
        waiting_logged: &mut bool,
    ) -> bool {
        if session.as_ref().is_none_or(Session::is_lost) {
            if let Some(old) = session.take() {
                self.abandon(&old);
            }
            *term = None;
            *session = self
                .connect(false)
                .await
                .map_err(|e| {
                    self.pooler.check(&e);
                    warn!(error = %crate::db::describe(&e), "cannot connect")
                })
                .ok();
        }
        let Some(s) = session.as_ref() else {
            self.nap(Duration::from_millis(200), stop).await;
            return false;
        };
        if term.is_some() {
            return true;
        }
        let taken = s.try_lead().await.map_err(|e| self.pooler.check(&e));
        let Some(taken) = taken.ok().flatten() else {
            if !std::mem::replace(waiting_logged, true) {
                info!("another relay is delivering; waiting for it");
            }
            self.nap(Duration::from_millis(100), stop).await;
            return false;
        };
        let stops: Vec<&CancellationToken> = stop.iter().copied().chain([s.lost()]).collect();
        let (t, waited) = self.begin_term(taken, &stops).await;
        *term = Some(t);
        if waited {
            deliverer.forget();
        }
        waited
    }
}
