-- fga-relay schema, part 2: the wake-up trigger.
--
-- NOTIFY takes a database-wide lock at commit that serialises every notifying transaction, which
-- costs writers half their throughput under concurrency. So writers notify only when a relay is
-- actually waiting: a waiting relay holds the session advisory lock (1718051121, <table oid>)
-- exclusively, which makes the shared try below fail. While the relay is busy draining, it does
-- not hold that lock, writers get it shared, and they skip NOTIFY; the relay sees their rows on
-- its next pass. No wake-up can be lost: PostgreSQL releases a transaction's locks only after its
-- commit is visible, so once the relay holds the lock, every writer that skipped NOTIFY has
-- committed and the relay's last look before sleeping sees its row; every later writer notifies.
--
-- The channel is the table's name, and the payload its oid: the relay of a table of the same
-- name in another schema (one relay per schema, chosen with search_path) hears the channel too,
-- and passes over what is not its own. The payload is constant, so PostgreSQL folds the
-- notifications of one transaction into one.

CREATE OR REPLACE FUNCTION fga_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1718051121, TG_RELID::integer) THEN
        PERFORM pg_notify('fga_outbox', TG_RELID::text);
    END IF;
    RETURN NULL;
END
$$;

-- Made again only when it is missing, disabled or not this one (tgtype 4: AFTER INSERT, FOR EACH
-- STATEMENT): DROP and CREATE TRIGGER take a lock writers conflict with, and `migrate` on a
-- live outbox must not queue them behind it (see part 1).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger
                    WHERE tgrelid = 'fga_outbox'::regclass AND tgname = 'fga_outbox_notify'
                      AND tgfoid = 'fga_outbox_notify()'::regprocedure AND tgtype = 4
                      AND tgenabled = 'O') THEN
        DROP TRIGGER IF EXISTS fga_outbox_notify ON fga_outbox;
        CREATE TRIGGER fga_outbox_notify
            AFTER INSERT ON fga_outbox
            FOR EACH STATEMENT
            EXECUTE FUNCTION fga_outbox_notify();
    END IF;
END
$$;
