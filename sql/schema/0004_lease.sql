-- fga-relay schema, part 4: leadership as a lease, and when Writes may start again.
--
-- The leader renews its lease at every heartbeat, on the session that holds the leadership lock.
-- A session that holds the lock but has not renewed for longer than the lease (its relay stopped,
-- or every byte between them is lost while the server's side of the socket looks healthy) is
-- ended by whichever relay finds it, so that one that works can lead.
--
-- `not_before` is when a new leader may send its first Write: no Write of any earlier leader can
-- land after it. Every renewal pushes it to the end of the lease plus one Write's deadline and a
-- margin (a leader stops sending when its lease runs out by its own clock, and a Write it started
-- before then is over within its deadline). A leader that lets go with its own Writes finished
-- brings it back to what it inherited; every new leader waits for it, whoever let go and how.

ALTER TABLE fga_outbox_leader
    ADD COLUMN IF NOT EXISTS backend_pid   integer,
    ADD COLUMN IF NOT EXISTS backend_start timestamptz,
    ADD COLUMN IF NOT EXISTS lease_until   timestamptz,
    ADD COLUMN IF NOT EXISTS not_before    timestamptz;

COMMENT ON COLUMN fga_outbox_leader.lease_until IS
    'fga-relay: the leader''s lease; past it, its session may be ended by another relay';
COMMENT ON COLUMN fga_outbox_leader.not_before IS
    'fga-relay: no Write by a new leader before this time';
