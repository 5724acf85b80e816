-- Records drifted tuples for --repair: $1 kind, $2..$4 object, relation, user, $5 condition,
-- $6 store.
INSERT INTO reconcile_drift (kind, object, relation, "user", condition, store)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[])
