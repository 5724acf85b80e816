-- Docker Compose demo: the writer side of the outbox, as an application runs it (README,
-- "Writing to the outbox"). The business row and the tuples it implies commit together, or
-- neither does; fga-relay, woken by the commit, delivers the tuples to OpenFGA. Watch it with
--   docker compose logs -f relay
-- and run this file again with
--   docker compose run --rm example

-- The demo application's own table (fga-relay never reads it).
CREATE TABLE IF NOT EXISTS archives (
    id          text        PRIMARY KEY,
    capture_job text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

BEGIN;
-- ON CONFLICT: a second `docker compose up` runs this file again; the tuples are then simply
-- delivered again, which OpenFGA ignores (redelivery is a no-op).
INSERT INTO archives (id, capture_job) VALUES ('3a4cb75c', '7f170ae4')
    ON CONFLICT (id) DO NOTHING;
INSERT INTO fga_outbox (payload) VALUES ('{"writes": [
  {"user": "capture_job:7f170ae4", "relation": "parent", "object": "archive:3a4cb75c"},
  {"user": "organization:acme",    "relation": "parent", "object": "capture_job:7f170ae4"}]}')
    RETURNING id AS outbox_id \gset
COMMIT;

-- What became of the row (the relay usually takes a few milliseconds).
SELECT pg_sleep(2) \g /dev/null
SELECT id,
       CASE WHEN processed_at IS NOT NULL THEN 'delivered'
            WHEN failed_at IS NOT NULL THEN 'dead: ' || last_error
            ELSE 'pending (see: docker compose logs relay)' END AS state,
       attempts,
       processed_at - created_at AS latency
  FROM fga_outbox
 WHERE id = :outbox_id;
