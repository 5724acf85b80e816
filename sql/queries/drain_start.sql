-- What `drain` is to deliver: the lowest and highest pending ids (NULL when nothing is pending),
-- and the database's clock now, from which `drain_outcome.sql` tells what became of them.
SELECT min(id), max(id), now() FROM fga_outbox
WHERE processed_at IS NULL AND failed_at IS NULL
