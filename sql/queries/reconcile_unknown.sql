-- For --all: the tuples OpenFGA holds that the outbox does not speak of, in key order.
SELECT object, relation, "user", condition FROM reconcile_actual
WHERE NOT known
ORDER BY object, relation, "user"
