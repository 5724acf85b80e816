-- The next page of compared tuples in (store, key) order, after ($1, $2, $3, $4), at most $5:
-- the tuples `reconcile` reads back one by one, each from its store.
SELECT store, object, relation, "user" FROM reconcile_expected
WHERE state = 'delivered' AND (store, object, relation, "user") > ($1, $2, $3, $4)
ORDER BY store, object, relation, "user"
LIMIT $5
