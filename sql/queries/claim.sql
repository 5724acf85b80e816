-- Reads the lowest pending rows the relay does not hold yet, in id order, for planning Writes.
-- $1: the ids it holds (in its queue or in flight), $2: the stores whose rows it does not want
-- now (held after failures, or with enough rows in hand; '' stands for the rows naming none),
-- $3: how many rows.
--
-- No cursor: every read starts from the lowest pending id. A row committed late, with an id
-- below rows read already, is found by the next read, before any row committed after it: any
-- snapshot that sees a later row of a writer serialised behind it sees it too.
--
-- The ids held and the stores left out are matched through hashed subplans (one hash table a
-- read, not one array walk a row): the scan walks the pending rows through
-- fga_outbox_claim_idx in id order and stops at the LIMIT.
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
       retried_at
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL
  AND NOT (id IN (SELECT unnest($1::bigint[])))
  AND (cardinality($2::text[]) = 0
       OR NOT (coalesce(payload->>'store_id', '') IN (SELECT unnest($2::text[]))))
ORDER BY id
LIMIT $3
