-- What became of the rows `drain` was to deliver: ids $1 to $2, pending at $3. Delivered since,
-- dead since, and pending still. Read by the primary key over that range only. A row another
-- relay marked in a transaction it began before $3 counts as neither delivered nor dead (a Write
-- that locks its rows by marking them marks them as it leaves: that Write's time earlier).
SELECT count(*) FILTER (WHERE processed_at >= $3) AS delivered,
       count(*) FILTER (WHERE processed_at IS NULL AND failed_at >= $3) AS dead,
       count(*) FILTER (WHERE processed_at IS NULL AND failed_at IS NULL) AS pending
FROM fga_outbox
WHERE id BETWEEN $1 AND $2
