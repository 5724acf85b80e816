-- For --repair: inserts the corrective rows of one kind, $1 'deletes' (tuples that must be
-- absent, and those whose condition differs) or 'writes' (tuples that must be present, with
-- their condition, and those whose condition differs), at most $2 tuples a row and one store a
-- row (named by `store_id`, but for the configured store), so that each row travels in one
-- Write. Run for deletes, then for writes: each tuple appears once per run, and a tuple whose
-- condition differs is deleted by an earlier row than the one writing it again. Returns how
-- many rows and tuples, and the first and last id.
WITH picked AS (
    SELECT store, object, relation, "user", condition,
           row_number() OVER (PARTITION BY store ORDER BY object, relation, "user") - 1 AS n
    FROM reconcile_drift
    WHERE kind = 'condition'
       OR kind = CASE WHEN $1 = 'deletes' THEN 'unexpected' ELSE 'missing' END
), inserted AS (
    INSERT INTO fga_outbox (payload)
    SELECT jsonb_build_object(
               $1::text,
               jsonb_agg(
                   CASE WHEN $1 = 'writes' AND condition IS NOT NULL
                        THEN jsonb_build_object('user', "user", 'relation', relation,
                                                'object', object, 'condition', condition)
                        ELSE jsonb_build_object('user', "user", 'relation', relation,
                                                'object', object)
                   END ORDER BY n),
               'source', 'fga-relay reconcile')
           || CASE WHEN store = '' THEN '{}'::jsonb
                   ELSE jsonb_build_object('store_id', store) END
    FROM picked
    GROUP BY store, n / $2
    ORDER BY store, n / $2
    RETURNING id
)
SELECT count(*)::bigint AS rows,
       (SELECT count(*) FROM picked)::bigint AS tuples,
       min(id) AS first_id,
       max(id) AS last_id
FROM inserted
