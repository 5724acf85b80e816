-- fga-relay check: what `run` needs of the current role, granted or not ($1 the outbox table,
-- $2 its leader table; both exist). See sql/roles.sql for the grants.
SELECT
    has_table_privilege($1, 'SELECT') AS select_outbox,
    has_column_privilege($1, 'processed_at', 'UPDATE')
        AND has_column_privilege($1, 'failed_at', 'UPDATE')
        AND has_column_privilege($1, 'attempts', 'UPDATE')
        AND has_column_privilege($1, 'last_error', 'UPDATE') AS update_delivery_columns,
    has_table_privilege($2, 'SELECT')
        AND has_table_privilege($2, 'INSERT')
        AND has_table_privilege($2, 'UPDATE') AS use_leader,
    pg_is_in_recovery() AS standby,
    current_setting('default_transaction_read_only') = 'on' AS read_only,
    current_user::text AS role
