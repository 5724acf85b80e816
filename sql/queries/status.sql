-- Delivered rows, for `status` (pending.sql gives the rest). They are counted in full, which
-- takes a moment on a large table. Also what the statistics say of the table's vacuuming: old
-- row versions not yet vacuumed away (each delivered row leaves one, which every claim walks past
-- in the claim index until VACUUM removes it) and how long ago it was last vacuumed (NULL:
-- never, or no statistics yet).
SELECT (SELECT count(*) FROM fga_outbox WHERE processed_at IS NOT NULL) AS delivered,
       s.n_dead_tup AS dead_row_versions,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS last_vacuum_age_seconds
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_user_tables s ON s.relid = 'fga_outbox'::regclass
