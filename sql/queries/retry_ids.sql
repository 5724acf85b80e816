-- Sends the given dead rows back to pending. $1: the ids; $2: only those of this store (as
-- retry_dead.sql; NULL: any). Returns the ids that were dead.
UPDATE fga_outbox
SET failed_at = NULL
WHERE id = ANY($1) AND failed_at IS NOT NULL AND processed_at IS NULL
  AND ($2::text IS NULL OR coalesce(payload->>'store_id', '') = $2::text)
RETURNING id, last_error
