// Writer side in Node with node-postgres (`npm install pg`): the business row and its outbox row in
// one transaction. Run: node writer.mjs POSTGRES_URL ARCHIVE_ID JOB_ID ORG_ID
import pg from "pg";

const [url, archiveId, jobId, orgId] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: url });

// --- shown in docs/writing.md ---
const client = await pool.connect();
try {
  await client.query("BEGIN");
  await client.query("INSERT INTO archives (id, name) VALUES ($1, $2)", [archiveId, "node"]);
  const { rows } = await client.query("INSERT INTO fga_outbox (payload) VALUES ($1) RETURNING id", [{
    writes: [
      { user: `capture_job:${jobId}`, relation: "parent", object: `archive:${archiveId}` },
      { user: `organization:${orgId}`, relation: "parent", object: `capture_job:${jobId}` },
    ],
  }]);
  await client.query("COMMIT");
  console.log(rows[0].id);
} catch (e) {
  await client.query("ROLLBACK");
  throw e;
} finally {
  client.release();
}
// --- end ---

await pool.end();
