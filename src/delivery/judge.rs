//! The judgement of a Write's answer: what it means for its rows (strikes, halving, dead
//! letters) and for the relay (backoff, the window).
//!
//! - Transient, for a Write of several rows: the relay cannot tell an outage from one bad row,
//!   so it backs off as a whole and the rows of that Write are next sent in Writes half as large.
//!   When a smaller Write succeeds it was not an outage, and the halving finds the culprit.
//! - Transient, for a row alone: its failure is compared with everyone's. If other Writes
//!   succeeded since its previous failure and nearly all the other Writes of the last minute
//!   succeeded (at least four, at most a quarter failed), the failure is the row's own, a
//!   *strike*: the row is held with its own backoff while the others flow, and after
//!   `max_attempts` strikes it is dead-lettered. Otherwise the failure hits other rows too (an
//!   outage, a flaky or overloaded server): the whole relay backs off, the row is held just past
//!   that wait so that the others are tried first, and nothing counts toward dead-lettering.
//! - Throttled (429): never the rows' fault. Nothing is halved and nothing is a strike; the
//!   whole relay waits for `Retry-After` (or its own backoff) and sends the same rows again.
//!   A `Retry-After` sent with any other failure is waited for too, on every path.
//! - The store or model the rows name does not exist (a row's `store_id` or
//!   `authorization_model_id`): every row of the Write is dead-lettered with OpenFGA's answer.
//! - Permanent for one operation (`Invalid tuple …`, a condition conflict): that row is
//!   dead-lettered with OpenFGA's message; the rest of the Write is sent again without it.
//! - Already applied (an older OpenFGA's answer to a duplicate write or missing delete): that
//!   operation counts as done. A row whose last operation it was is marked delivered in that
//!   Write's transaction, before anything releases its tuples.
//! - A row that cannot be dead-lettered when given up on (another session holds it) stays
//!   pending and blocks its tuples, as any row the pass could not take.
//! - Configuration (auth, store, model, garbage answers, a proxy's refusal): loud error, and the
//!   whole relay backs off slowly. A proxy may refuse only the Writes carrying one row's content
//!   (a web application firewall), so these are halved and judged alone as transient failures
//!   are: a row refused alone while nearly all other Writes succeed is struck, held and in the
//!   end dead-lettered; when every Write is refused (wrong settings), nothing is.
//!
//! Every failed attempt updates `attempts` and `last_error` of the rows concerned.

use super::order::{Candidate, Plan};
use super::write::{Answer, Flight};
use super::{Deliverer, Flow, PassReport};
use crate::backoff::Backoff;
use crate::openfga::{FailureClass, Target, WriteError};
use crate::store::StoreError;
use deadpool_postgres::GenericClient;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

/// Backoff of the whole relay after a failure that looks like an outage. Capped low so that
/// delivery resumes within a couple of seconds of OpenFGA coming back.
pub const OUTAGE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// Backoff of the whole relay after a configuration error: only the operator can fix it, so
/// retry slowly and keep the logs readable.
pub const CONFIG_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// Backoff of one row that keeps failing while others are delivered.
pub const ROW_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// Whom a failure is judged against (see `stores.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// Every Write fails alike: the relay backs off.
    Relay,
    /// The Writes of one store fail while others' succeed: that store is held.
    Store,
}

impl Deliverer {
    /// A Write succeeded: grow the window by one Write per window's worth of successes.
    pub(super) fn widen(&mut self) {
        let max = self.settings.max_in_flight.max(1) as f64;
        self.window = (self.window + 1.0 / self.window).min(max);
        self.metrics.write_window.set(self.window() as i64);
    }

    /// OpenFGA struggles (429, 5xx, timeout): halve the window.
    pub(super) fn narrow(&mut self) {
        self.window = (self.window / 2.0).max(1.0);
        self.metrics.write_window.set(self.window() as i64);
    }

    /// A Write answered (or not sent, its rows held elsewhere): account for it.
    pub(super) async fn landed(
        &mut self,
        flight: Flight,
        answer: Result<Answer, StoreError>,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<Flow, StoreError> {
        let finished = match &answer {
            Ok(Answer::Sent(Err(e))) => flight.finished_by(e),
            _ => None,
        };
        let Flight { plan, .. } = flight;
        let n_ops = plan.n_ops();
        if let Some(id) = finished {
            // Marked delivered in the Write's transaction (see `Flight::send`); the other rows
            // are sent again without it.
            debug!(id, "OpenFGA already had the row's last operation applied");
            let mut rest = Vec::new();
            for c in plan.into_rows() {
                if c.id == id {
                    self.row_delivered(&c, report);
                } else {
                    rest.push(c);
                }
            }
            Self::requeue(queue, rest);
            return Ok(Flow::Continue);
        }
        match answer? {
            Answer::Deferred => {
                Self::requeue(queue, plan.into_rows());
                Ok(Flow::Stop)
            }
            Answer::Held(missing) => {
                // Another session holds some of these rows (a relay that lost leadership but
                // has not stopped yet): they may be on their way to OpenFGA. Nothing after them
                // on their tuples may go; the others are planned again.
                let mut rest = Vec::new();
                for c in plan.into_rows() {
                    if missing.contains(&c.id) {
                        blocked.extend(c.hashes.iter().copied());
                        report.held += 1;
                        report.locked += 1;
                    } else {
                        rest.push(c);
                    }
                }
                Self::requeue(queue, rest);
                Ok(Flow::Continue)
            }
            Answer::Sent(Ok(())) => {
                self.widen();
                self.on_success(plan, n_ops, queue, report);
                Ok(Flow::Continue)
            }
            Answer::Sent(Err(e)) => {
                // One store's failure leaves the window to the others.
                if matches!(
                    e,
                    WriteError::Transient { .. } | WriteError::Throttled { .. }
                ) && self.scope_of(&plan.target, &e) == Scope::Relay
                {
                    self.narrow();
                }
                let conn = self.store.pool().get().await?;
                self.on_failure(&conn, plan, e, queue, blocked, report)
                    .await
            }
        }
    }

    pub(super) fn on_success(
        &mut self,
        plan: Plan,
        n_ops: usize,
        queue: &mut BTreeMap<i64, Candidate>,
        report: &mut PassReport,
    ) {
        self.epoch += 1;
        self.streak = 0;
        let alone = (plan.rows.len() == 1).then(|| plan.rows[0].0.id);
        self.note(false, alone, &plan.target);
        self.metrics.tuples_delivered.inc_by(n_ops as u64);
        let mut unfinished = Vec::new();
        for (c, idx) in plan.rows {
            let all = c.ops.len();
            let memo_done = self.memo.get(&c.id).map_or(0, |m| m.done.len());
            if memo_done + idx.len() >= all {
                // Marked delivered in the Write's own transaction already.
                self.row_delivered(&c, report);
            } else {
                // A part of a large row: remember it, send the rest next.
                self.memo.entry(c.id).or_default().done.extend(idx);
                unfinished.push(c);
            }
        }
        Self::requeue(queue, unfinished);
    }

    pub(super) async fn on_failure(
        &mut self,
        tx: &impl GenericClient,
        plan: Plan,
        e: WriteError,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<Flow, StoreError> {
        match e {
            WriteError::AlreadyApplied {
                op: Some(i),
                ref message,
            } => {
                // Success for that operation; send the rest again.
                debug!(ids = ?plan.ids(), %message, "OpenFGA already had this operation applied");
                if let Some((r, op)) = Self::locate(&plan, i) {
                    self.memo
                        .entry(plan.rows[r].0.id)
                        .or_default()
                        .done
                        .insert(op);
                    Self::requeue(queue, plan.into_rows());
                    return Ok(Flow::Continue);
                }
                self.split_or_dead_letter(tx, plan, &e, queue, blocked, report)
                    .await
            }
            WriteError::AlreadyApplied { op: None, .. } | WriteError::Rejected { op: None, .. } => {
                self.split_or_dead_letter(tx, plan, &e, queue, blocked, report)
                    .await
            }
            WriteError::Rejected { op: Some(i), .. } => {
                self.metrics.failed("permanent");
                report.failed_writes += 1;
                let Some((r, _)) = Self::locate(&plan, i) else {
                    return self
                        .split_or_dead_letter(tx, plan, &e, queue, blocked, report)
                        .await;
                };
                let mut rows: Vec<Candidate> = plan.into_rows();
                let bad = rows.remove(r);
                self.give_up(tx, &bad, &e.to_string(), blocked, report)
                    .await?;
                Self::requeue(queue, rows);
                Ok(Flow::Continue)
            }
            WriteError::UnknownTarget { .. } => {
                // Every row of a Write names its store and model: none of them can go.
                self.metrics.failed("permanent");
                report.failed_writes += 1;
                let reason = e.to_string();
                for c in plan.into_rows() {
                    self.give_up(tx, &c, &reason, blocked, report).await?;
                }
                Ok(Flow::Continue)
            }
            WriteError::TooManyTuples { limit, ref message } => {
                let lower = limit.unwrap_or(self.max_tuples / 2).max(1);
                if lower < self.max_tuples && self.max_tuples > 1 {
                    error!(
                        configured = self.max_tuples,
                        server_limit = lower,
                        %message,
                        "OpenFGA allows fewer tuples per write than --max-tuples-per-write; \
                         using its limit (set FGA_RELAY_MAX_TUPLES_PER_WRITE={lower})"
                    );
                    self.max_tuples = lower;
                    Self::requeue(queue, plan.into_rows());
                    return Ok(Flow::Continue);
                }
                self.outage(tx, &plan, &e, blocked, report, CONFIG_BACKOFF, Scope::Relay)
                    .await?;
                Ok(Flow::Stop)
            }
            WriteError::TooLarge { .. } => {
                // A proxy's body limit or gRPC's: a smaller Write may pass; a row alone cannot
                // shrink, unless it is sent in parts already.
                self.split_or_dead_letter(tx, plan, &e, queue, blocked, report)
                    .await
            }
            WriteError::NotSent => {
                // `Flight::send` defers these before they get here; should one come, it was
                // never sent and is nothing against its rows.
                Self::requeue(queue, plan.into_rows());
                Ok(Flow::Stop)
            }
            WriteError::Configuration { .. } | WriteError::Unexpected { .. } => {
                // Wrong settings fail every Write; a proxy refusing one row's content (a web
                // application firewall) fails only the Writes carrying that row. Halving tells
                // them apart, as for transient failures, with the slow backoff of the former.
                self.halve_or_hold(tx, plan, &e, blocked, report, CONFIG_BACKOFF)
                    .await
            }
            WriteError::Throttled { .. } => {
                // Not the rows' fault: the same Write, after the wait. Rows held back by the
                // outage path are due again once the wait is over.
                self.outage(tx, &plan, &e, blocked, report, OUTAGE_BACKOFF, Scope::Relay)
                    .await?;
                Ok(Flow::Stop)
            }
            WriteError::Transient { .. } => {
                self.halve_or_hold(tx, plan, &e, blocked, report, OUTAGE_BACKOFF)
                    .await
            }
        }
    }

    /// A permanent answer that does not say which row: split the Write to find out, or, for a
    /// row alone, dead-letter it (a part of a row sent in parts found too large is halved).
    pub(super) async fn split_or_dead_letter(
        &mut self,
        tx: &impl GenericClient,
        plan: Plan,
        e: &WriteError,
        queue: &mut BTreeMap<i64, Candidate>,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<Flow, StoreError> {
        self.metrics.failed("permanent");
        report.failed_writes += 1;
        if plan.rows.len() > 1 {
            let half = plan.rows.len() / 2;
            for (c, _) in &plan.rows {
                self.memo.entry(c.id).or_default().max_rows = Some(half);
            }
            let ids = plan.ids();
            debug!(?ids, error = %e, "OpenFGA rejected a write without naming the tuple; splitting it");
            Self::requeue(queue, plan.into_rows());
            return Ok(Flow::Continue);
        }
        let (c, idx) = plan.rows.into_iter().next().expect("a plan has rows");
        if matches!(e, WriteError::AlreadyApplied { .. }) && idx.len() == 1 {
            self.memo.entry(c.id).or_default().done.insert(idx[0]);
            queue.insert(c.id, c);
            return Ok(Flow::Continue);
        }
        if matches!(e, WriteError::TooLarge { .. }) && idx.len() > 1 && idx.len() < c.ops.len() {
            // A part of a row already sent in parts, not in one transaction: a part of the
            // relay's choosing is no reason to give the row up. Only a tuple too large alone is.
            let half = idx.len() / 2;
            debug!(id = c.id, part = idx.len(), half, error = %e,
                "a part of a row is too large; halving its parts");
            self.memo.entry(c.id).or_default().max_part = Some(half);
            queue.insert(c.id, c);
            return Ok(Flow::Continue);
        }
        self.give_up(tx, &c, &e.to_string(), blocked, report)
            .await?;
        Ok(Flow::Continue)
    }

    /// A failure that may be an outage (or wrong settings) or one row's own. A Write of several
    /// rows backs the whole relay off on `schedule` and its rows are next sent in Writes half as
    /// large. A row alone is struck if the failure is its own (see the module's "Failures"),
    /// else held just past the relay's wait.
    pub(super) async fn halve_or_hold(
        &mut self,
        tx: &impl GenericClient,
        plan: Plan,
        e: &WriteError,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
        schedule: Backoff,
    ) -> Result<Flow, StoreError> {
        let alone = (plan.rows.len() == 1).then(|| plan.rows[0].0.id);
        let scope = self.scope_of(&plan.target, e);
        self.note(true, alone, &plan.target);
        if plan.rows.len() > 1 {
            let half = (plan.rows.len() / 2).max(1);
            for (c, _) in &plan.rows {
                let m = self.memo.entry(c.id).or_default();
                m.max_rows = Some(half);
                m.failed_epoch = Some(self.epoch);
            }
            self.outage(tx, &plan, e, blocked, report, schedule, scope)
                .await?;
            return Ok(Self::after(scope));
        }
        let id = plan.rows[0].0.id;
        let epoch = self.epoch;
        let others_succeed = self.others_nearly_all_succeed(id, &plan.target);
        let streak = self.streak;
        let m = self.memo.entry(id).or_default();
        // Other Writes to its store succeeded since this row last failed, and nearly all
        // Writes to its store but this row's do: the row, not OpenFGA, is the problem. A
        // failure others share is no strike.
        let strike = m.failed_epoch.is_some_and(|e| e != epoch) && others_succeed;
        m.failed_epoch = Some(epoch);
        m.max_rows = Some(1);
        if !strike {
            // Held just past the wait of the relay (or of its store), so that the next pass
            // sends the other rows first: how they fare tells an outage from this row's own
            // failure.
            let held = self
                .outage(tx, &plan, e, blocked, report, schedule, scope)
                .await?;
            let wait = match held {
                Some(until) => until.saturating_duration_since(Instant::now()),
                None => e
                    .retry_after()
                    .unwrap_or_else(|| schedule.ceiling(streak + 1)),
            };
            let at = Instant::now() + wait + schedule.base;
            if let Some(m) = self.memo.get_mut(&id) {
                m.retry_at = Some(at);
            }
            report.due(at);
            return Ok(Self::after(scope));
        }
        let m = self.memo.entry(id).or_default();
        m.strikes += 1;
        let strikes = m.strikes;
        let class = e.class();
        self.metrics.failed(class.as_str());
        report.failed_writes += 1;
        blocked.extend(plan.rows[0].0.hashes.iter().copied());
        if strikes >= self.settings.max_attempts {
            let reason = format!(
                "gave up after {strikes} failed attempts while other rows were delivered: {e}"
            );
            self.give_up(tx, &plan.rows[0].0, &reason, blocked, report)
                .await?;
            return Ok(Self::after_retry_after(e, report));
        }
        let at = Instant::now() + ROW_BACKOFF.delay(strikes);
        if let Some(m) = self.memo.get_mut(&id) {
            m.retry_at = Some(at);
        }
        report.due(at);
        if class == FailureClass::Configuration {
            // Loud still: a refusal of one row's content may be a proxy's rule to look at.
            error!(class = class.as_str(), rows = 1, id, strikes, error = %e,
                "row keeps failing while others are delivered; holding it back");
        } else {
            warn!(class = class.as_str(), rows = 1, id, strikes, error = %e,
                "row keeps failing while others are delivered; holding it back");
        }
        self.store.record_failure(tx, &[id], &e.to_string()).await?;
        Ok(Self::after_retry_after(e, report))
    }

    /// Whether a failure `e` of a Write to `target` is its store's alone, or the relay's.
    pub(super) fn scope_of(&self, target: &Target, e: &WriteError) -> Scope {
        if !matches!(e, WriteError::Throttled { .. }) && self.store_failure_alone(target) {
            Scope::Store
        } else {
            Scope::Relay
        }
    }

    /// What the pass does after an outage of this scope: stops (the relay backs off) or goes
    /// on with the other stores.
    fn after(scope: Scope) -> Flow {
        match scope {
            Scope::Relay => Flow::Stop,
            Scope::Store => Flow::Continue,
        }
    }

    /// After a failure that is one row's own: the server may still have asked everyone to wait
    /// (`Retry-After`), whoever is at fault; then no more Writes this pass.
    pub(super) fn after_retry_after(e: &WriteError, report: &mut PassReport) -> Flow {
        match e.retry_after() {
            Some(d) => {
                report.wait = Some(report.wait.map_or(d, |w| w.max(d)));
                Flow::Stop
            }
            None => Flow::Continue,
        }
    }

    /// A failure of the whole relay (outage or configuration), or of one store (see
    /// `stores.rs`): record it on the rows and block their tuples for this pass; then back off,
    /// the relay (no more Writes this pass: [`Flow::Stop`]) or that store alone (its rows passed
    /// over until then, the other stores' going on). Returns until when the store is held, for
    /// [`Scope::Store`].
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn outage(
        &mut self,
        tx: &impl GenericClient,
        plan: &Plan,
        e: &WriteError,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
        schedule: Backoff,
        scope: Scope,
    ) -> Result<Option<Instant>, StoreError> {
        let ids = plan.ids();
        for (c, _) in &plan.rows {
            blocked.extend(c.hashes.iter().copied());
        }
        let class = e.class();
        self.metrics.failed(class.as_str());
        report.failed_writes += 1;
        let store = plan.target.store_label();
        let held = match scope {
            Scope::Relay => {
                self.streak += 1;
                let wait = e
                    .retry_after()
                    .unwrap_or_else(|| schedule.delay(self.streak));
                report.wait = Some(report.wait.map_or(wait, |w| w.max(wait)));
                if class == FailureClass::Configuration {
                    error!(class = class.as_str(), rows = ids.len(), store, error = %e,
                        retry_in = ?wait, "OpenFGA refused the relay's writes: check its settings");
                } else {
                    warn!(class = class.as_str(), rows = ids.len(), store, error = %e,
                        retry_in = ?wait, "write failed");
                }
                None
            }
            Scope::Store => {
                let until = self.hold_store(&plan.target, schedule, e.retry_after());
                report.due(until);
                let wait = until.saturating_duration_since(Instant::now());
                if class == FailureClass::Configuration {
                    error!(class = class.as_str(), rows = ids.len(), store, error = %e,
                        retry_in = ?wait, "OpenFGA refused the writes of one store while \
                        others' are delivered: holding that store's rows");
                } else {
                    warn!(class = class.as_str(), rows = ids.len(), store, error = %e,
                        retry_in = ?wait, "writes of one store failed while others' are \
                        delivered: holding that store's rows");
                }
                Some(until)
            }
        };
        self.store.record_failure(tx, &ids, &e.to_string()).await?;
        Ok(held)
    }

    /// Gives up on a row of a Write that was answered: dead-letters it for what it said when
    /// read. A row that cannot be dead-lettered now (another session holds it, or changed it)
    /// stays pending, undelivered: like any row the pass could not take, it blocks its tuples
    /// for the rest of the pass, so that no later row on them overtakes it.
    pub(super) async fn give_up(
        &mut self,
        tx: &impl GenericClient,
        c: &Candidate,
        reason: &str,
        blocked: &mut HashSet<u64>,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        if !self
            .dead_letter(tx, c.id, reason, Some(&c.text), report)
            .await?
        {
            blocked.extend(c.hashes.iter().copied());
            report.held += 1;
            report.locked += 1;
        }
        Ok(())
    }

    /// Gives up on row `id` (see [`Store::dead_letter`]); returns whether it did.
    pub(super) async fn dead_letter(
        &mut self,
        tx: &impl GenericClient,
        id: i64,
        reason: &str,
        read: Option<&str>,
        report: &mut PassReport,
    ) -> Result<bool, StoreError> {
        if !self.store.dead_letter(tx, id, reason, read).await? {
            debug!(
                id,
                "not dead-lettered: another session holds the row, or changed it"
            );
            return Ok(false);
        }
        warn!(id, reason, "row dead-lettered");
        self.memo.remove(&id);
        self.metrics.rows_dead_lettered.inc();
        report.dead += 1;
        Ok(true)
    }
}
