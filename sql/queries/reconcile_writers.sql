-- Transactions that may still insert rows into the outbox: other sessions holding ROW EXCLUSIVE
-- on it (INSERT, UPDATE and DELETE take it), except the relays delivering it (`run`, `drain`),
-- which never insert. Their virtual transaction ids and pids, for `reconcile` to wait until they
-- end.
SELECT l.virtualtransaction, l.pid
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation'
  AND l.relation = 'fga_outbox'::regclass
  AND l.mode = 'RowExclusiveLock'
  AND l.granted
  AND l.pid <> pg_backend_pid()
  AND coalesce(a.application_name, '') NOT LIKE 'fga-relay run%'
  AND coalesce(a.application_name, '') NOT LIKE 'fga-relay drain%'
