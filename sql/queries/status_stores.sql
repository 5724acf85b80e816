-- Pending and dead rows per store, for `status`: the store each row names (NULL: none, so the
-- relay's configured store), the stores with the most pending rows first. Reads the rows not yet
-- delivered (the pending index), not the delivered ones.
SELECT payload->>'store_id' AS store,
       count(*) FILTER (WHERE failed_at IS NULL) AS pending,
       count(*) FILTER (WHERE failed_at IS NOT NULL) AS dead
FROM fga_outbox
WHERE processed_at IS NULL
GROUP BY 1
ORDER BY 2 DESC, 3 DESC, 1 NULLS FIRST
