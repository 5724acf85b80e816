-- Pending rows, the age of the oldest, and dead rows, for the metrics endpoint and `status`. Each
-- uses a partial index (pending, dead). A row with processed_at set is delivered whatever
-- failed_at says (an operator who marks a dead row delivered by hand may leave failed_at set): it
-- is not counted dead, as in every other query on dead rows (dead_rows.sql, retry_*.sql, ...).
SELECT
    (SELECT count(*) FROM fga_outbox WHERE processed_at IS NULL AND failed_at IS NULL) AS pending,
    (SELECT extract(epoch FROM clock_timestamp() - created_at)::float8
       FROM fga_outbox WHERE processed_at IS NULL AND failed_at IS NULL
       ORDER BY id LIMIT 1) AS oldest_pending_age_seconds,
    (SELECT count(*) FROM fga_outbox WHERE failed_at IS NOT NULL AND processed_at IS NULL) AS dead
