"""Writer side in Python with psycopg 3 (`pip install "psycopg[binary]"`): the business row and its
outbox row in one transaction. Run: python3 writer.py POSTGRES_URL ARCHIVE_ID JOB_ID ORG_ID"""
import sys

import psycopg
from psycopg.types.json import Jsonb

dsn, archive_id, job_id, org_id = sys.argv[1:5]

# --- shown in docs/writing.md ---
with psycopg.connect(dsn) as conn:
    conn.execute("INSERT INTO archives (id, name) VALUES (%s, %s)", (archive_id, "python"))
    (outbox_id,) = conn.execute(
        "INSERT INTO fga_outbox (payload) VALUES (%s) RETURNING id",
        (Jsonb({"writes": [
            {"user": f"capture_job:{job_id}", "relation": "parent", "object": f"archive:{archive_id}"},
            {"user": f"organization:{org_id}", "relation": "parent", "object": f"capture_job:{job_id}"},
        ]}),),
    ).fetchone()
print(outbox_id)
# --- end ---
