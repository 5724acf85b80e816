-- Dead and delivered counts, for `status` (pending.sql gives the rest). Dead rows use their
-- partial index; delivered rows are counted in full, which takes a moment on a large table.
SELECT
    (SELECT count(*) FROM fga_outbox WHERE failed_at IS NOT NULL) AS dead,
    (SELECT count(*) FROM fga_outbox WHERE processed_at IS NOT NULL) AS delivered
