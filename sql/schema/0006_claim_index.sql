-- fga-relay schema, part 6: the index the claim walks.
--
-- Dead rows keep processed_at NULL, so they stay in fga_outbox_pending_idx; a pile of them (a
-- model change that rejected a day of rows) sat in front of every claim, which walked past all of
-- them on every pass. This index holds only the rows the relay may still deliver, so the claim,
-- the pending count and the oldest pending row cost the same however many rows are dead.
-- fga_outbox_pending_idx stays: applications and older relays may rely on it.

CREATE INDEX IF NOT EXISTS fga_outbox_claim_idx ON fga_outbox (id)
    WHERE processed_at IS NULL AND failed_at IS NULL;
