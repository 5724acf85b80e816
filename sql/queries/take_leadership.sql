-- Records that this relay now delivers, and returns whether the previous one let go cleanly
-- (true when there was none). Runs right after the leadership lock was taken. $1: who we are.
WITH previous AS (
    SELECT holder, released_at FROM fga_outbox_leader WHERE singleton FOR UPDATE
), upsert AS (
    INSERT INTO fga_outbox_leader (singleton, holder, acquired_at, released_at)
    VALUES (true, $1, clock_timestamp(), NULL)
    ON CONFLICT (singleton) DO UPDATE
        SET holder = EXCLUDED.holder, acquired_at = EXCLUDED.acquired_at, released_at = NULL
)
SELECT coalesce((SELECT released_at IS NOT NULL FROM previous), true) AS clean,
       (SELECT holder FROM previous) AS previous_holder
