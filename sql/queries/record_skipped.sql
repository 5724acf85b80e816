-- Records on a pending row which of its operations the relay skips (superseded by later rows),
-- without counting an attempt. $1: the id, $2: what was skipped. A row another session holds is
-- left alone (SKIP LOCKED), so that the stream does not wait for that session: such a row waits
-- in its place, and is looked at again (its note written then). Returns whether the row was held
-- here (its note written now or before), and whether it is still pending (neither delivered nor
-- dead-lettered, nor deleted): not held but pending, another session holds it.
WITH held AS (
    SELECT id, last_error FROM fga_outbox
    WHERE id = $1 AND processed_at IS NULL AND failed_at IS NULL
    FOR UPDATE SKIP LOCKED
), noted AS (
    UPDATE fga_outbox o
    SET last_error = $2
    FROM held h
    WHERE o.id = h.id AND h.last_error IS DISTINCT FROM $2
)
SELECT EXISTS (SELECT FROM held) AS held,
       EXISTS (SELECT FROM fga_outbox
               WHERE id = $1 AND processed_at IS NULL AND failed_at IS NULL) AS pending
