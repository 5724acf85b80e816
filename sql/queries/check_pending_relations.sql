-- fga-relay check: the object types and relations the oldest pending rows name (the first 1000
-- rows, at most 200 pairs: a sample that costs little on any table), of the rows that go to the
-- configured store and model: rows naming another store or a model are checked against theirs
-- by OpenFGA when they are sent. Malformed payloads are passed over: the relay dead-letters them
-- with the reason.
SELECT DISTINCT split_part(t->>'object', ':', 1) AS object_type, t->>'relation' AS relation
FROM (
    SELECT payload FROM fga_outbox
    WHERE processed_at IS NULL AND failed_at IS NULL
      AND payload->>'store_id' IS NULL
      AND coalesce(payload->>'authorization_model_id', '') = ''
    ORDER BY id
    LIMIT 1000
) r,
LATERAL (
    SELECT jsonb_array_elements(CASE WHEN jsonb_typeof(r.payload->'writes') = 'array'
                                     THEN r.payload->'writes' ELSE '[]' END)
    UNION ALL
    SELECT jsonb_array_elements(CASE WHEN jsonb_typeof(r.payload->'deletes') = 'array'
                                     THEN r.payload->'deletes' ELSE '[]' END)
) AS x(t)
WHERE jsonb_typeof(t) = 'object'
  AND jsonb_typeof(t->'object') = 'string'
  AND jsonb_typeof(t->'relation') = 'string'
LIMIT 200
