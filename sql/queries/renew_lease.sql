-- The leader's heartbeat, on the session holding the leadership lock: the lease runs $2 seconds
-- from now, and no later leader may Write before the lease's end plus the fence ($3 seconds).
-- Updates no row when another relay took over: this one must stop at once. $1: who we are.
UPDATE fga_outbox_leader
SET lease_until = clock_timestamp() + $2::float8 * interval '1 second',
    not_before = greatest(not_before,
                          clock_timestamp() + ($2::float8 + $3::float8) * interval '1 second')
WHERE holder = $1 AND backend_pid = pg_backend_pid() AND released_at IS NULL
