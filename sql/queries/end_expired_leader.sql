-- Run by a relay that could not take the leadership lock: ends the session holding it when that
-- session has not renewed its lease in time (its relay is stopped, or cut off while the server's
-- side of the socket looks healthy). A holder that is not the recorded one (it took the lock but
-- has not recorded itself yet) gets a whole lease more to do so. Returns the pid ended, if any.
-- $1, $2: the leadership lock's keys; $3: the lease, in seconds.
SELECT l.pid, pg_terminate_backend(l.pid) AS ended
FROM pg_locks l, fga_outbox_leader r
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = $1::integer::oid AND l.objid = $2::integer::oid
  AND r.singleton
  AND r.lease_until < clock_timestamp()
      - CASE WHEN l.pid = r.backend_pid THEN interval '0' ELSE $3::float8 * interval '1 second' END
