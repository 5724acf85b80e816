-- The lowest pending rows of one lane below a row that is taken into it out of turn (a row
-- changed since it was read, or corrected by hand, read again by id), which the relay does not
-- hold yet, in id order: they go before it. $1: that row's id, $2: the lane's store keys (as
-- claim.sql matches them: '' for the rows naming none, and the configured store's id for those
-- naming it), $3: the ids the relay holds, $4: how many rows. Nothing is locked, as in
-- claim.sql. Walks the pending rows below $1 only, and runs only when such a row is looked at.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND id < $1
  AND coalesce(payload->>'store_id', '') IN (SELECT unnest($2::text[]))
  AND NOT (id IN (SELECT unnest($3::bigint[])))
ORDER BY id
LIMIT $4
