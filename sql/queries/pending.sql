-- Pending rows and the age of the oldest, for the metrics endpoint. Both use the pending index.
SELECT
    (SELECT count(*) FROM fga_outbox WHERE processed_at IS NULL AND failed_at IS NULL) AS pending,
    (SELECT extract(epoch FROM clock_timestamp() - created_at)::float8
       FROM fga_outbox WHERE processed_at IS NULL AND failed_at IS NULL
       ORDER BY id LIMIT 1) AS oldest_pending_age_seconds
