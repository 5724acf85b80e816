-- Gives up on a row: it can never be delivered as it is. $1: the id, $2: why.
UPDATE fga_outbox
SET failed_at = clock_timestamp(), attempts = coalesce(attempts, 0) + 1, last_error = $2
WHERE id = $1 AND processed_at IS NULL AND failed_at IS NULL
