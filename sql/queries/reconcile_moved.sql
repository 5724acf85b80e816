-- Records the tuples (of each store) that rows after $1 (the check's start) touch. Reads only
-- those rows.
INSERT INTO reconcile_moved (store, object, relation, "user")
SELECT DISTINCT store, object, relation, "user" FROM reconcile_ops WHERE id > $1
ON CONFLICT DO NOTHING
