-- Sends every dead row back to pending. Returns the ids.
UPDATE fga_outbox
SET failed_at = NULL
WHERE failed_at IS NOT NULL AND processed_at IS NULL
RETURNING id, last_error
