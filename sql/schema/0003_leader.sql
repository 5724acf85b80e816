-- fga-relay schema, part 3: the record of which relay delivers.
--
-- One relay at a time delivers (the one holding a session advisory lock); the others wait as
-- hot standbys. This one-row table says who holds leadership and whether the previous holder let
-- go cleanly; part 4 (0004_lease.sql) adds the lease and when a new holder may send its first
-- Write, so that a Write still travelling from an old holder can never land after a newer
-- operation on the same tuple.

CREATE TABLE IF NOT EXISTS fga_outbox_leader (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    holder      text        NOT NULL,
    acquired_at timestamptz NOT NULL,
    released_at timestamptz
);

COMMENT ON TABLE fga_outbox_leader IS
    'fga-relay: the relay delivering this outbox, and whether the last one let go cleanly';
