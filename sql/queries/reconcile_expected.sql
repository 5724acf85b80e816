-- Fills reconcile_expected: per tuple of each store that rows $1..$2 touch (of store $3 alone,
-- '' for the configured one; NULL: every store), its last operation in id order (within a row, a
-- write wins over a delete of the same tuple, as OpenFGA applies deletes first), with the row's
-- id and state. PostgreSQL sorts, spilling to disk past work_mem.
INSERT INTO reconcile_expected (store, object, relation, "user", present, condition, row_id, state)
SELECT DISTINCT ON (store, object, relation, "user")
       store, object, relation, "user", present, condition, id, state
FROM reconcile_ops
WHERE id >= $1 AND id <= $2 AND ($3::text IS NULL OR store = $3::text)
ORDER BY store, object, relation, "user", id DESC, present DESC
