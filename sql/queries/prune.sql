-- Deletes one bounded batch of delivered rows older than the cutoff, oldest first.
-- $1: the cutoff, $2: the batch size, $3: only rows of this store (the id the rows name, '' for
-- rows naming none; NULL: every store). Only delivered rows are ever deleted.
WITH doomed AS (
    SELECT id FROM fga_outbox
    WHERE processed_at IS NOT NULL AND processed_at < $1
      AND ($3::text IS NULL OR coalesce(payload->>'store_id', '') = $3::text)
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM fga_outbox o USING doomed WHERE o.id = doomed.id
