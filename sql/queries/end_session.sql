-- Ends a session the relay gave up on (its connection was lost, but on the server's side it may
-- still be open and hold the leadership lock). The start time guards against a reused pid.
-- $1: its pid; $2: when it started.
SELECT pg_terminate_backend(pid) AS ended
FROM pg_stat_activity
WHERE pid = $1 AND backend_start = $2
