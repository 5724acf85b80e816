-- Deletes one bounded batch of delivered rows older than the cutoff, oldest first, none of them
-- above a row of its store delivered out of id order that this prune keeps. $1: the cutoff, $2:
-- the batch size, $3: only rows of this store (the id the rows name, '' for rows naming none;
-- NULL: every store), $4: the relay's configured store id, when known (NULL: not known). Only
-- delivered rows are ever deleted. Returns the rows deleted, and the lowest id of those kept
-- rows (NULL when there is none).
--
-- A row that came back from dead (retried_at) is delivered after later rows, and the relay may
-- have skipped its operations as superseded by a later delivered row on the same tuple; a row
-- marked delivered by hand over its dead letter (failed_at and processed_at) was never applied
-- in its place either. Such a row's processed_at is out of id order: deleting a later row on its
-- tuple, older by processed_at, would leave its operation as the tuple's last in id order, and
-- `reconcile --repair` would replay it (a revoked grant granted again). So nothing of its store
-- above the first such row still kept (pending again, or delivered after the cutoff) is
-- deleted: which of those rows touch its tuples is not known without reading them all. Its
-- store: the store the rows name, the rows naming none being one with the rows naming the
-- configured store ($4); with that id not known, rows naming none go with every store. A row
-- dead again holds nothing back (dead rows never do; see "Dead rows and order" in
-- docs/guarantees.md). Found through fga_outbox_retried_idx (part 11), whose predicate is the
-- first condition here; looked for again at each batch, so a row retried while prune runs holds
-- back the batches after.
WITH kept AS (
    SELECT CASE WHEN s = coalesce($4::text, '') THEN '' ELSE s END AS lane, min(id) AS first
    FROM (SELECT id, coalesce(payload->>'store_id', '') AS s FROM fga_outbox
          WHERE (retried_at IS NOT NULL OR (failed_at IS NOT NULL AND processed_at IS NOT NULL))
            AND (processed_at >= $1 OR (processed_at IS NULL AND failed_at IS NULL))) k
    GROUP BY 1
), doomed AS (
    SELECT o.id FROM fga_outbox o
    CROSS JOIN LATERAL (
        SELECT CASE WHEN coalesce(o.payload->>'store_id', '') = coalesce($4::text, '') THEN ''
                    ELSE coalesce(o.payload->>'store_id', '') END AS lane
    ) l
    WHERE o.processed_at IS NOT NULL AND o.processed_at < $1
      AND ($3::text IS NULL OR coalesce(o.payload->>'store_id', '') = $3::text)
      AND NOT EXISTS (
          SELECT FROM kept
          WHERE kept.first < o.id
            AND (kept.lane = l.lane
                 OR ($4::text IS NULL AND (kept.lane = '' OR l.lane = ''))))
    ORDER BY o.id
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
), deleted AS (
    DELETE FROM fga_outbox o USING doomed WHERE o.id = doomed.id
    RETURNING o.id
)
SELECT (SELECT count(*) FROM deleted)::bigint AS deleted, (SELECT min(first) FROM kept) AS kept_from
