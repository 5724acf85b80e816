-- fga-relay: least-privilege roles for the outbox.
--
-- Run once after `fga-relay migrate`, as the table's owner (or a superuser) with the right to
-- create roles, stopping at the first error (`psql -v ON_ERROR_STOP=1`); running it again changes
-- nothing. Where the roles exist already (another database of the same cluster made them), the
-- table's owner runs it without the right to create roles: it then only grants. It creates two
-- group roles that cannot log in, and grants them what each side needs and nothing more. Grant
-- them to your login roles:
--
--     GRANT fga_outbox_writer TO app;         -- every application that writes to the outbox
--     GRANT fga_outbox_relay  TO fga_relay;   -- the login fga-relay's DATABASE_URL names
--
-- Everything else stays with the table's owner: `fga-relay migrate` (DDL) and `fga-relay prune`
-- (the only DELETE), which an operator runs as the owner.
--
-- `fga_outbox` stands for the configured table name, and the role names follow it
-- (`fga-relay sql --roles --table NAME` prints this file with the name substituted).

-- A role is commented only as it is created: commenting on an existing role needs the right to
-- create roles, which the owner of a second database using them need not have.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fga_outbox_writer') THEN
        CREATE ROLE fga_outbox_writer NOLOGIN;
        COMMENT ON ROLE fga_outbox_writer IS 'fga-relay: may add rows to fga_outbox, nothing else';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fga_outbox_relay') THEN
        CREATE ROLE fga_outbox_relay NOLOGIN;
        COMMENT ON ROLE fga_outbox_relay IS 'fga-relay: what the relay needs to deliver fga_outbox';
    END IF;
END
$$;

-- Both need to reach the table in its schema (USAGE only: neither may create anything there).
-- The writer's `id` comes from the table's sequence (bigserial), and nextval() needs USAGE on
-- it. The sequence is looked up: a table your application created may name it otherwise.
DO $$
DECLARE
    seq text := pg_get_serial_sequence('fga_outbox', 'id');
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO fga_outbox_writer, fga_outbox_relay',
                   (SELECT relnamespace::regnamespace::text FROM pg_class
                     WHERE oid = 'fga_outbox'::regclass));
    IF seq IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO fga_outbox_writer', seq);
    END IF;
END
$$;

-- The writer: INSERT of the payload column only. `id`, `created_at` and the delivery columns
-- take their defaults, so a writer cannot forge a row already delivered, dead or back-dated.
-- No SELECT, UPDATE or DELETE: a writer cannot read other rows, nor change or remove any.
-- The wake-up trigger runs as the writer and needs no grant (pg_notify and advisory locks are
-- open to every role).
--
-- `INSERT ... RETURNING id` needs SELECT on `id` too, and that lets a writer read every row's id
-- (not its payload). It is not granted: an outbox row's id is of no use to the application. If
-- yours wants it anyway, add:
--     GRANT SELECT (id) ON fga_outbox TO fga_outbox_writer;
GRANT INSERT (payload) ON fga_outbox TO fga_outbox_writer;

-- Read your own writes: fga_outbox_wait(ids, timeout) runs as the table's owner (SECURITY
-- DEFINER) and reports only on the rows it is given, so EXECUTE is all a writer needs; without
-- SELECT (id), a writer learns its row's id with `SELECT lastval()` after a one-row INSERT.
GRANT EXECUTE ON FUNCTION fga_outbox_wait(bigint[], interval) TO fga_outbox_writer;

-- The relay (`run`, `drain`, `status`, `retry`): it reads rows (claims lock them FOR UPDATE,
-- which needs UPDATE on some column) and updates only the delivery columns; it cannot change a
-- row's payload, delete a row (no DELETE, no TRUNCATE) or alter the table (it is not the owner).
-- LISTEN, NOTIFY and advisory locks need no grant.
GRANT SELECT ON fga_outbox TO fga_outbox_relay;
GRANT UPDATE (processed_at, failed_at, attempts, last_error) ON fga_outbox TO fga_outbox_relay;

-- The one-row record of which relay delivers: read and locked (FOR UPDATE), inserted the first
-- time, updated at each change of leader.
GRANT SELECT, INSERT, UPDATE ON fga_outbox_leader TO fga_outbox_relay;

-- The schema's version, which `fga-relay check` reads (functions are open to PUBLIC unless the
-- owner's default privileges say otherwise).
GRANT EXECUTE ON FUNCTION fga_outbox_schema_version() TO fga_outbox_relay;

-- Leadership is a lease: a relay that finds the leadership lock held by a session whose lease
-- ran out (its relay stopped, or cut off while the server's side of the socket stays open) ends
-- that session with pg_terminate_backend(), and a relay ends its own earlier session after a
-- reconnect. Sessions of the same role may end each other without a grant. If your relays log in
-- as different roles, they also need pg_signal_backend, which lets them end any session that is
-- not a superuser's; a relay that lacks it logs an error and waits until PostgreSQL ends the
-- stale session itself (TCP keepalives, about 20 s, if the network path is really gone):
--     GRANT pg_signal_backend TO fga_outbox_relay;
