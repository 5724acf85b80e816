//! Writer side in Rust with tokio-postgres (its `with-serde_json-1` feature makes a
//! `serde_json::Value` a jsonb parameter): the business row and its outbox row in one transaction.
//! Run: cargo run --example writer -- POSTGRES_URL ARCHIVE_ID JOB_ID ORG_ID

use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, archive_id, job_id, org_id] = args.as_slice() else {
        return Err("usage: writer POSTGRES_URL ARCHIVE_ID JOB_ID ORG_ID".into());
    };
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);

    // --- shown in docs/writing.md ---
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO archives (id, name) VALUES ($1, $2)",
        &[archive_id, &"rust"],
    )
    .await?;
    let payload = json!({"writes": [
        {"user": format!("capture_job:{job_id}"), "relation": "parent", "object": format!("archive:{archive_id}")},
        {"user": format!("organization:{org_id}"), "relation": "parent", "object": format!("capture_job:{job_id}")},
    ]});
    let row = tx
        .query_one(
            "INSERT INTO fga_outbox (payload) VALUES ($1) RETURNING id",
            &[&payload],
        )
        .await?;
    tx.commit().await?;
    let outbox_id: i64 = row.try_get(0)?;
    // --- end ---
    println!("{outbox_id}");
    Ok(())
}
