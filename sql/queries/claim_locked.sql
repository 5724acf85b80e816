-- The lowest pending rows the relay does not hold yet (as claim.sql), read and locked at once in
-- a transaction of their own, when the relay's queue is empty: the rows a wake-up finds. $1: the
-- ids it holds (in flight), $2: the stores it does not want now, $3: how many rows.
--
-- When the whole read is the next Write (the usual case), the Write goes in this transaction
-- and needs no lock statement of its own: a round trip less between a commit and OpenFGA. When
-- it is not, the relay rolls this transaction back before any Write locks its rows.
--
-- The advisory lock is the one every Write's transaction takes (see lock.sql), taken only once
-- a pending row is found: a read that finds nothing takes no transaction id and writes nothing.
-- NOWAIT: a row another session holds fails the whole read (55P03); the relay then reads
-- without locks (claim.sql), and finds the held row when its Write tries to lock it.
-- An adopted table (the application's own) may allow NULL in created_at and attempts; such a
-- row is read as just created and never tried, not refused.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL
  AND NOT (id IN (SELECT unnest($1::bigint[])))
  AND (cardinality($2::text[]) = 0
       OR NOT (coalesce(payload->>'store_id', '') IN (SELECT unnest($2::text[]))))
  AND pg_advisory_xact_lock(1718051123,
          (pg_current_xact_id()::text::bigint % 4294967296 - 2147483648)::integer) IS NOT NULL
ORDER BY id
LIMIT $3
FOR UPDATE NOWAIT
