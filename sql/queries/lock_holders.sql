-- The sessions holding a lock that a session of a command ($1: its application_name) waits for,
-- as PostgreSQL's own lock manager says (pg_blocking_pids). Only what tells an operator which
-- session it is and how long it has sat there: pid, application_name, state and since when (in
-- UTC). Never its query, user or client address. `state` is NULL for another role's session
-- unless this role may read all statistics (pg_read_all_stats).
SELECT DISTINCT h.pid,
       coalesce(h.application_name, '') AS application_name,
       h.state,
       to_char(h.state_change AT TIME ZONE 'UTC', 'HH24:MI:SS') AS since
  FROM pg_stat_activity w
 CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid)
  JOIN pg_stat_activity h ON h.pid = b.pid
 WHERE w.application_name = $1
   AND w.pid <> pg_backend_pid()
   AND w.wait_event_type = 'Lock'
 ORDER BY h.pid
