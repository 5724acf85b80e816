-- Reads the next page of pending rows, in id order, for planning Writes. $1: the smallest id not
-- read yet (the smallest bigint to start: ids may be 0 or below), $2: how many rows.
--
-- Nothing is locked here: each Write locks its own rows (lock.sql) in a transaction of its own,
-- held while the Write is in flight, and marks them delivered in it. A row another session holds
-- is found then, and nothing after it on its tuples is sent.
--
-- The payload comes as text: jsonb holds documents (numbers beyond a double, deep nesting) that
-- a full JSON decode refuses, and the relay reads only the keys it needs.
-- An adopted table (the application's own) may allow NULL in created_at and attempts; such a
-- row is read as just created and never tried, not refused.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at IS NOT NULL
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND id >= $1
ORDER BY id
LIMIT $2
