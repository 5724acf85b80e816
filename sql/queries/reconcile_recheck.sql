-- For --repair, under the lock: drops the corrections of tuples that rows after $1 (the check's
-- start) touch, in their store. The application changed them meanwhile; correcting them now
-- would override it.
DELETE FROM reconcile_drift d
USING (SELECT DISTINCT store, object, relation, "user" FROM reconcile_ops WHERE id > $1) m
WHERE d.store = m.store AND d.object = m.object AND d.relation = m.relation
  AND d."user" = m."user"
