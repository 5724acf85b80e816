-- The operations of a row that came back from dead (retried_at set) that a later row's operation
-- on the same tuple supersedes: a later row already delivered touches that tuple. Replaying such
-- an operation would apply it over the later one, which OpenFGA already holds; the relay skips
-- it. $1: the row's id; $2, $3, $4: the objects, relations and users of its operations, in the
-- order the relay reads them; $5: the row's store ('' for the configured store), $6: the configured
-- store's id (NULL when not known: rows naming it are then taken as another store's). A tuple is
-- a tuple in a store: only later rows of the same store supersede. Returns, for each superseded
-- operation, its position (from 1) and the first later delivered row on its tuple.
--
-- A later row still pending needs no skip: it is delivered after this one, in id order. A later
-- row in flight is marked delivered only when its Write lands: the relay runs this once no Write
-- on the row's tuples is in flight. Rows delivered later than this row's id are read in id order
-- from it, and each search stops at the first row found: run once for each retry of a row.
SELECT k.n::integer, s.id
FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS k(object, relation, "user", n)
CROSS JOIN LATERAL (
    SELECT b.id FROM fga_outbox b
    WHERE b.id > $1 AND b.processed_at IS NOT NULL
      AND coalesce(nullif(b.payload->>'store_id', $6::text), '') = $5::text
      AND (b.payload->'writes' @> jsonb_build_array(jsonb_build_object(
               'object', k.object, 'relation', k.relation, 'user', k."user"))
        OR b.payload->'deletes' @> jsonb_build_array(jsonb_build_object(
               'object', k.object, 'relation', k.relation, 'user', k."user")))
    ORDER BY b.id
    LIMIT 1
) AS s
ORDER BY k.n
