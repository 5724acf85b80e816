-- Ends a session the relay gave up on (its connection was lost, but on the server's side it may
-- still be open and hold the leadership lock). The start time guards against a reused pid; the
-- lock and our own pid against a backend a pooler handed on to another client since (a backend
-- that no longer holds the leadership lock does no harm, and this session must not end itself).
-- $1: its pid; $2: when it started; $3, $4: the leadership lock's keys.
SELECT pg_terminate_backend(a.pid) AS ended
FROM pg_stat_activity a
WHERE a.pid = $1 AND a.backend_start = $2 AND a.pid <> pg_backend_pid()
  AND EXISTS (
      SELECT FROM pg_locks l
      WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = $3::integer::oid AND l.objid = $4::integer::oid)
