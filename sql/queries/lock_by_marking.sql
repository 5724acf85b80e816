-- Locks the rows of one Write by marking them delivered, within that Write's transaction: that
-- transaction commits only once OpenFGA has accepted the Write, and rolls back otherwise, so no
-- other session ever sees the mark of a Write that was not accepted. $1: the ids. Returns the ids
-- marked, with their payloads as marked (see lock.sql: a row missing or changed sends nothing).
--
-- One change to each row instead of two (lock.sql, then mark_delivered.sql): a row lock followed
-- by an update of the same row costs PostgreSQL more than the update alone (BENCHMARKS.md). Used
-- only for a Write that completes every one of its rows, whose rows the relay knows nothing of
-- yet (never found held, failed or sent in parts), to a store whose last Write did not fail (a
-- mark rolled back leaves a dead row version, a lock does not). An UPDATE cannot skip a row
-- another session holds, so the relay sets `lock_timeout` for it: on 55P03 (a row held, or a
-- table lock queued: `reconcile --repair`, an index build) it rolls back, locks with lock.sql,
-- which passes a held row over, and marks no Write this way for a while.
--
-- The transaction's own setting `fga_relay.marking`, set with `lock_timeout` in the batch that
-- begins it: should that BEGIN fail and this statement run on its own, it would commit the marks
-- at once, before any Write; without the setting it marks nothing.
--
-- The advisory lock is the one lock.sql takes, for `fga_outbox_wait`: a waiter finds the row's
-- xmax set by this transaction as it would by a row lock.
UPDATE fga_outbox
SET processed_at = clock_timestamp()
WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
  AND current_setting('fga_relay.marking', true) = 'on'
  AND pg_advisory_xact_lock(1718051123,
          (pg_current_xact_id()::text::bigint % 4294967296 - 2147483648)::integer) IS NOT NULL
RETURNING id, payload::text
