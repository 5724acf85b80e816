-- For --all: the tuples OpenFGA holds that the outbox does not speak of, in (store, key) order.
SELECT object, relation, "user", condition, store FROM reconcile_actual
WHERE NOT known
ORDER BY store, object, relation, "user"
