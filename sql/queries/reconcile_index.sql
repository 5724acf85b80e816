-- After reconcile_expected is filled: its key index (built once, not row by row), and the
-- statistics the planner needs (temporary tables are never analysed automatically).
CREATE UNIQUE INDEX ON reconcile_expected (store, object, relation, "user");
ANALYZE reconcile_expected;
