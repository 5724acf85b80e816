-- Sends every dead row back to pending, or (`--store`) those of one store: $1 the store id the
-- rows name, '' for rows naming none (NULL: every store). Returns the ids.
UPDATE fga_outbox
SET failed_at = NULL
WHERE failed_at IS NOT NULL AND processed_at IS NULL
  AND ($1::text IS NULL OR coalesce(payload->>'store_id', '') = $1::text)
RETURNING id, last_error
