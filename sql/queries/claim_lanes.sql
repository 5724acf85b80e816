-- Reads the lowest pending rows not in hand of the lanes (stores) not left out: the read while a
-- store is held. $1: the ids the relay holds, $2: the stores it does not want now ('' stands
-- for the rows naming none), as claim.sql matches them, $3: how many rows, $4: the configured
-- store's id (the relay reads this way only once it is known), $5: straight to the lanes, no
-- walk (the read of the stores with no row in hand, which leaves out every store with rows in
-- hand: the rows in id order past the hand are theirs, and the walk would find nothing).
--
-- First, as claim.sql, the lowest pending rows in id order, but no more than twice a read's
-- worth past the rows in hand: when that finds a read's worth of rows of lanes not left out, or
-- reaches the last pending row, those rows are the read. Otherwise the rows of held stores fill
-- the head of the table, and walking on past them, as claim.sql does, would cost every read the
-- whole of a held store's backlog. Then every lane not left out is read from an index of its
-- own instead, from its lowest pending id up, and a lane left out is not looked at: the rows
-- naming none through fga_outbox_unnamed_idx, the rows naming a store through
-- fga_outbox_store_idx (by store, then id). The stores with pending rows are found by a loose
-- scan of fga_outbox_store_idx: one descent a store, not one a row. Either way a read costs
-- what the settings bound, not what a held store has pending.
--
-- The configured store's lane is the rows naming none, those naming its id, and (as claim.sql
-- has them) those naming '': they are merged in id order before its share is taken, so that no
-- row of the lane is read while a lower one of it is left unread. No cursor, as in claim.sql: a
-- row committed late is found by the next read of its lane, before any later row of its lane.
--
-- Each lane gets an equal share of the rows asked for (at least one), so that a read by lane
-- costs about the rows asked for and a descent for each store with rows pending; the relay
-- reads again while reads bring rows. Every lane is read in its index's order, so that no plan
-- walks the pending rows in id order instead. Nothing is locked, as in claim.sql.
WITH RECURSIVE walk AS MATERIALIZED (
    SELECT id, payload, created_at, attempts, retried_at FROM fga_outbox
    WHERE processed_at IS NULL AND failed_at IS NULL
    ORDER BY id
    LIMIT CASE WHEN $5::boolean THEN 0 ELSE 2 * $3::bigint + cardinality($1::bigint[]) END
),
found AS MATERIALIZED (
    SELECT * FROM walk
    WHERE NOT (id IN (SELECT unnest($1::bigint[])))
      AND NOT (coalesce(payload->>'store_id', '') IN (SELECT unnest($2::text[])))
    ORDER BY id
    LIMIT $3
),
-- Whether the walk fell short: fewer rows found than asked for, and pending rows left past it.
short AS MATERIALIZED (
    SELECT $5::boolean
           OR ((SELECT count(*) FROM found) < $3
               AND (SELECT count(*) FROM walk) = 2 * $3::bigint + cardinality($1::bigint[])) AS yes
),
named(store) AS (
    (SELECT payload->>'store_id' FROM fga_outbox
     WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
       AND payload->>'store_id' IS NOT NULL
     ORDER BY payload->>'store_id'
     LIMIT 1)
    UNION ALL
    SELECT (SELECT payload->>'store_id' FROM fga_outbox
            WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
              AND payload->>'store_id' > named.store
            ORDER BY payload->>'store_id'
            LIMIT 1)
    FROM named
    WHERE named.store IS NOT NULL
),
open AS MATERIALIZED (
    SELECT store FROM named
    WHERE store IS NOT NULL AND store <> '' AND store <> $4
      AND NOT (store = ANY ($2::text[]))
),
share AS MATERIALIZED (
    SELECT greatest(1, ceil($3::bigint::float8 / greatest(1,
               (SELECT count(*) FROM open) + CASE WHEN '' = ANY ($2::text[]) THEN 0 ELSE 1 END
           )))::bigint AS rows
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
     WHERE NOT ('' = ANY ($2::text[]))
     ORDER BY id
     LIMIT (SELECT rows FROM share))
    UNION ALL
    SELECT lane.* FROM open, LATERAL (
        SELECT id, payload, created_at, attempts, retried_at FROM fga_outbox
        WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id'
          AND payload->>'store_id' = open.store
          AND NOT (id IN (SELECT unnest($1::bigint[])))
        ORDER BY payload->>'store_id', id
        LIMIT (SELECT rows FROM share)) lane
)
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at
FROM (
    SELECT * FROM found WHERE NOT (SELECT yes FROM short)
    UNION ALL
    SELECT * FROM lanes WHERE (SELECT yes FROM short)
) rows
ORDER BY id
LIMIT $3
