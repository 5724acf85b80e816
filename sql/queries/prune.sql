-- Deletes one bounded batch of delivered rows older than the cutoff, oldest first.
-- $1: the cutoff, $2: the batch size. Only delivered rows are ever deleted.
WITH doomed AS (
    SELECT id FROM fga_outbox
    WHERE processed_at IS NOT NULL AND processed_at < $1
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM fga_outbox o USING doomed WHERE o.id = doomed.id
