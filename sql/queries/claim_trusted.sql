-- Reads the lowest pending rows not in hand of the lanes of the given stores, those that work
-- (trusted: OpenFGA answered them, and their last answered Write did not fail): the read made
-- while the queue is at its bound with rows of stores that fail or never answer, whose rows no
-- other read then takes in, or takes only behind those stores' lower ids. $1: the ids the relay
-- holds, $2: the stores whose lanes to read ('' stands for the configured store's lane), $3: how
-- many rows, $4: the configured store's id (the relay reads this way only once it is known).
--
-- As claim_lanes.sql reads a lane: from its own index, from its lowest pending id not in hand,
-- no cursor, so that a row committed late is found before any later row of its lane, and order
-- per (store, tuple) holds. The configured store's lane is the rows naming none, those naming
-- its id, and those naming '', merged in id order before its share is taken. Each lane gets an
-- equal share of the rows asked for (at least one); nothing is locked.
WITH share AS MATERIALIZED (
    SELECT greatest(1, ceil($3::bigint::float8 / greatest(1, cardinality($2::text[]))))::bigint
           AS rows
),
lanes AS (
    (SELECT * FROM (
        (SELECT id, payload, created_at, attempts, retried_at FROM fga_outbox
         WHERE processed_at IS NULL AND failed_at IS NULL AND (payload->>'store_id') IS NULL
           AND NOT (id IN (SELECT unnest($1::bigint[])))
         ORDER BY id
         LIMIT (SELECT rows FROM share))
        UNION ALL
        (SELECT id, payload, created_at, attempts, retried_at FROM fga_outbox
         WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
           AND payload->>'store_id' = $4 AND $4 <> ''
           AND NOT (id IN (SELECT unnest($1::bigint[])))
         ORDER BY id
         LIMIT (SELECT rows FROM share))
        UNION ALL
        (SELECT id, payload, created_at, attempts, retried_at FROM fga_outbox
         WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
           AND payload->>'store_id' = ''
           AND NOT (id IN (SELECT unnest($1::bigint[])))
         ORDER BY id
         LIMIT (SELECT rows FROM share))
     ) configured
     WHERE '' = ANY ($2::text[])
     ORDER BY id
     LIMIT (SELECT rows FROM share))
    UNION ALL
    SELECT lane.* FROM unnest($2::text[]) AS open(store), LATERAL (
        SELECT id, payload, created_at, attempts, retried_at FROM fga_outbox
        WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
          AND payload->>'store_id' = open.store
          AND NOT (id IN (SELECT unnest($1::bigint[])))
        ORDER BY payload->>'store_id', id
        LIMIT (SELECT rows FROM share)) lane
    WHERE open.store <> '' AND open.store <> $4
)
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at
FROM lanes
ORDER BY id
LIMIT $3
