-- Fills reconcile_expected: per tuple that rows $1..$2 touch, its last operation in id order
-- (within a row, a write wins over a delete of the same tuple, as OpenFGA applies deletes
-- first), with the row's id and state. PostgreSQL sorts, spilling to disk past work_mem.
INSERT INTO reconcile_expected (object, relation, "user", present, condition, row_id, state)
SELECT DISTINCT ON (object, relation, "user")
       object, relation, "user", present, condition, id, state
FROM reconcile_ops
WHERE id >= $1 AND id <= $2
ORDER BY object, relation, "user", id DESC, present DESC
