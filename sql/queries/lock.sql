-- Locks the rows of one Write for the time it is in flight, within that Write's transaction.
-- $1: the ids. Returns the ids locked, with their payloads as locked: a row missing is held by
-- another session (a relay that lost leadership but has not stopped yet), or was delivered or
-- dead-lettered meanwhile. Rows are planned from pages read without locks (claim.sql): the relay
-- sends a row only if its payload here is the one it planned with, so that a Write carries what
-- its lock saw; a row changed meanwhile is passed over as held, and read again by the next pass.
-- A Write of fresh rows it completes locks them by marking them instead (lock_by_marking.sql);
-- this lock is for the others, and for a Write whose mark found a row another session holds.
--
-- Before it locks a row, the transaction also takes the advisory lock (1718051123, <its own
-- 32-bit transaction id, shifted into an integer>), which `fga_outbox_wait` queues for when it
-- finds a row locked by this transaction (the row's xmax): waiters wake at this transaction's
-- end without locking the row themselves. It is a filter on each pending row, evaluated before
-- the row is locked; taken again for the next rows, it is already held (one lock a Write).
SELECT id, payload::text FROM fga_outbox
WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
  AND pg_advisory_xact_lock(1718051123,
          (pg_current_xact_id()::text::bigint % 4294967296 - 2147483648)::integer) IS NOT NULL
FOR UPDATE SKIP LOCKED
