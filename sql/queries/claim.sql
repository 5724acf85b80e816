-- Reads the next page of pending rows, in id order, for planning Writes. $1: the last id of the
-- previous page (0 to start), $2: how many rows.
--
-- Nothing is locked here: each Write locks its own rows (lock.sql) in a transaction of its own,
-- held while the Write is in flight, and marks them delivered in it. A row another session holds
-- is found then, and nothing after it on its tuples is sent.
--
-- The payload comes as text: jsonb holds documents (numbers beyond a double, deep nesting) that
-- a full JSON decode refuses, and the relay reads only the keys it needs.
SELECT id, payload::text, created_at, attempts
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND id > $1
ORDER BY id
LIMIT $2
