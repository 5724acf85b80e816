-- fga-relay schema, part 1: the outbox table.
--
-- Applications may already have created this table themselves, with rows in it; every statement
-- here adopts it as it is and keeps every row. The relay runs all parts in one transaction, after
-- taking an advisory lock, so two `fga-relay migrate` at once do no harm. To run these files with
-- your own migration tool, run them in order; each is idempotent.
--
-- `fga_outbox` stands for the configured table name (`fga-relay sql --table NAME` prints the files
-- with it substituted).

CREATE TABLE IF NOT EXISTS fga_outbox (
    id           bigserial   PRIMARY KEY,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text
);

-- The contract's columns, for a table created by an older version of the contract, and its
-- indexes. Each is made only where it is missing: ALTER TABLE takes the table's strongest lock
-- and CREATE INDEX a lock writers conflict with, even when there is nothing to do, and the lock
-- waits for the relay's Write in flight (up to its request timeout) with every writer's INSERT
-- queued behind it. A schema already up to date is left without taking either.
DO $$
DECLARE
    t regclass := 'fga_outbox'::regclass;
    has_index text := 'SELECT EXISTS (SELECT FROM pg_class i JOIN pg_class r
                          ON r.relnamespace = i.relnamespace WHERE r.oid = $1 AND i.relname = $2)';
    found boolean;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = t AND attname = 'attempts'
                    AND NOT attisdropped) THEN
        ALTER TABLE fga_outbox ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = t AND attname = 'last_error'
                    AND NOT attisdropped) THEN
        ALTER TABLE fga_outbox ADD COLUMN IF NOT EXISTS last_error text;
    END IF;
    -- Set when the relay gives up on a row (dead-lettered); processed_at stays NULL for it.
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = t AND attname = 'failed_at'
                    AND NOT attisdropped) THEN
        ALTER TABLE fga_outbox ADD COLUMN IF NOT EXISTS failed_at timestamptz;
    END IF;
    -- Finding pending rows costs the same whatever the number of delivered rows kept as
    -- evidence.
    EXECUTE has_index INTO found USING t, 'fga_outbox_pending_idx';
    IF NOT found THEN
        CREATE INDEX IF NOT EXISTS fga_outbox_pending_idx ON fga_outbox (id)
            WHERE processed_at IS NULL;
    END IF;
    -- Dead rows, for `status` and `retry --dead`, without scanning the delivered ones.
    EXECUTE has_index INTO found USING t, 'fga_outbox_dead_idx';
    IF NOT found THEN
        CREATE INDEX IF NOT EXISTS fga_outbox_dead_idx ON fga_outbox (id)
            WHERE failed_at IS NOT NULL;
    END IF;
END
$$;

COMMENT ON COLUMN fga_outbox.payload IS
    'OpenFGA tuple operations: {"writes": [TupleKey...], "deletes": [TupleKey...]}';
COMMENT ON COLUMN fga_outbox.processed_at IS
    'When OpenFGA accepted every tuple of the row; NULL while pending or dead';
COMMENT ON COLUMN fga_outbox.attempts IS 'Failed delivery attempts';
COMMENT ON COLUMN fga_outbox.last_error IS 'Why the last attempt failed, or why the row is dead';
COMMENT ON COLUMN fga_outbox.failed_at IS
    'When fga-relay gave up on the row (dead-lettered); fga-relay retry sends it back';
