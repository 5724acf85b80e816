-- Takes back the mark of rows a Write's transaction marked before it left (lock_by_marking.sql)
-- when OpenFGA's answer finished only some of them (an older OpenFGA's "already exists" names
-- one operation): the rest stay pending, locked by the same transaction until it commits. $1:
-- the ids.
UPDATE fga_outbox
SET processed_at = NULL
WHERE id = ANY($1)
