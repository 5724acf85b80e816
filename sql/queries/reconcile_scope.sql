-- The last row created before a cutoff, for `reconcile --since`: the check starts after it.
-- $1: how far back, in seconds. Walks the primary key backwards from the newest row, so it reads
-- only the rows newer than the cutoff (and one more).
SELECT id FROM fga_outbox
WHERE created_at < clock_timestamp() - make_interval(secs => $1)
ORDER BY id DESC
LIMIT 1
