-- Records on a pending row which of its operations the relay skips (superseded by later rows),
-- without counting an attempt. $1: the id, $2: what was skipped. A row another session holds is
-- left alone (SKIP LOCKED), so that the stream does not wait for that session: such a row is
-- marked only once it is let go (sql/queries/mark_finished.sql), and looked at again first.
UPDATE fga_outbox
SET last_error = $2
WHERE id = (SELECT id FROM fga_outbox
             WHERE id = $1 AND processed_at IS NULL AND last_error IS DISTINCT FROM $2
             FOR UPDATE SKIP LOCKED)
