-- Records that this relay let go with its own Writes finished: the next leader need wait only
-- for what this one inherited ($2, when its predecessors' Writes may still land), not for this
-- one's lease. $1: who we are.
UPDATE fga_outbox_leader
SET released_at = clock_timestamp(), lease_until = clock_timestamp(),
    not_before = greatest($2::timestamptz, clock_timestamp())
WHERE holder = $1 AND backend_pid = pg_backend_pid()
