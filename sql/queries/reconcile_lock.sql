-- For --repair, in its transaction: no writer may be halfway through an insert while the
-- corrections are checked and inserted. SHARE ROW EXCLUSIVE waits for writers in flight (and
-- for the relay's Writes in flight that locked their rows by marking them), holds new writers
-- back until commit (a few milliseconds), and lets the relay claim rows meanwhile; two repairs
-- take turns.
SET LOCAL lock_timeout = '5s';
LOCK TABLE fga_outbox IN SHARE ROW EXCLUSIVE MODE
