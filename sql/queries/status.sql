-- Delivered rows, for `status` (pending.sql gives the rest). They are counted in full, which
-- takes a moment on a large table.
SELECT count(*) AS delivered FROM fga_outbox WHERE processed_at IS NOT NULL
