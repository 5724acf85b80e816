-- The newest row's id (0 when the table is empty): where `reconcile` draws its line.
SELECT coalesce(max(id), 0)::bigint FROM fga_outbox
