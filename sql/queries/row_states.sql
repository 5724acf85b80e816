-- What the rows $1 are, for `retry` to say why it left one as it is: delivered, dead (and the
-- store it names), or pending. Ids that are no row are not returned.
SELECT id, processed_at IS NOT NULL, failed_at IS NOT NULL, payload->>'store_id'
FROM fga_outbox
WHERE id = ANY($1)
