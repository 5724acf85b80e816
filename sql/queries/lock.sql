-- Locks the rows of one Write for the time it is in flight, within that Write's transaction.
-- $1: the ids. Returns the ids locked: a row missing is held by another session (a relay that
-- lost leadership but has not stopped yet), or was delivered or dead-lettered meanwhile.
SELECT id FROM fga_outbox
WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
FOR UPDATE SKIP LOCKED
