-- Dead rows, for `retry --dry-run`: all ($1 NULL) or those of $1. In id order.
SELECT id, payload::text FROM fga_outbox
WHERE failed_at IS NOT NULL AND processed_at IS NULL AND ($1::bigint[] IS NULL OR id = ANY($1))
ORDER BY id
