-- Sends the given dead rows back to pending. $1: the ids. Returns the ids that were dead.
UPDATE fga_outbox
SET failed_at = NULL
WHERE id = ANY($1) AND failed_at IS NOT NULL AND processed_at IS NULL
RETURNING id, last_error
