//! The judgement of a Write's answer: what it means for its rows (strikes, halving, dead
//! letters) and for the relay (backoff, the window).
//!
//! - Transient, for a Write of several rows: the relay cannot tell an outage from one bad row,
//!   so it holds the Write's store (its lane, see `lanes.rs`) and the rows of that Write are next
//!   sent in Writes half as large.
//!   When a smaller Write succeeds it was not an outage, and the halving finds the culprit.
//! - Transient, for a row alone: its failure is compared with everyone's. If a Write that left
//!   after its previous failure succeeded and nearly all the other Writes of the last minute
//!   succeeded (at least four, at most a quarter failed; Writes to its own store only, not
//!   counting those that failed carrying it), the failure is the row's own, a *strike*: the row
//!   is held with its own backoff while the others flow, and after `max_attempts` strikes it is
//!   dead-lettered, or later where some of the others failed too, once chance cannot explain
//!   its failures (see [`BY_CHANCE`]). Otherwise the failure hits
//!   other rows too (an outage, a flaky or overloaded server): its store is held, the row just
//!   past that wait so that the others are tried first, and nothing counts toward
//!   dead-lettering.
//! - Throttled (429): never the rows' fault. Nothing is halved and nothing is a strike; the
//!   store waits for `Retry-After` (or its own backoff) and sends the same rows again. A
//!   `Retry-After` sent with any other failure is waited for too, on every path, by its store.
//! - The store or model the rows name does not exist (a row's `store_id` or
//!   `authorization_model_id`): every row of the Write is dead-lettered with OpenFGA's answer.
//! - Permanent for one operation (`Invalid tuple …`, a condition conflict): that row is
//!   dead-lettered with OpenFGA's message; the rest of the Write is sent again without it.
//! - Already applied (an older OpenFGA's answer to a duplicate write or missing delete): that
//!   operation counts as done. A row whose last operation it was is marked delivered in that
//!   Write's transaction, before anything releases its tuples.
//! - A row that cannot be dead-lettered when given up on (another session holds it) stays
//!   pending in the queue, held back briefly, and keeps its tuples.
//! - Configuration (auth, store, model, garbage answers, a proxy's refusal): loud error, and the
//!   store is held with a slow backoff (every store, when the settings are wrong for all). A proxy may refuse only the Writes carrying one row's content
//!   (a web application firewall), so these are halved and judged alone as transient failures
//!   are: a row refused alone while nearly all other Writes succeed is struck, held and in the
//!   end dead-lettered; when every Write is refused (wrong settings), nothing is.
//!
//! Every failed attempt updates `attempts` and `last_error` of the rows concerned.

use super::core::{Core, Effects, Flight};
use super::order::{Candidate, Plan};
use crate::backoff::Backoff;
use crate::openfga::{FailureClass, Target, WriteError};
use crate::payload::Payload;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

/// Backoff of a store after a failure that looks like an outage. Capped low so that delivery
/// resumes within a couple of seconds of OpenFGA coming back.
pub const OUTAGE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// Backoff of a store after a configuration error: only the operator can fix it, so retry
/// slowly and keep the logs readable.
pub const CONFIG_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// Backoff of one row that keeps failing while others are delivered.
pub const ROW_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// A row is given up on only once chance cannot explain its failures: where some of the other
/// Writes to its store fail too (a flaky server, one bad replica behind a load balancer), a row
/// failing that often in a row by chance alone, at their rate, would be rarer than this. With
/// none of them failing it takes `--max-attempts`; with one in five failing, thirteen.
const BY_CHANCE: f64 = 1e-9;

impl Flight {
    /// The row an "already applied" answer finishes: the one whose only operation in this
    /// Write is the one OpenFGA already had, if the Write completes it.
    pub(super) fn finished_by(&self, e: &WriteError) -> Option<i64> {
        let WriteError::AlreadyApplied { op, .. } = e else {
            return None;
        };
        let r = match op {
            Some(i) => Core::locate(&self.plan, *i)?.0,
            // Unnamed: only a Write of one operation says which.
            None if self.plan.n_ops() == 1 => 0,
            None => return None,
        };
        let (c, idx) = self.plan.rows.get(r)?;
        (idx.len() == 1 && self.complete.contains(&c.id)).then_some(c.id)
    }
}

impl Core {
    /// OpenFGA answered a Write (its rows finished by it are marked delivered already, in its
    /// transaction): what it means for its rows, its store and the window.
    pub(super) fn judge(
        &mut self,
        flight: Flight,
        result: Result<(), WriteError>,
        now: Instant,
    ) -> Effects {
        let mut fx = Effects::default();
        if !matches!(
            result,
            Err(WriteError::Transient { .. }
                | WriteError::Throttled { .. }
                | WriteError::Configuration { .. }
                | WriteError::Unexpected { .. }
                | WriteError::NotSent)
        ) {
            // OpenFGA itself answered: the store is not one that never answers.
            self.lanes.answered(&flight.plan.target);
        }
        let finished = result.as_ref().err().and_then(|e| flight.finished_by(e));
        let left = flight.left;
        let plan = flight.plan;
        if let Some(id) = finished {
            // The other rows are sent again without it.
            debug!(id, "OpenFGA already had the row's last operation applied");
            let mut rest = Vec::new();
            for c in plan.into_rows() {
                if c.id == id {
                    self.row_delivered(&c);
                } else {
                    rest.push(c);
                }
            }
            self.requeue(rest);
            return fx;
        }
        match result {
            Ok(()) => {
                self.widen();
                self.on_success(plan, now, left);
            }
            Err(e) => {
                // OpenFGA struggling halves the window; one store failing leaves it to the
                // others: only a store's first failure counts, and only while no other store
                // works (none's Writes succeeded in the last 5 s, and every other store OpenFGA
                // answered has failed since: dozens of stores failing at once beside one that
                // works halved the window to a Write). A failing store has half the window at
                // most meanwhile.
                if matches!(
                    e,
                    WriteError::Transient { .. } | WriteError::Throttled { .. }
                ) && self.lanes.working(&plan.target)
                    && !self.lanes.others_flow(&plan.target, now)
                    && !self.lanes.others_work(&plan.target)
                {
                    self.narrow();
                }
                self.on_failure(plan, e, now, &mut fx);
            }
        }
        fx
    }

    /// Rows a Write could not lock, as they are now (`now_rows`: those still pending, with
    /// their payloads): another session holds them (a relay that lost leadership but has not
    /// stopped yet, a drain), or they changed or went since they were read. A row gone
    /// (delivered or dead-lettered by that session) leaves the queue; a row as it was is held
    /// back briefly, and keeps its tuples: nothing after it on them goes.
    ///
    /// A row changed is looked at again as a read would see it
    /// ([`super::Deliverer::recheck_bars`], before any Write is planned): the store and model
    /// it names now, its operations now (none of what was learnt of the old ones carries over:
    /// operations applied, a retried row's superseded ones), or dead-lettered if it cannot be
    /// decoded. Until then it bars the later rows of its store (`configured`: the configured
    /// store's id, for a row naming it).
    pub(super) fn refreshed(
        &mut self,
        plan: Plan,
        missing: &[i64],
        now_rows: &HashMap<i64, Result<String, String>>,
        configured: Option<&str>,
        now: Instant,
    ) {
        let mut rest = Vec::new();
        for c in plan.into_rows() {
            if !missing.contains(&c.id) {
                rest.push(c);
                continue;
            }
            rest.extend(self.looked_again(c, now_rows, configured, now));
        }
        self.requeue(rest);
    }

    /// Row `c` as it is now (`now_rows`, see [`Core::refreshed`]): gone (`None`), changed (a
    /// bar until it is read again by id), or as it was, held by another session (held back).
    pub(super) fn looked_again(
        &mut self,
        mut c: Candidate,
        now_rows: &HashMap<i64, Result<String, String>>,
        configured: Option<&str>,
        now: Instant,
    ) -> Option<Candidate> {
        match now_rows.get(&c.id) {
            None => {
                debug!(
                    id = c.id,
                    "row delivered or dead-lettered by another session"
                );
                self.memo.remove(&c.id);
                None
            }
            // Changed, or no longer text at all (bytes that are not UTF-8): read again, and
            // dead-lettered then if it cannot be decoded.
            Some(now_text) if !now_text.as_ref().is_ok_and(|t| **t == *c.text) => {
                debug!(id = c.id, "row changed since it was read; read again");
                if let Ok(text) = now_text {
                    if let Ok(p) = Payload::parse_text(text)
                        && let Some(configured) = configured.or(p.store.is_none().then_some(""))
                    {
                        c.target = Target::of(p.store.as_ref(), p.model.as_ref(), configured);
                    }
                    c.text = text.as_str().into();
                }
                c.ops = Arc::from(Vec::new());
                c.hashes = Vec::new();
                if !c.malformed {
                    c.malformed = true;
                    self.bars += 1;
                }
                self.memo.remove(&c.id);
                self.due_at(now);
                Some(c)
            }
            Some(_) => {
                self.report.locked += 1;
                self.hold_back(c.id, now);
                Some(c)
            }
        }
    }

    fn on_success(&mut self, plan: Plan, now: Instant, left: Instant) {
        let n_ops = plan.n_ops();
        self.lanes.note(false, &[], &plan.target, now, left);
        self.metrics.tuples_delivered.inc_by(n_ops as u64);
        let mut unfinished = Vec::new();
        for (c, idx) in plan.rows {
            let all = c.ops.len();
            let memo_done = self.memo.get(&c.id).map_or(0, |m| m.done.len());
            if memo_done + idx.len() >= all {
                // Marked delivered in the Write's own transaction already.
                self.row_delivered(&c);
            } else {
                // A part of a large row: remember it, send the rest next.
                self.memo.entry(c.id).or_default().done.extend(idx);
                unfinished.push(c);
            }
        }
        self.requeue(unfinished);
    }

    fn on_failure(&mut self, plan: Plan, e: WriteError, now: Instant, fx: &mut Effects) {
        match e {
            WriteError::AlreadyApplied {
                op: Some(i),
                ref message,
            } => {
                debug!(ids = ?plan.ids(), %message, "OpenFGA already had this operation applied");
                self.applied_already(plan, i, &e, fx)
            }
            WriteError::AlreadyApplied { op: None, .. } | WriteError::Rejected { op: None, .. } => {
                self.split_or_dead_letter(plan, &e, fx)
            }
            WriteError::Rejected { op: Some(i), .. } => {
                self.metrics.failed("permanent");
                self.report.failed_writes += 1;
                let Some((r, _)) = Self::locate(&plan, i) else {
                    return self.split_or_dead_letter(plan, &e, fx);
                };
                let mut rows: Vec<Candidate> = plan.into_rows();
                let bad = rows.remove(r);
                fx.give_up.push((bad, e.to_string()));
                self.requeue(rows);
            }
            WriteError::UnknownTarget { .. } => {
                // Every row of a Write names its store and model: none of them can go.
                self.metrics.failed("permanent");
                self.report.failed_writes += 1;
                let reason = e.to_string();
                for c in plan.into_rows() {
                    fx.give_up.push((c, reason.clone()));
                }
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
                    return self.requeue(plan.into_rows());
                }
                self.lanes.note(true, &[], &plan.target, now, now);
                self.outage(plan, &e, CONFIG_BACKOFF, now, fx);
            }
            WriteError::TooLarge { .. } => {
                // A proxy's body limit or gRPC's: a smaller Write may pass; a row alone cannot
                // shrink, unless it is sent in parts already.
                self.split_or_dead_letter(plan, &e, fx)
            }
            WriteError::NotSent => {
                // `Flight::send` defers these before they get here; should one come, it was
                // never sent and is nothing against its rows.
                self.requeue(plan.into_rows());
            }
            WriteError::Configuration { .. } | WriteError::Unexpected { .. } => {
                // Wrong settings fail every Write; a proxy refusing one row's content (a web
                // application firewall) fails only the Writes carrying that row. Halving tells
                // them apart, as for transient failures, with the slow backoff of the former.
                self.halve_or_hold(plan, &e, CONFIG_BACKOFF, now, fx)
            }
            WriteError::Throttled { .. } => {
                // Not the rows' fault: the same Write, after its store's wait.
                self.outage(plan, &e, OUTAGE_BACKOFF, now, fx);
            }
            WriteError::Transient { .. } => self.halve_or_hold(plan, &e, OUTAGE_BACKOFF, now, fx),
        }
    }

    /// An older OpenFGA's "already exists" for operation `i` of the Write: success for that
    /// operation, remembered with its row; the rest is sent again. An operation it cannot place
    /// is taken as a permanent answer that does not say which row.
    fn applied_already(&mut self, plan: Plan, i: usize, e: &WriteError, fx: &mut Effects) {
        let Some((r, op)) = Self::locate(&plan, i) else {
            return self.split_or_dead_letter(plan, e, fx);
        };
        self.memo
            .entry(plan.rows[r].0.id)
            .or_default()
            .done
            .insert(op);
        self.requeue(plan.into_rows());
    }

    /// A permanent answer that does not say which row: split the Write to find out, or, for a
    /// row alone, dead-letter it (a part of a row sent in parts found too large is halved).
    fn split_or_dead_letter(&mut self, plan: Plan, e: &WriteError, fx: &mut Effects) {
        self.metrics.failed("permanent");
        self.report.failed_writes += 1;
        if plan.rows.len() > 1 {
            let half = plan.rows.len() / 2;
            for (c, _) in &plan.rows {
                self.memo.entry(c.id).or_default().max_rows = Some(half);
            }
            let ids = plan.ids();
            debug!(?ids, error = %e, "OpenFGA rejected a write without naming the tuple; splitting it");
            self.requeue(plan.into_rows());
            return;
        }
        let Some((c, idx)) = plan.rows.into_iter().next() else {
            return;
        };
        if matches!(e, WriteError::AlreadyApplied { .. }) && idx.len() == 1 {
            self.memo.entry(c.id).or_default().done.insert(idx[0]);
            self.requeue(vec![c]);
            return;
        }
        if matches!(e, WriteError::TooLarge { .. }) && idx.len() > 1 && idx.len() < c.ops.len() {
            // A part of a row already sent in parts, not in one transaction: a part of the
            // relay's choosing is no reason to give the row up. Only a tuple too large alone is.
            let half = idx.len() / 2;
            debug!(id = c.id, part = idx.len(), half, error = %e,
                "a part of a row is too large; halving its parts");
            self.memo.entry(c.id).or_default().max_part = Some(half);
            self.requeue(vec![c]);
            return;
        }
        fx.give_up.push((c, e.to_string()));
    }

    /// A failure that may be an outage of its store (or wrong settings) or one row's own. A
    /// Write of several rows holds its store on `schedule` and its rows are next sent in Writes
    /// half as large. A row alone is struck if the failure is its own (see the module's
    /// "Failures"), else held just past its store's wait.
    fn halve_or_hold(
        &mut self,
        plan: Plan,
        e: &WriteError,
        schedule: Backoff,
        now: Instant,
        fx: &mut Effects,
    ) {
        let proven = self.lanes.proven(&plan.target);
        self.lanes.note(true, &plan.ids(), &plan.target, now, now);
        if plan.rows.len() > 1 {
            let half = (plan.rows.len() / 2).max(1);
            for (c, _) in &plan.rows {
                let m = self.memo.entry(c.id).or_default();
                m.max_rows = Some(half);
                m.failed_at = Some(now);
            }
            self.outage(plan, e, schedule, now, fx);
            return;
        }
        let id = plan.rows[0].0.id;
        let others_fail = self.lanes.others_nearly_all_succeed(id, &plan.target, now);
        let m = self.memo.entry(id).or_default();
        // A Write to its store that left after this row last failed succeeded, and nearly all
        // Writes to its store but this row's do: the row, not OpenFGA, is the problem. A
        // failure others share is no strike, nor is one that only Writes already on their way
        // before it outlived (a store going down still answers the requests it holds).
        let strike =
            m.failed_at.is_some_and(|f| proven.is_some_and(|p| p > f)) && others_fail.is_some();
        m.failed_at = Some(now);
        m.max_rows = Some(1);
        if strike {
            return self.strike(plan, e, schedule, now, fx, others_fail.unwrap_or(0.0));
        }
        // Held just past the wait of its store, so that the store's other rows go first: how
        // they fare tells an outage from this row's own failure.
        let until = self.outage(plan, e, schedule, now, fx);
        let at = until + schedule.base;
        if let Some(m) = self.memo.get_mut(&id) {
            m.retry_at = Some(at);
        }
        self.due_at(at);
    }

    /// A row alone failed, and the failure is its own: one more strike. It is held back with
    /// its own backoff while the others flow, or given up on once it has had its strikes and
    /// chance, at `share` (the failing share of the other Writes to its store), cannot explain
    /// them.
    fn strike(
        &mut self,
        plan: Plan,
        e: &WriteError,
        schedule: Backoff,
        now: Instant,
        fx: &mut Effects,
        share: f64,
    ) {
        let Some((c, _)) = plan.rows.into_iter().next() else {
            return;
        };
        let id = c.id;
        let m = self.memo.entry(id).or_default();
        m.strikes += 1;
        let strikes = m.strikes;
        let class = e.class();
        self.metrics.failed(class.as_str());
        self.report.failed_writes += 1;
        if let Some(wait) = e.retry_after() {
            // Whoever is at fault, the server asked the store to wait.
            let until = self.lanes.hold(&plan.target, schedule, Some(wait), now);
            self.due_at(until);
        }
        // Its failures in a row: each strike, and the failure before the first.
        if strikes >= self.settings.max_attempts && share.powi(strikes as i32 + 1) <= BY_CHANCE {
            fx.give_up.push((c, gave_up(strikes, share, e)));
            return;
        }
        let at = now + ROW_BACKOFF.delay(strikes);
        if let Some(m) = self.memo.get_mut(&id) {
            m.retry_at = Some(at);
        }
        self.due_at(at);
        if class == FailureClass::Configuration {
            // Loud still: a refusal of one row's content may be a proxy's rule to look at.
            error!(class = class.as_str(), rows = 1, id, strikes, error = %e,
                "row keeps failing while others are delivered; holding it back");
        } else {
            warn!(class = class.as_str(), rows = 1, id, strikes, error = %e,
                "row keeps failing while others are delivered; holding it back");
        }
        fx.record.push((vec![id], e.to_string()));
        self.requeue(vec![c]);
    }

    /// A failure of a store (an outage, throttling, or wrong settings): record it on the rows,
    /// put them back in the queue, and hold the store (its lane) on `schedule` or for the
    /// server's `Retry-After`: its rows are neither planned nor read until then, while the other
    /// stores' go on. Returns until when the store is held.
    fn outage(
        &mut self,
        plan: Plan,
        e: &WriteError,
        schedule: Backoff,
        now: Instant,
        fx: &mut Effects,
    ) -> Instant {
        let ids = plan.ids();
        let class = e.class();
        self.metrics.failed(class.as_str());
        self.report.failed_writes += 1;
        let until = self
            .lanes
            .hold(&plan.target, schedule, e.retry_after(), now);
        self.due_at(until);
        let wait = until.saturating_duration_since(now);
        let store = plan.target.store_label();
        if class == FailureClass::Configuration {
            error!(class = class.as_str(), rows = ids.len(), store, error = %e,
                retry_in = ?wait, "OpenFGA refused the relay's writes: check its settings");
        } else {
            warn!(class = class.as_str(), rows = ids.len(), store, error = %e,
                retry_in = ?wait, "write failed; holding this store's rows");
        }
        fx.record.push((ids, e.to_string()));
        self.requeue(plan.into_rows());
        until
    }
}

/// Why a row that kept failing alone is given up on: its strikes, and where some of the other
/// Writes to its store failed too (`share`), that chance cannot explain them.
fn gave_up(strikes: u32, share: f64, e: &WriteError) -> String {
    let others = match share > 0.0 {
        true => format!(
            " ({:.0}% of the others failed too: that many failures in a row of one row would be \
             chance less than once in a billion)",
            share * 100.0
        ),
        false => String::new(),
    };
    format!("gave up after {strikes} failed attempts while other rows were delivered{others}: {e}")
}
