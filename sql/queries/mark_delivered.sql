-- Marks rows delivered: OpenFGA accepted every one of their tuples. $1: the ids.
UPDATE fga_outbox
SET processed_at = clock_timestamp()
WHERE id = ANY($1) AND processed_at IS NULL
