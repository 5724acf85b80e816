-- Reads ahead the pending rows of one store that rows name, in id order, for a Write of that
-- store that the page did not fill (rows spread over many stores). $1: the store id, $2: the
-- smallest id not read yet for it, $3: how many rows. Through fga_outbox_store_idx (its predicate
-- repeated here so that the planner may use it). Nothing is locked, as in claim.sql.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at IS NOT NULL
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
  AND payload->>'store_id' = $1 AND id >= $2
ORDER BY id
LIMIT $3
