-- Records that this relay let go cleanly: nothing of its is in flight. $1: who we are.
UPDATE fga_outbox_leader SET released_at = clock_timestamp() WHERE holder = $1
