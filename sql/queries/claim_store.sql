-- Reads ahead the lowest pending rows of one store that rows name, which the relay does not
-- hold yet, in id order, for a Write of that store that the queue did not fill (rows spread over
-- many stores). $1: the store id, $2: the ids the relay holds, $3: how many rows. Through
-- fga_outbox_store_idx (its predicate repeated here so that the planner may use it). Nothing is
-- locked, as in claim.sql; no cursor, as there.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
  AND payload->>'store_id' = $1
  AND NOT (id IN (SELECT unnest($2::bigint[])))
ORDER BY id
LIMIT $3
