-- Gives up on a row: it can never be delivered as it is. $1: the id, $2: why, $3: the payload
-- as the relay read it (or NULL: whatever it says).
--
-- A row another session holds (an operator correcting it by hand) is left alone: SKIP LOCKED, so
-- that the pass does not wait for that session, and every other tuple with it; and a payload
-- changed since the relay read it is not given up on for what it no longer says. The relay looks
-- at such a row again soon; until then, no later row on its tuples is sent.
UPDATE fga_outbox
SET failed_at = clock_timestamp(), attempts = coalesce(attempts, 0) + 1, last_error = $2
WHERE id = (SELECT id FROM fga_outbox
             WHERE id = $1 AND processed_at IS NULL AND failed_at IS NULL
               AND ($3::text IS NULL OR payload::text = $3::text)
             FOR UPDATE SKIP LOCKED)
