-- The newest dead rows, with the error that killed each, for `status` and `drain`: those between
-- ids $2 and $3 (NULL: any), but for the ids $1 (`drain`: the rows dead at its start), at most $4
-- of them, the most recently dead first. Dead rows are few, and found through
-- fga_outbox_dead_idx.
SELECT id, last_error FROM fga_outbox
WHERE failed_at IS NOT NULL AND processed_at IS NULL
  AND NOT (id = ANY($1::bigint[]))
  AND ($2::bigint IS NULL OR id >= $2) AND ($3::bigint IS NULL OR id <= $3)
ORDER BY failed_at DESC, id DESC
LIMIT $4
