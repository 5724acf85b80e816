-- What `drain` is to deliver: the lowest and highest pending ids (NULL when nothing is pending),
-- the database's clock now, and the ids between them of the rows dead now, from which
-- `drain_outcome.sql` tells what became of the rows pending. One statement, so one snapshot: a
-- row dead-lettered by a transaction that began before it and commits after it is pending here
-- (its `failed_at`, that transaction's clock, is older than this `now()`), and counted dead
-- afterwards by not being among these ids, not by its time. Dead rows are few, and found through
-- fga_outbox_dead_idx.
WITH pending AS (
    SELECT min(id) AS lo, max(id) AS hi FROM fga_outbox
    WHERE processed_at IS NULL AND failed_at IS NULL
)
SELECT lo, hi, now(),
       ARRAY(SELECT id FROM fga_outbox
             WHERE failed_at IS NOT NULL AND processed_at IS NULL AND id BETWEEN lo AND hi
             ORDER BY id)
FROM pending
