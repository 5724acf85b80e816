-- `fga-relay reconcile`: the session's working tables, temporary (this session's only, dropped
-- when it ends), so that PostgreSQL, not the relay's memory, holds and sorts what is compared.
-- Needs the TEMPORARY privilege on the database (PUBLIC has it by default).

-- Every tuple operation of every row, as the relay reads a payload: writes and deletes, with the
-- row's state and store. Elements that are not tuple keys (a malformed, hence dead, row) are
-- skipped. A write's condition is normalised to {"name", "context"}, an absent context reading
-- as {}, as OpenFGA returns it. The store is the one the row names, '' for the configured store
-- (rows naming none, and rows naming it: the setting fga_relay.configured_store, which the
-- check sets for its session).
CREATE TEMPORARY VIEW reconcile_ops AS
SELECT r.id,
       CASE WHEN r.processed_at IS NOT NULL THEN 'delivered'
            WHEN r.failed_at IS NOT NULL THEN 'dead'
            ELSE 'pending' END AS state,
       coalesce(nullif(r.payload->>'store_id',
                       current_setting('fga_relay.configured_store', true)), '') AS store,
       op.value->>'object' AS object,
       op.value->>'relation' AS relation,
       op.value->>'user' AS "user",
       op.present,
       CASE WHEN op.present AND jsonb_typeof(op.value->'condition') = 'object' THEN
           jsonb_build_object(
               'name', op.value->'condition'->'name',
               'context', coalesce(nullif(op.value->'condition'->'context', 'null'::jsonb),
                                   '{}'::jsonb))
       END AS condition
FROM fga_outbox r
CROSS JOIN LATERAL (
    SELECT w.value, true AS present
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(r.payload->'writes') = 'array'
                                   THEN r.payload->'writes' ELSE '[]'::jsonb END) AS w
    UNION ALL
    SELECT d.value, false
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(r.payload->'deletes') = 'array'
                                   THEN r.payload->'deletes' ELSE '[]'::jsonb END) AS d
) AS op
WHERE jsonb_typeof(op.value->'object') = 'string'
  AND jsonb_typeof(op.value->'relation') = 'string'
  AND jsonb_typeof(op.value->'user') = 'string';

-- Per tuple of each store, its last operation in id order: what OpenFGA must hold.
CREATE TEMPORARY TABLE reconcile_expected (
    store     text    NOT NULL,
    object    text    NOT NULL,
    relation  text    NOT NULL,
    "user"    text    NOT NULL,
    present   boolean NOT NULL,
    condition jsonb,
    row_id    bigint  NOT NULL,
    state     text    NOT NULL
);

-- What OpenFGA holds, of the tuples above (and, for --all, of the others: known = false).
CREATE TEMPORARY TABLE reconcile_actual (
    store     text    NOT NULL,
    object    text    NOT NULL,
    relation  text    NOT NULL,
    "user"    text    NOT NULL,
    condition jsonb,
    known     boolean NOT NULL,
    PRIMARY KEY (store, object, relation, "user")
);

-- Tuples that rows newer than the check's start touch: their state moved on while checking.
CREATE TEMPORARY TABLE reconcile_moved (
    store    text NOT NULL,
    object   text NOT NULL,
    relation text NOT NULL,
    "user"   text NOT NULL,
    PRIMARY KEY (store, object, relation, "user")
);

-- The drift --repair corrects: kind missing, unexpected or condition; the condition to write.
CREATE TEMPORARY TABLE reconcile_drift (
    store     text NOT NULL,
    kind      text NOT NULL,
    object    text NOT NULL,
    relation  text NOT NULL,
    "user"    text NOT NULL,
    condition jsonb
);
