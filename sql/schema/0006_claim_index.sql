-- fga-relay schema, part 6: the index the claim walks.
--
-- Dead rows keep processed_at NULL, so they stay in fga_outbox_pending_idx; a pile of them (a
-- model change that rejected a day of rows) sat in front of every claim, which walked past all of
-- them on every pass. This index holds only the rows the relay may still deliver, so the claim,
-- the pending count and the oldest pending row cost the same however many rows are dead.
-- fga_outbox_pending_idx stays: applications and older relays may rely on it.

--
-- Made only where it is missing (see part 1): CREATE INDEX takes a lock writers conflict with
-- even when the index is there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class i JOIN pg_class r ON r.relnamespace = i.relnamespace
                    WHERE r.oid = 'fga_outbox'::regclass
                      AND i.relname = 'fga_outbox_claim_idx') THEN
        CREATE INDEX IF NOT EXISTS fga_outbox_claim_idx ON fga_outbox (id)
            WHERE processed_at IS NULL AND failed_at IS NULL;
    END IF;
END
$$;
