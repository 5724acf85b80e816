-- Records tuples read from OpenFGA's store $1 ('' the configured one): $2..$4 object, relation
-- and user, $5 the condition. Keeps those the outbox speaks of, and the others too when $6
-- (--all). A tuple read twice (OpenFGA pages in insertion order, so one rewritten meanwhile comes
-- again) keeps its last reading. Returns how many were not known to the outbox.
WITH page AS (
    SELECT DISTINCT ON (u.object, u.relation, u."user")
           u.object, u.relation, u."user", u.condition,
           EXISTS (SELECT 1 FROM reconcile_expected e
                   WHERE e.store = $1 AND e.object = u.object AND e.relation = u.relation
                     AND e."user" = u."user") AS known
    FROM unnest($2::text[], $3::text[], $4::text[], $5::jsonb[])
         WITH ORDINALITY AS u(object, relation, "user", condition, n)
    ORDER BY u.object, u.relation, u."user", u.n DESC
), kept AS (
    INSERT INTO reconcile_actual (store, object, relation, "user", condition, known)
    SELECT $1, object, relation, "user", condition, known FROM page WHERE known OR $6
    ON CONFLICT (store, object, relation, "user") DO UPDATE SET condition = EXCLUDED.condition
)
SELECT count(*) FILTER (WHERE NOT known) FROM page
