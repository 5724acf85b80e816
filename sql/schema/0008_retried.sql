-- fga-relay schema, part 8: when a dead row was brought back.
--
-- A dead row that returns to pending (`fga-relay retry`, or an UPDATE of failed_at by hand) comes
-- after rows that may have been delivered meanwhile: one of its operations may be older than a
-- later row's operation on the same tuple that OpenFGA already applied. The relay looks for such
-- operations in the rows marked here, and skips them (see sql/queries/superseded.sql). The
-- trigger sets the mark whatever brings the row back, so the rule holds on every path.
--
-- Made only where it is missing (see part 1): ALTER TABLE and CREATE TRIGGER take locks writers
-- conflict with even when there is nothing to do.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'fga_outbox'::regclass
                    AND attname = 'retried_at' AND NOT attisdropped) THEN
        ALTER TABLE fga_outbox ADD COLUMN IF NOT EXISTS retried_at timestamptz;
    END IF;
END
$$;

COMMENT ON COLUMN fga_outbox.retried_at IS
    'When the row last came back from dead to pending; the relay skips its superseded operations';

CREATE OR REPLACE FUNCTION fga_outbox_retried() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.retried_at := clock_timestamp();
    RETURN NEW;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger
                    WHERE tgrelid = 'fga_outbox'::regclass AND tgname = 'fga_outbox_retried'
                      AND tgfoid = 'fga_outbox_retried()'::regprocedure
                      AND tgenabled = 'O') THEN
        DROP TRIGGER IF EXISTS fga_outbox_retried ON fga_outbox;
        CREATE TRIGGER fga_outbox_retried
            BEFORE UPDATE OF failed_at ON fga_outbox
            FOR EACH ROW
            WHEN (OLD.failed_at IS NOT NULL AND NEW.failed_at IS NULL)
            EXECUTE FUNCTION fga_outbox_retried();
    END IF;
END
$$;
