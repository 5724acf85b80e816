-- Records on a pending row which of its operations the relay skips (superseded by later rows),
-- without counting an attempt. $1: the id, $2: what was skipped.
UPDATE fga_outbox
SET last_error = $2
WHERE id = $1 AND processed_at IS NULL AND last_error IS DISTINCT FROM $2
