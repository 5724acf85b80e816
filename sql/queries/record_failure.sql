-- Records a failed attempt for rows that stay pending. $1: the ids, $2: why it failed.
UPDATE fga_outbox
SET attempts = coalesce(attempts, 0) + 1, last_error = $2
WHERE id = ANY($1) AND processed_at IS NULL
