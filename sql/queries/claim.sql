-- Claims the next page of pending rows, in id order, for delivery within this transaction.
-- $1: the last id of the previous page (0 to start), $2: how many rows.
--
-- Rows are locked FOR UPDATE SKIP LOCKED, so two drainers never hold the same row. A row skipped
-- because another session holds it is still returned, with `mine` false: the drainer must not
-- deliver anything after it on the same tuples, or a grant and its revoke could be reordered.
-- Skipped rows after the last claimed one are returned too when the page is not full (there is
-- no next page to find them): the relay must know that rows are held, to look again soon.
--
-- The payload comes as text: jsonb holds documents (numbers beyond a double, deep nesting) that
-- a full JSON decode refuses, and the relay reads only the keys it needs.
WITH claimed AS (
    SELECT id, payload, created_at, attempts
    FROM fga_outbox
    WHERE processed_at IS NULL AND failed_at IS NULL AND id > $1
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), skipped AS (
    SELECT id, payload, created_at, attempts
    FROM fga_outbox
    WHERE processed_at IS NULL AND failed_at IS NULL
      AND id > $1
      AND (id < (SELECT max(id) FROM claimed) OR (SELECT count(*) FROM claimed) < $2)
      AND id NOT IN (SELECT id FROM claimed)
)
SELECT id, payload::text, created_at, attempts, true AS mine FROM claimed
UNION ALL
SELECT id, payload::text, created_at, attempts, false AS mine FROM skipped
ORDER BY id
