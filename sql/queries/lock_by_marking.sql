-- Locks the rows of one Write by marking them delivered, within that Write's transaction: that
-- transaction commits only once OpenFGA has accepted the Write, and rolls back otherwise, so no
-- other session ever sees the mark of a Write that was not accepted. $1: the ids. Returns the ids
-- marked, with their payloads as marked (see lock.sql: a row missing or changed sends nothing).
--
-- One statement a row instead of two (lock.sql, then mark_delivered.sql): a row lock followed by
-- an update of the same row costs PostgreSQL about a third more than the update alone. Used only
-- for a Write that completes every one of its rows, whose rows have no history in the relay (not
-- found held, failed or split before); the relay sets `lock_timeout` for it, since an UPDATE
-- cannot skip a row another session holds: on 55P03 it rolls back and locks with lock.sql,
-- which passes such a row over. So `processed_at` is when the Write left, as the relay saw it.
--
-- The advisory lock is the one lock.sql takes, for `fga_outbox_wait`: a waiter finds the row's
-- xmax set by this transaction as it would by a row lock.
UPDATE fga_outbox
SET processed_at = clock_timestamp()
WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
  AND pg_advisory_xact_lock(1718051123,
          (pg_current_xact_id()::text::bigint % 4294967296 - 2147483648)::integer) IS NOT NULL
RETURNING id, payload::text
