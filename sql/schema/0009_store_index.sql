-- fga-relay schema, part 9: rows that name their OpenFGA store.
--
-- A row may name its store (`store_id` in its payload; rows naming none go to the relay's
-- configured store). A Write carries one store's rows, and a pass reads pending rows in id order:
-- when they are spread over many stores, a page holds a row or two of each. So the relay reads a
-- store's next pending rows ahead, in id order, through this index. It holds only pending rows
-- that name a store: a table whose rows name none pays nothing for it at insert.
--
-- Made only where it is missing (see part 1): CREATE INDEX takes a lock writers conflict with
-- even when the index is there, and holds them for the time of the build (it reads the table; it
-- holds only the pending rows naming a store). On a large table, create it CONCURRENTLY yourself
-- first, with this definition, and `migrate` finds it there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class i JOIN pg_class r ON r.relnamespace = i.relnamespace
                    WHERE r.oid = 'fga_outbox'::regclass
                      AND i.relname = 'fga_outbox_store_idx') THEN
        CREATE INDEX IF NOT EXISTS fga_outbox_store_idx
            ON fga_outbox ((payload->>'store_id'), id)
            WHERE processed_at IS NULL AND failed_at IS NULL AND payload ? 'store_id';
    END IF;
END
$$;
