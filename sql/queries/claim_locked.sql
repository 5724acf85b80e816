-- The first page of a pass, read and locked at once, in the transaction of that pass's first
-- Write. $1: the smallest id not read yet (the smallest bigint), $2: how many rows.
--
-- When the whole page is that one Write (the few rows a wake-up finds, the usual case), the
-- Write needs no lock statement of its own: a round trip less between a commit and OpenFGA.
-- When it is not, the relay rolls this transaction back before any Write locks its rows, and
-- goes on as after claim.sql.
--
-- The advisory lock is the one every Write's transaction takes (see lock.sql), taken only once
-- a pending row is found: a pass that finds nothing takes no transaction id and writes nothing.
-- NOWAIT: a row another session holds fails the whole read (55P03); the relay then reads the
-- page without locks (claim.sql), and finds the held row when its Write tries to lock it.
-- An adopted table (the application's own) may allow NULL in created_at and attempts; such a
-- row is read as just created and never tried, not refused.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at IS NOT NULL
FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND id >= $1
  AND pg_advisory_xact_lock(1718051123,
          (pg_current_xact_id()::text::bigint % 4294967296 - 2147483648)::integer) IS NOT NULL
ORDER BY id
LIMIT $2
FOR UPDATE NOWAIT
