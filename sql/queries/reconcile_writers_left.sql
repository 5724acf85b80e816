-- How many of the given (virtual) transactions are still running. $1: their virtual ids.
SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY($1)
