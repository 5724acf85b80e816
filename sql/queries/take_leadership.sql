-- Records this relay, on the session that just took the leadership lock, as the one delivering,
-- with a fresh lease. Returns the previous holder and its term (when it took leadership: a
-- relay retaking leadership knows its own last term by that, not by its name, which a take of
-- its own whose answer was lost also recorded), this term, and how long to wait (seconds)
-- before the first Write: until the `not_before` the previous leaders left. A record written
-- before leases existed says only whether the previous leader let go cleanly: if not, wait one
-- fence.
-- $1: who we are; $2: the lease, $3: the fence (one Write's deadline and a margin), in seconds.
WITH previous AS (
    SELECT holder, acquired_at,
           coalesce(not_before,
                    CASE WHEN released_at IS NULL
                         THEN clock_timestamp() + $3::float8 * interval '1 second' END)
               AS not_before
    FROM fga_outbox_leader WHERE singleton FOR UPDATE
), upsert AS (
    INSERT INTO fga_outbox_leader
        (singleton, holder, acquired_at, released_at, backend_pid, backend_start, lease_until,
         not_before)
    VALUES (true, $1, clock_timestamp(), NULL, pg_backend_pid(),
            (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()),
            clock_timestamp() + $2::float8 * interval '1 second',
            greatest((SELECT not_before FROM previous),
                     clock_timestamp() + ($2::float8 + $3::float8) * interval '1 second'))
    ON CONFLICT (singleton) DO UPDATE
        SET holder = EXCLUDED.holder, acquired_at = EXCLUDED.acquired_at, released_at = NULL,
            backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
            lease_until = EXCLUDED.lease_until, not_before = EXCLUDED.not_before
    RETURNING acquired_at
)
SELECT (SELECT holder FROM previous) AS previous_holder,
       (SELECT acquired_at FROM previous) AS previous_term,
       (SELECT acquired_at FROM upsert) AS term, clock_timestamp() AS now,
       (SELECT not_before FROM previous) AS not_before,
       greatest(extract(epoch FROM (SELECT not_before FROM previous) - clock_timestamp()), 0)::float8
           AS wait_seconds
