//! What an answer writes back to the outbox: the rows a Write finished are marked in its own
//! transaction (`write.rs`); here, after the core's judgement (`judge.rs`), the failures recorded
//! on rows (`attempts`, `last_error`), the rows given up on dead-lettered, the rows another
//! session holds looked at again by id, and the rows with nothing left to send marked
//! delivered.

use super::Deliverer;
use super::core::{Effects, Flight};
use super::order::Candidate;
use super::write::Answer;
use crate::store::StoreError;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;
use tracing::{debug, warn};

impl Deliverer {
    /// A Write landed: its rows and tuples are no longer in flight; its answer is judged and
    /// what the judgement says is written.
    pub(super) async fn land(
        &mut self,
        flight: Flight,
        answer: Result<Answer, StoreError>,
    ) -> Result<(), StoreError> {
        let landed = self.judge_and_write_back(flight, answer).await;
        // With the rows it gave back (a failure's) in the queue again.
        self.reopen();
        landed
    }

    async fn judge_and_write_back(
        &mut self,
        flight: Flight,
        answer: Result<Answer, StoreError>,
    ) -> Result<(), StoreError> {
        self.core.landed(&flight.keys, &flight.plan);
        self.progress.mark();
        self.liveness.beat();
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                // Whatever became of it, the rows are still pending: sent again after the error.
                self.core.requeue(flight.plan.into_rows());
                return Err(e);
            }
        };
        let fx = match answer {
            Answer::Deferred => {
                self.core.requeue(flight.plan.into_rows());
                return Ok(());
            }
            Answer::Held(missing) => {
                let now_rows = match self.refresh(&missing).await {
                    Ok(rows) => rows,
                    Err(e) => {
                        // Still in hand, in their place: no later row on their tuples overtakes
                        // them while the stream starts again.
                        self.core.requeue(flight.plan.into_rows());
                        return Err(e);
                    }
                };
                let configured = self.client.configured_store_id();
                self.core
                    .refreshed(flight.plan, &missing, &now_rows, configured, Instant::now());
                return Ok(());
            }
            Answer::Sent(result) => self.core.judge(flight, result, Instant::now()),
        };
        self.write_back(fx).await
    }

    /// Rows left the relay's hand (a Write landed, rows were marked or dead-lettered without
    /// one, a row looked at again was gone): each store the last read left out for having a
    /// read's worth of rows queued that has fewer in hand now has its rows left unread read (no
    /// notification will say so). Rows in flight still count: a failing store's Write that
    /// comes back puts them back in the queue, and a read for them meanwhile would find its
    /// store held and walk its backlog for nothing.
    pub(super) fn reopen(&mut self) {
        let batch = self.core.settings.batch_size.max(1);
        let before = self.full.len();
        let core = &self.core;
        self.full.retain(|store| core.in_hand_of(store) >= batch);
        if self.full.len() < before {
            self.want_read = true;
        }
    }

    /// The rows `ids` still pending, with their payloads as they are now.
    async fn refresh(
        &self,
        ids: &[i64],
    ) -> Result<HashMap<i64, Result<String, String>>, StoreError> {
        let conn = self.store.pool().get().await?;
        let rows = self.store.refresh(&conn, ids).await?;
        Ok(rows.into_iter().map(|r| (r.id, r.payload)).collect())
    }

    /// Records failures and dead-letters rows as a judgement says. On a database error, the
    /// rows not yet dead-lettered go back to the queue, in their place: they are still pending,
    /// and no later row on their tuples may overtake them while the stream starts again.
    pub(super) async fn write_back(&mut self, fx: Effects) -> Result<(), StoreError> {
        let mut give_up = VecDeque::from(fx.give_up);
        let written = self.record_and_give_up(&fx.record, &mut give_up).await;
        if written.is_err() {
            self.core
                .requeue(give_up.into_iter().map(|(c, _)| c).collect());
        }
        written
    }

    /// [`Deliverer::write_back`]'s statements; a row leaves `give_up` once it is dead-lettered
    /// (or found held, and queued again as such).
    async fn record_and_give_up(
        &mut self,
        record: &[(Vec<i64>, String)],
        give_up: &mut VecDeque<(Candidate, String)>,
    ) -> Result<(), StoreError> {
        if record.is_empty() && give_up.is_empty() {
            return Ok(());
        }
        let conn = self.store.pool().get().await?;
        for (ids, error) in record {
            self.store.record_failure(&conn, ids, error).await?;
        }
        while let Some((c, reason)) = give_up.front() {
            let dead = self.dead_letter(&conn, c.id, reason, Some(&c.text)).await?;
            let Some((c, _)) = give_up.pop_front() else {
                break;
            };
            if dead {
                self.core.dead(c.id);
            } else {
                self.core.refused(c, Instant::now());
            }
        }
        Ok(())
    }

    /// Gives up on row `id` (see [`crate::store::Store::dead_letter`]); returns whether it did.
    pub(super) async fn dead_letter(
        &mut self,
        tx: &impl deadpool_postgres::GenericClient,
        id: i64,
        reason: &str,
        read: Option<&str>,
    ) -> Result<bool, StoreError> {
        if !self.store.dead_letter(tx, id, reason, read).await? {
            debug!(
                id,
                "not dead-lettered: another session holds the row, or changed it"
            );
            return Ok(false);
        }
        warn!(id, reason, "row dead-lettered");
        Ok(true)
    }

    /// Marks the rows with nothing left to send delivered, and lets their tuples go.
    pub(super) async fn mark_finished(&mut self) -> Result<(), StoreError> {
        if self.core.to_mark.is_empty() {
            return Ok(());
        }
        let ids = std::mem::take(&mut self.core.to_mark);
        let texts: Vec<Arc<str>> = ids
            .iter()
            .map(|id| {
                self.core
                    .queue
                    .get(id)
                    .map(|c| c.text.clone())
                    .unwrap_or_default()
            })
            .collect();
        let texts: Vec<&str> = texts.iter().map(|t| &**t).collect();
        let conn = self.store.pool().get().await?;
        // On an error they stay in the queue, in their place: marked at the next try.
        let marked = self.store.mark_finished(&conn, &ids, &texts).await?;
        self.core.marked(&marked);
        // The others: held by another session, changed, or gone since they were read.
        let missing: Vec<i64> = ids.into_iter().filter(|id| !marked.contains(id)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let now_rows = self.refresh(&missing).await?;
        let configured = self.client.configured_store_id();
        let now = Instant::now();
        for id in missing {
            if let Some(c) = self.core.queue.remove(&id)
                && let Some(c) = self.core.looked_again(c, &now_rows, configured, now)
            {
                self.core.admit(c);
            }
        }
        Ok(())
    }
}
