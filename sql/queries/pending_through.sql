-- How many rows at or below an id are still pending. $1: the id.
SELECT count(*) FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL AND id <= $1
