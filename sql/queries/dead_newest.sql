-- The newest dead rows, with the error that killed each, for `status` and `drain`: those dead
-- since $1 (NULL: any), between ids $2 and $3 (NULL: any), at most $4 of them, the most recently
-- dead first. Dead rows are few, and found through fga_outbox_dead_idx.
SELECT id, last_error FROM fga_outbox
WHERE failed_at IS NOT NULL AND processed_at IS NULL
  AND ($1::timestamptz IS NULL OR failed_at >= $1)
  AND ($2::bigint IS NULL OR id >= $2) AND ($3::bigint IS NULL OR id <= $3)
ORDER BY failed_at DESC, id DESC
LIMIT $4
