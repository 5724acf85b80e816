-- Every tuple that is not plainly in step, in (store, key) order: its last operation is not
-- delivered, newer rows touch it, or its store's holding differs in presence or condition (as
-- jsonb compares them; the relay compares conditions once more, with numbers as OpenFGA's
-- doubles).
SELECT e.object, e.relation, e."user", e.present, e.condition, e.row_id, e.state,
       a.object IS NOT NULL AS held, a.condition AS held_condition,
       m.object IS NOT NULL AS moved, e.store
FROM reconcile_expected e
LEFT JOIN reconcile_actual a
       ON a.store = e.store AND a.object = e.object AND a.relation = e.relation
      AND a."user" = e."user"
LEFT JOIN reconcile_moved m
       ON m.store = e.store AND m.object = e.object AND m.relation = e.relation
      AND m."user" = e."user"
WHERE m.object IS NOT NULL
   OR e.state <> 'delivered'
   OR e.present <> (a.object IS NOT NULL)
   OR (e.present AND e.condition IS DISTINCT FROM a.condition)
ORDER BY e.store, e.object, e.relation, e."user"
