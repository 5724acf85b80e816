-- fga-relay schema, part 10: the pending rows that name no store, in an index of their own.
--
-- With part 9, every pending row is in an index of its lane: the rows naming a store in
-- fga_outbox_store_idx (by store, then id), the rows naming none (no store_id, or null) here
-- (by id). While a store is
-- held (its Writes failing, or OpenFGA asked for a pause), the relay reads each other lane from
-- its own index, from its lowest pending id up, and never walks the held store's rows: with one
-- index for all (fga_outbox_claim_idx), a held store's backlog at the head of the table was
-- walked past at every read.
--
-- Writers of rows naming no store pay one more index entry per row (rows naming a store already
-- paid theirs in part 9); the entry goes once the row is delivered or dead (the next VACUUM).
--
-- Made only where it is missing (see part 1): CREATE INDEX takes a lock writers conflict with
-- even when the index is there, and holds them for the time of the build (it reads the table; it
-- holds only the pending rows naming no store). On a large table, create it CONCURRENTLY
-- yourself first, with this definition, and `migrate` finds it there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class i JOIN pg_class r ON r.relnamespace = i.relnamespace
                    WHERE r.oid = 'fga_outbox'::regclass
                      AND i.relname = 'fga_outbox_unnamed_idx') THEN
        CREATE INDEX IF NOT EXISTS fga_outbox_unnamed_idx ON fga_outbox (id)
            WHERE processed_at IS NULL AND failed_at IS NULL AND (payload->>'store_id') IS NULL;
    END IF;
END
$$;
