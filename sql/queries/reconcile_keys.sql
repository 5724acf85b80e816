-- The next page of compared tuples in key order, after ($1, $2, $3), at most $4: the tuples
-- `reconcile` reads back one by one.
SELECT object, relation, "user" FROM reconcile_expected
WHERE state = 'delivered' AND (object, relation, "user") > ($1, $2, $3)
ORDER BY object, relation, "user"
LIMIT $4
