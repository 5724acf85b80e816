-- Records a failed attempt for rows that stay pending. $1: the ids, $2: why it failed. A row
-- dead-lettered meanwhile (by hand, while its Write was in flight) keeps what it says.
UPDATE fga_outbox
SET attempts = coalesce(attempts, 0) + 1, last_error = $2
WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
