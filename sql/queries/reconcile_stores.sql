-- The stores whose tuples `reconcile` reads back whole: those with compared tuples, or (with
-- $1, for --all) with any tuple the outbox speaks of. '' is the configured store.
SELECT DISTINCT store FROM reconcile_expected
WHERE state = 'delivered' OR $1
ORDER BY store
