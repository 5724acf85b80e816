-- fga-relay schema, part 3: the record of which relay delivers.
--
-- One relay at a time delivers (the one holding a session advisory lock); the others wait as
-- hot standbys. This one-row table says whether the previous holder let go cleanly. When it did
-- not (killed, or its connection lost while a Write may still be in flight), the next holder waits
-- one request timeout before its first Write, so that a Write still travelling from the old holder
-- can never land after a newer operation on the same tuple.

CREATE TABLE IF NOT EXISTS fga_outbox_leader (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    holder      text        NOT NULL,
    acquired_at timestamptz NOT NULL,
    released_at timestamptz
);

COMMENT ON TABLE fga_outbox_leader IS
    'fga-relay: the relay delivering this outbox, and whether the last one let go cleanly';
