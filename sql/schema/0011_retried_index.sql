-- fga-relay schema, part 11: the rows delivered out of id order, for `fga-relay prune`.
--
-- A row that came back from dead (retried_at set, see part 8), or that was marked delivered by
-- hand over its dead letter (failed_at and processed_at both set), is delivered after rows with
-- higher ids. `reconcile` takes a tuple's last operation in id order; a retried row's operation
-- that the relay skipped as superseded by a later row is only outranked by that later row. So
-- prune keeps every delivered row above the first such row it keeps (see
-- sql/queries/prune.sql), and finds that row through this index at each batch instead of reading
-- the whole table. It holds only such rows: writers pay nothing for it at insert (a new row has
-- neither column set), and it stays as small as the rows that were ever dead and are not pruned.
--
-- Made only where it is missing (see part 1): CREATE INDEX takes a lock writers conflict with
-- even when the index is there, and holds them for the time of the build (it reads the table;
-- it holds only the rows above). On a large table, create it CONCURRENTLY yourself first, with
-- this definition, and `migrate` finds it there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class i JOIN pg_class r ON r.relnamespace = i.relnamespace
                    WHERE r.oid = 'fga_outbox'::regclass
                      AND i.relname = 'fga_outbox_retried_idx') THEN
        CREATE INDEX IF NOT EXISTS fga_outbox_retried_idx ON fga_outbox (id)
            WHERE retried_at IS NOT NULL OR (failed_at IS NOT NULL AND processed_at IS NOT NULL);
    END IF;
END
$$;
