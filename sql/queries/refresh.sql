-- What has become of rows a Write could not lock, or rows that could not be decoded: $1, their
-- ids. Returns those still pending, as they are now (nothing locked), with the columns of a
-- read (claim.sql). A row missing was delivered or dead-lettered by another session; a row with
-- another payload was changed since it was read; a row as it was is held by another session (a
-- relay on its way out, a drain) and is tried again.
SELECT id, payload::text, coalesce(created_at, clock_timestamp()), coalesce(attempts, 0),
       retried_at
FROM fga_outbox
WHERE id = ANY($1) AND processed_at IS NULL AND failed_at IS NULL
