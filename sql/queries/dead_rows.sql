-- Dead rows, for `retry --dry-run`: all ($1 NULL) or those of $1; of one store ($2, as
-- retry_dead.sql) or any ($2 NULL). In id order, with the error that killed each.
SELECT id, payload::text, last_error FROM fga_outbox
WHERE failed_at IS NOT NULL AND processed_at IS NULL AND ($1::bigint[] IS NULL OR id = ANY($1))
  AND ($2::text IS NULL OR coalesce(payload->>'store_id', '') = $2::text)
ORDER BY id
