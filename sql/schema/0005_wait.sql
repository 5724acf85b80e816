-- fga-relay schema, part 5: read your own writes.
--
--     SELECT fga_outbox_wait(ARRAY[42, 43], interval '5 seconds');
--
-- Called after COMMIT with the ids `INSERT ... RETURNING id` gave, it returns
--   'delivered'                 once OpenFGA has accepted every tuple of every listed row,
--   'dead: row 42: <last_error>' as soon as one of them is dead (the relay gave up on it),
--   'pending'                   when the timeout passes first: the rows are still pending and
--                               the relay will deliver them; nothing is lost.
-- It raises an error for an id with no row, and when called where it could never see the relay's
-- work: inside a REPEATABLE READ or SERIALIZABLE transaction (its snapshot is fixed), or inside a
-- transaction that has written (the rows it inserted cannot be delivered before it commits).
--
-- How it waits. Each look is one statement, so under READ COMMITTED it sees every commit made
-- before it. Between looks:
-- - While a listed row is locked by a running transaction (the relay locks rows for the time of
--   their Write, FOR UPDATE or by marking them, and marks them in the same transaction), it
--   queues, shared, for the advisory lock (1718051123, <that transaction's id>) which the
--   relay's Write transaction takes before it locks a row (sql/queries/lock.sql,
--   lock_by_marking.sql), so it wakes the moment the relay
--   commits, and looks again at once. If the rows are then held by other transactions (the
--   relay's next Write of them), it queues again; if by the same ones, they take no such lock
--   (not the relay's Writes): it naps as below. The lock it gets is dropped at once by rolling
--   back the block that took it: waiters never hold up the relay (its next Write has another
--   transaction id) nor one another (shared), and a wait never writes: no transaction id, no
--   WAL, no commit to flush.
-- - While no one holds them (not yet claimed, or the relay is down, behind or backing off), and
--   on a hot standby (which never sees the relay's locks), it sleeps 1 ms, doubling up to
--   256 ms: a relay that is up claims a new row within a millisecond or two, and a wait that
--   lasts costs about 4 looks a second (a look costs about 0.1 ms of CPU). In a backlog, it may
--   notice its rows up to 256 ms after the relay marked them.
-- Every look runs in a block of its own that is rolled back, which releases the table lock that
-- the look took, before it queues or sleeps: a wait holds no lock on the table, so DDL on it
-- (`fga-relay migrate`), and the writers queued behind the DDL, are not held up by waiters.
-- What no function can let go of is its calling statement's snapshot: until a wait returns, it
-- holds back the horizon below which VACUUM removes dead row versions. Hence timeouts in seconds.
--
-- SECURITY DEFINER: it runs as the table's owner, so that a writer needs only EXECUTE on it (and
-- the ids), not SELECT on the table nor the UPDATE privilege row locks ask for. What it tells a
-- caller is the state of the rows it names and the last error of a dead one. The search path is
-- fixed to the table's schema, with pg_temp last, so that a caller cannot substitute objects.

CREATE OR REPLACE FUNCTION fga_outbox_wait(ids bigint[], timeout interval DEFAULT interval '10 seconds')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
-- The lock_timeout set for each look stays inside the function.
SET lock_timeout = 0
-- Its statements take the array of ids as a parameter: the custom plans PostgreSQL would keep
-- choosing cost a replanning at every look (a third of a wait's CPU, measured); the generic plan
-- is the same primary-key lookup.
SET plan_cache_mode = force_generic_plan
-- A session plans each statement once, at its first wait, and keeps that plan. Planned while the
-- table held a page of rows, a look was a scan of the whole table, kept while the table grew to
-- millions of delivered rows (measured: one look read all 100,050 rows). Every statement here
-- finds its rows by primary key.
SET enable_seqscan = off
-- A plan with a sequential scan left in it would then cost over 10^10, far above jit_above_cost,
-- and be compiled to machine code at every call: the looks are short, JIT never pays for them.
SET jit = off
AS $$
DECLARE
    deadline   timestamptz := clock_timestamp() + greatest(timeout, interval '0');
    wanted     bigint[];
    -- The 64-bit form of a 32-bit transaction id (xmax) is found near this one.
    ref        bigint := pg_snapshot_xmax(pg_current_snapshot())::text::bigint;
    -- A hot standby never sees the relay's locks.
    lock_wait  boolean := NOT pg_is_in_recovery();
    first_nap  constant float8 := 0.001;
    max_nap    constant float8 := 0.256;
    nap        float8 := first_nap;
    first      boolean := true;
    looked     boolean;
    found_n    bigint;
    pending_n  bigint;
    -- The transactions (their 32-bit ids, as advisory lock keys) holding listed pending rows;
    -- a row's xmax can also be a multixact (several lockers, none of them the relay's Write):
    -- its number is then a key nobody or an unrelated Write holds, and lock_timeout bounds it.
    holders    integer[];
    -- Those the last queueing was for.
    queued_for integer[];
    dead       text;
BEGIN
    IF ids IS NULL OR timeout IS NULL OR array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'fga_outbox_wait: ids and timeout must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fga_outbox_wait cannot see the relay''s work inside a % transaction',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  DETAIL = 'Its snapshot is fixed at its first statement: the rows would look pending until the timeout.',
                  HINT = 'Call it after COMMIT, in autocommit or in a READ COMMITTED transaction.';
    END IF;
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'fga_outbox_wait must be called after COMMIT: this transaction has written'
            USING ERRCODE = 'active_sql_transaction',
                  DETAIL = 'Rows it inserted cannot be delivered before it commits, and waiting would hold its locks.',
                  HINT = 'COMMIT first, then call fga_outbox_wait with the ids INSERT ... RETURNING id gave.';
    END IF;
    wanted := ARRAY(SELECT DISTINCT unnest(ids));

    LOOP
        looked := false;
        BEGIN
            -- DDL holding the table makes the look wait: no longer than the timeout.
            PERFORM set_config('lock_timeout',
                greatest(1, ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000))::text
                    || 'ms', true);
            SELECT count(*),
                   count(*) FILTER (WHERE processed_at IS NULL AND failed_at IS NULL),
                   -- Transactions running when this look began that lock pending rows.
                   array_agg(DISTINCT (xmax::text::bigint - 2147483648)::integer) FILTER (
                       WHERE processed_at IS NULL AND failed_at IS NULL AND xmax <> '0'::xid
                         AND NOT pg_visible_in_snapshot(greatest(3, ref - 2147483648
                               + ((xmax::text::bigint - ref) % 4294967296 + 6442450944)
                                 % 4294967296)::text::xid8,
                             pg_current_snapshot())),
                   min(format('dead: row %s: %s', id, coalesce(last_error, 'no error recorded')))
                       FILTER (WHERE processed_at IS NULL AND failed_at IS NOT NULL)
              INTO found_n, pending_n, holders, dead
              FROM fga_outbox
             WHERE id = ANY (wanted);
            looked := true;
            RAISE SQLSTATE 'FW000';
        EXCEPTION
            WHEN SQLSTATE 'FW000' OR lock_not_available THEN
                NULL;
        END;

        IF looked THEN
            IF first AND found_n < cardinality(wanted) THEN
                RAISE EXCEPTION 'fga_outbox has no row with id %',
                    (SELECT min(w) FROM unnest(wanted) w
                      WHERE NOT EXISTS (SELECT FROM fga_outbox WHERE id = w))
                    USING ERRCODE = 'no_data_found',
                          HINT = 'Pass the ids INSERT ... RETURNING id gave, after their transaction committed.';
            END IF;
            first := false;
            IF dead IS NOT NULL THEN
                RETURN dead;
            END IF;
            IF pending_n = 0 THEN
                RETURN 'delivered';
            END IF;
        END IF;
        IF clock_timestamp() >= deadline THEN
            RETURN 'pending';
        END IF;
        IF looked AND holders IS NOT NULL AND lock_wait
           AND holders IS DISTINCT FROM queued_for THEN
            -- Queue behind the transactions that hold them: the relay's Writes. Then look again
            -- at once; a later nap starts short again.
            queued_for := holders;
            nap := first_nap;
            BEGIN
                PERFORM set_config('lock_timeout',
                    greatest(1, ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000))::text
                        || 'ms', true);
                PERFORM pg_advisory_xact_lock_shared(1718051123, h) FROM unnest(holders) h;
                RAISE SQLSTATE 'FW000';
            EXCEPTION
                WHEN SQLSTATE 'FW000' OR lock_not_available THEN
                    NULL;
            END;
        ELSE
            PERFORM pg_sleep(least(nap, extract(epoch FROM deadline - clock_timestamp())));
            nap := least(nap * 2, max_nap);
        END IF;
    END LOOP;
END
$$;

-- Run by writers as the table's owner: only those granted EXECUTE (sql/roles.sql grants it to
-- fga_outbox_writer), with the search path fixed to the table's schema and pg_temp last.
REVOKE EXECUTE ON FUNCTION fga_outbox_wait(bigint[], interval) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION fga_outbox_wait(bigint[], interval) SET search_path = %I, pg_temp',
                   (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = 'fga_outbox'::regclass));
END
$$;

COMMENT ON FUNCTION fga_outbox_wait(bigint[], interval) IS
    'fga-relay: waits until the listed outbox rows are delivered; returns delivered, dead: row N: <last_error>, or pending (timeout)';
