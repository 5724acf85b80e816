-- Records a failed attempt for rows that stay pending. $1: the ids, $2: why it failed. A row
-- dead-lettered meanwhile (by hand, while its Write was in flight) keeps what it says, and a
-- row another session holds is left alone (SKIP LOCKED): the stream does not wait for that
-- session, and the attempt goes uncounted.
UPDATE fga_outbox
SET attempts = coalesce(attempts, 0) + 1, last_error = $2
WHERE id IN (SELECT id FROM fga_outbox
             WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
             FOR UPDATE SKIP LOCKED)
