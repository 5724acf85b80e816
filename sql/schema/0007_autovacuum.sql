-- fga-relay schema, part 7: vacuum the outbox in step with its deliveries.
--
-- Marking a row delivered leaves its old version's entry in the claim index
-- (fga_outbox_claim_idx) until VACUUM removes it, and each pass of the relay starts its claim at
-- the lowest id, so it walks past every such entry. Claiming a page of 100 pending rows took
-- 0.2 ms on a freshly vacuumed table, 0.6 ms with 20,000 delivered rows not yet vacuumed, 1.9 ms
-- with 100,000 and 9 ms with 500,000 (PostgreSQL 15; BENCHMARKS.md, "...until VACUUM"). PostgreSQL's default vacuums a table once a
-- fifth of its rows have changed: on a table that keeps 10 million delivered rows as evidence,
-- that is every 2 million deliveries, with claims of tens of milliseconds before each vacuum.
-- Here the table is vacuumed once 1% of its rows plus 10,000 have changed; autovacuum still looks
-- at most once a naptime (a minute by default), and each vacuum reads the table's indexes whole,
-- which is why the threshold grows with the table.
--
-- Set only while the table has neither setting of its own: an operator's choice
-- (ALTER TABLE fga_outbox SET (autovacuum_vacuum_scale_factor = ...)) survives every later
-- migrate. To keep PostgreSQL's defaults, set them explicitly: after a RESET the next migrate
-- sets these again. A partitioned outbox takes no storage settings (its partitions do): it is
-- left alone. Setting them takes a SHARE UPDATE EXCLUSIVE lock, which neither writers nor the
-- relay conflict with.

DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'fga_outbox'::regclass) = 'r'
       AND NOT EXISTS (
           SELECT FROM pg_class c, unnest(c.reloptions) o
            WHERE c.oid = 'fga_outbox'::regclass
              AND split_part(o, '=', 1) IN ('autovacuum_vacuum_scale_factor',
                                            'autovacuum_vacuum_threshold'))
    THEN
        ALTER TABLE fga_outbox SET (autovacuum_vacuum_scale_factor = 0.01,
                                    autovacuum_vacuum_threshold = 10000);
    END IF;
END
$$;
