-- Dead rows by reason, for `status`: the error's words before its first colon, which say what
-- kind of failure it was ("malformed payload", "OpenFGA answered 400 validation_error"), how many
-- rows, and the newest id. The most rows first; at most $1 reasons.
SELECT coalesce(nullif(split_part(last_error, ':', 1), ''), '(no error recorded)') AS reason,
       count(*) AS rows, max(id) AS newest_id
FROM fga_outbox
WHERE failed_at IS NOT NULL AND processed_at IS NULL
GROUP BY 1
ORDER BY 2 DESC, 3 DESC
LIMIT $1
