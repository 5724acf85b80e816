-- The highest pending id, or NULL when nothing is pending.
SELECT max(id) FROM fga_outbox WHERE processed_at IS NULL AND failed_at IS NULL
