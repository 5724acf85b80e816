-- The role that owns the outbox table, $1 (as the session's search_path finds it): the role that
-- runs `migrate` (DDL) and `prune` (the only DELETE), which the relay's role may not do. No row
-- when there is no such table. Read from the catalog, which every role may read.
SELECT pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = to_regclass($1)
