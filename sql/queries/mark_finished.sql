-- Marks delivered the rows with nothing left to send (a retried row whose every operation later
-- delivered rows superseded), which no Write's transaction holds. $1: the ids, $2: their
-- payloads as the relay read them, in the same order. Returns the ids marked.
--
-- Only a row still pending, not dead-lettered meanwhile, and saying what the relay read is
-- marked: its superseded operations were looked for in what it said then. A row another session
-- holds (an operator correcting it by hand) is left alone (SKIP LOCKED), so that the stream
-- does not wait for that session, and every other row with it. The relay reads a row it did
-- not mark again by id, and looks at it as it is then.
UPDATE fga_outbox
SET processed_at = clock_timestamp()
WHERE id IN (SELECT o.id
             FROM fga_outbox o
             JOIN unnest($1::bigint[], $2::text[]) AS r(id, payload) ON o.id = r.id
             WHERE o.processed_at IS NULL AND o.failed_at IS NULL
               AND o.payload::text = r.payload
             FOR UPDATE OF o SKIP LOCKED)
RETURNING id
