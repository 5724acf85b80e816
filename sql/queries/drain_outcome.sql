-- What became of the rows `drain` was to deliver: ids $1 to $2, pending at $3, of which those
-- in $4 were dead already. Delivered since, dead since, and pending still. Read by the primary
-- key over that range only. Dead is told by the ids, not by `failed_at`: a row dead-lettered by
-- a transaction that began before $3 (an operator's UPDATE left open a while) was pending at the
-- start and is dead. A row another relay marked delivered in a transaction it began before $3
-- counts as neither delivered nor dead (a Write that locks its rows by marking them marks them
-- as it leaves: that Write's time earlier).
SELECT count(*) FILTER (WHERE o.processed_at >= $3) AS delivered,
       count(*) FILTER (WHERE o.processed_at IS NULL AND o.failed_at IS NOT NULL
                          AND before.id IS NULL) AS dead,
       count(*) FILTER (WHERE o.processed_at IS NULL AND o.failed_at IS NULL) AS pending
FROM fga_outbox o
LEFT JOIN unnest($4::bigint[]) AS before(id) ON before.id = o.id
WHERE o.id BETWEEN $1 AND $2
