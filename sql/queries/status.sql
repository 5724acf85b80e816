-- Delivered rows, for `status` (pending.sql gives the rest). They are counted in full, which
-- takes a moment on a large table. Also what the statistics say of the table's vacuuming: old
-- row versions not yet vacuumed away (each delivered row leaves one, which every claim walks past
-- in the claim index until VACUUM removes it) and how long ago it was last vacuumed. Both are
-- NULL when the statistics have nothing on the table yet; the age also when it was never
-- vacuumed.
SELECT (SELECT count(*) FROM fga_outbox WHERE processed_at IS NOT NULL) AS delivered,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'fga_outbox'::regclass)
           AS dead_row_versions,
       (SELECT extract(epoch FROM now() - greatest(last_vacuum, last_autovacuum))::float8
          FROM pg_stat_user_tables WHERE relid = 'fga_outbox'::regclass)
           AS last_vacuum_age_seconds
