-- Deletes one bounded batch of delivered rows older than the cutoff, in id order from a cursor,
-- none of them above a row of its store delivered out of id order that this prune keeps, and
-- none on a tuple of a dead row of its store below it. $1: the cutoff, $2: the batch size, $3:
-- only rows of this store (the id the rows name, '' for rows naming none; NULL: every store),
-- $4: the relay's configured store id, when known (NULL: not known), $5: the cursor, the last id
-- the batch before looked at (0 at first), $6: the ids the batches before kept for dead rows.
-- Only delivered rows are ever deleted. Returns the rows deleted; the rows looked at and the last
-- of them (the next batch's cursor: a batch that looked at fewer than $2 is the last); the
-- lowest id of the rows that hold their whole store (NULL when there is none); the rows kept
-- for dead rows, the lowest of those dead rows, and those rows' ids.
--
-- A row's store, its *lane* here: the store the rows name, the rows naming none being one with
-- the rows naming the configured store ($4); with that id not known, rows naming none go with
-- every store.
--
-- A row that came back from dead (retried_at) is delivered after later rows, and the relay may
-- have skipped its operations as superseded by a later delivered row on the same tuple; a row
-- marked delivered by hand over its dead letter (failed_at and processed_at) was never applied
-- in its place either. Such a row's processed_at is out of id order: deleting a later row on its
-- tuple, older by processed_at, would leave its operation as the tuple's last in id order, and
-- `reconcile --repair` would replay it (a revoked grant granted again). So nothing of its store
-- above the first such row still kept (pending again, or delivered after the cutoff) is
-- deleted: which of those rows touch its tuples is not known without reading them all. Found
-- through fga_outbox_retried_idx (part 11), whose predicate is the first condition here; looked
-- for again at each batch, so a row retried while prune runs holds back the batches after.
--
-- A dead row is what `retry` may bring back: the relay then skips each of its operations that a
-- later delivered row on the same tuple supersedes (superseded.sql). Deleting those later rows
-- would have it replay the operation over them: a grant dead, then revoked, then retried, would
-- be granted again. So a delivered row on a tuple that a dead row below it touches stays, in
-- its lane, until that dead row is delivered or deleted. Only those rows: a dead row nobody
-- retries (one OpenFGA rejects) must not stop its store's pruning. A later row on a dead row's
-- tuple is sent only once that row is dead (before, it waits behind it), so it was delivered
-- after the row died: only a row dead since before the cutoff can hold a row older than it,
-- and the others are not read. A row that died again after a retry may have died first long
-- before: it counts whenever it died. Read through fga_outbox_dead_idx (part 1). A later row
-- on one of those tuples stays too, and so on, in this batch and (the ids kept so far, $6) the
-- batches after: a row kept on one of its tuples must not be left as another tuple's last
-- operation for `reconcile` while a later row on that tuple goes.
--
-- A dead row whose operations cannot be read (a malformed payload: the runbook's way is to fix
-- it in place and retry it) may mean any tuple of its store: it holds its whole store above it,
-- as a retried row does, until it is delivered or deleted.
WITH RECURSIVE kept AS (
    SELECT CASE WHEN s = coalesce($4::text, '') THEN '' ELSE s END AS lane, min(id) AS first
    FROM (SELECT id, coalesce(payload->>'store_id', '') AS s FROM fga_outbox
          WHERE (retried_at IS NOT NULL OR (failed_at IS NOT NULL AND processed_at IS NOT NULL))
            AND (processed_at >= $1 OR (processed_at IS NULL AND failed_at IS NULL))
          UNION ALL
          -- A dead row with operations that cannot be read: which tuples it meant is not known.
          SELECT id, coalesce(payload->>'store_id', '') FROM fga_outbox d
          WHERE failed_at IS NOT NULL AND processed_at IS NULL
            AND (failed_at < $1 OR retried_at IS NOT NULL)
            AND (jsonb_typeof(payload) <> 'object'
                 OR (payload ? 'writes' AND jsonb_typeof(payload->'writes') <> 'array')
                 OR (payload ? 'deletes' AND jsonb_typeof(payload->'deletes') <> 'array')
                 OR EXISTS (
                     SELECT FROM jsonb_array_elements(
                         CASE WHEN jsonb_typeof(d.payload->'writes') = 'array'
                              THEN d.payload->'writes' ELSE '[]'::jsonb END
                         || CASE WHEN jsonb_typeof(d.payload->'deletes') = 'array'
                                 THEN d.payload->'deletes' ELSE '[]'::jsonb END) AS op
                     WHERE coalesce(jsonb_typeof(op->'object'), '') <> 'string'
                        OR coalesce(jsonb_typeof(op->'relation'), '') <> 'string'
                        OR coalesce(jsonb_typeof(op->'user'), '') <> 'string'))) k
    GROUP BY 1
), batch AS MATERIALIZED (
    SELECT o.id, o.payload, l.lane FROM fga_outbox o
    CROSS JOIN LATERAL (
        SELECT CASE WHEN coalesce(o.payload->>'store_id', '') = coalesce($4::text, '') THEN ''
                    ELSE coalesce(o.payload->>'store_id', '') END AS lane
    ) l
    WHERE o.id > $5 AND o.processed_at IS NOT NULL AND o.processed_at < $1
      -- A lane, not a spelling: `--store none` and `--store <configured id>` are one store.
      AND ($3::text IS NULL
           OR l.lane = CASE WHEN $3::text = coalesce($4::text, '') THEN '' ELSE $3::text END)
      AND NOT EXISTS (
          SELECT FROM kept
          WHERE kept.first < o.id
            AND (kept.lane = l.lane
                 OR ($4::text IS NULL AND (kept.lane = '' OR l.lane = ''))))
    ORDER BY o.id
    LIMIT $2
), batch_ops AS MATERIALIZED (
    SELECT b.id, b.lane, op->>'object' AS object, op->>'relation' AS relation,
           op->>'user' AS "user"
    FROM batch b
    CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(b.payload->'writes') = 'array'
             THEN b.payload->'writes' ELSE '[]'::jsonb END
        || CASE WHEN jsonb_typeof(b.payload->'deletes') = 'array'
                THEN b.payload->'deletes' ELSE '[]'::jsonb END) AS op
), held_dead AS (
    -- The dead rows' operations are read as they come and looked up among the batch's few.
    SELECT bo.id, min(d.id) AS by
    FROM fga_outbox d
    CROSS JOIN LATERAL (
        SELECT CASE WHEN coalesce(d.payload->>'store_id', '') = coalesce($4::text, '') THEN ''
                    ELSE coalesce(d.payload->>'store_id', '') END AS lane
    ) l
    CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(d.payload->'writes') = 'array'
             THEN d.payload->'writes' ELSE '[]'::jsonb END
        || CASE WHEN jsonb_typeof(d.payload->'deletes') = 'array'
                THEN d.payload->'deletes' ELSE '[]'::jsonb END) AS op
    JOIN batch_ops bo ON bo.object = op->>'object' AND bo.relation = op->>'relation'
                     AND bo."user" = op->>'user'
    WHERE d.failed_at IS NOT NULL AND d.processed_at IS NULL
      AND (d.failed_at < $1 OR d.retried_at IS NOT NULL)
      AND d.id < bo.id
      AND (l.lane = bo.lane OR ($4::text IS NULL AND (l.lane = '' OR bo.lane = '')))
    GROUP BY bo.id
), prior_ops AS (
    -- The rows kept by the batches before ($6): what stays below this batch on their tuples.
    SELECT p.id, l.lane, op->>'object' AS object, op->>'relation' AS relation,
           op->>'user' AS "user"
    FROM fga_outbox p
    CROSS JOIN LATERAL (
        SELECT CASE WHEN coalesce(p.payload->>'store_id', '') = coalesce($4::text, '') THEN ''
                    ELSE coalesce(p.payload->>'store_id', '') END AS lane
    ) l
    CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(p.payload->'writes') = 'array'
             THEN p.payload->'writes' ELSE '[]'::jsonb END
        || CASE WHEN jsonb_typeof(p.payload->'deletes') = 'array'
                THEN p.payload->'deletes' ELSE '[]'::jsonb END) AS op
    WHERE p.id = ANY($6::bigint[])
), held(id) AS (
    -- A row kept stays on each of its tuples: every later row on any of them stays too, or
    -- `reconcile` would read the kept row's operation as the tuple's last.
    SELECT id FROM held_dead
    UNION
    SELECT bo.id FROM batch_ops bo
    JOIN prior_ops po ON po.object = bo.object AND po.relation = bo.relation
                     AND po."user" = bo."user" AND po.id < bo.id
                     AND (po.lane = bo.lane
                          OR ($4::text IS NULL AND (po.lane = '' OR bo.lane = '')))
    UNION
    SELECT bo.id FROM held h
    JOIN batch_ops ho ON ho.id = h.id
    JOIN batch_ops bo ON bo.object = ho.object AND bo.relation = ho.relation
                     AND bo."user" = ho."user" AND ho.id < bo.id
                     AND (ho.lane = bo.lane
                          OR ($4::text IS NULL AND (ho.lane = '' OR bo.lane = '')))
), doomed AS (
    -- Looked at again under the lock: a row made pending again meanwhile stays.
    SELECT o.id FROM fga_outbox o
    WHERE o.id IN (SELECT id FROM batch EXCEPT SELECT id FROM held)
      AND o.processed_at IS NOT NULL AND o.processed_at < $1
    FOR UPDATE OF o SKIP LOCKED
), deleted AS (
    DELETE FROM fga_outbox o USING doomed WHERE o.id = doomed.id
    RETURNING o.id
)
SELECT (SELECT count(*) FROM deleted)::bigint AS deleted,
       (SELECT count(*) FROM batch)::bigint AS looked_at,
       (SELECT max(id) FROM batch) AS last,
       (SELECT min(first) FROM kept) AS kept_from,
       (SELECT count(*) FROM held)::bigint AS held,
       (SELECT min(by) FROM held_dead) AS held_by,
       ARRAY(SELECT id FROM held) AS held_ids
