//! `fga-relay check`: a preflight that starts no daemon (as `nginx -t` or `promtool check`):
//! `run`'s own settings (the same flags, checked by the same code) parse; the endpoint's address
//! can be bound; PostgreSQL answers, not through a transaction pooler; the schema is
//! current; the role has what `run` needs; OpenFGA answers and accepts the credentials; the store
//! and the model exist. One line per check; exit 0 when all pass, 1 when one fails, 2 on bad
//! settings. It changes nothing (the model check's Write is one OpenFGA refuses).

use super::failure::Failure;
use super::lock_wait::{self, LockWatch};
use crate::config::ConfigError;
use crate::db::probe::{Probe, not_a_transaction_pooler, pending_relations, privileges};
use crate::openfga::FgaClient;
use crate::output;
use crate::schema::{self, SchemaProblem};
use crate::settings::{RunArgs, RunSettings};
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

/// How long connecting to PostgreSQL may take before the check says it does not answer.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct Check {
    #[command(flatten)]
    run: RunArgs,
}

/// The lines printed so far, and whether one failed.
#[derive(Default)]
struct Report {
    failed: bool,
}

impl Report {
    fn line(&mut self, name: &str, probe: Probe) {
        match probe {
            Ok(detail) => output::line(format_args!("ok    {name}: {detail}")),
            Err(problem) => {
                self.failed = true;
                output::line(format_args!("FAIL  {name}: {problem}"));
            }
        }
    }

    fn skip(&mut self, name: &str, why: &str) {
        output::line(format_args!("skip  {name}: {why}"));
    }
}

impl Check {
    pub async fn execute(self) -> Result<ExitCode, Failure> {
        let opened = self.run.settings().and_then(|settings| {
            let pg = crate::db::pg_config(&settings.db, "fga-relay check")?;
            let client = FgaClient::new(&settings.fga)?;
            Ok((settings, pg, client))
        });
        let (
            RunSettings {
                db, fga, http_addr, ..
            },
            pg,
            client,
        ) = match opened {
            Ok(o) => o,
            Err(ConfigError { setting, problem }) => {
                output::line(format_args!("FAIL  settings: {setting}: {problem}"));
                return Ok(ExitCode::from(2));
            }
        };
        let mut report = Report::default();
        report.line(
            "settings",
            Ok(format!(
                "database {}, table {}, OpenFGA {}, store {}",
                crate::db::target::summary(&db),
                db.table,
                crate::config::shown_url(&fga.api_url),
                fga.store
            )),
        );
        report.line("http", can_listen(http_addr));
        let pending = check_postgres(&mut report, &db.table, &pg).await;
        check_openfga(&mut report, &client, &pending).await;
        Ok(if report.failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// Whether `run` could serve its endpoint there: bound, and let go at once. An address a relay
/// already running holds fails, as it would fail a second `run` on this host.
fn can_listen(addr: Option<std::net::SocketAddr>) -> Probe {
    let Some(addr) = addr else {
        return Ok("off: no /livez, /readyz, /healthz or /metrics".to_owned());
    };
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(format!("{addr} can be listened on")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(format!(
            "cannot listen on {addr} (--http-addr, FGA_RELAY_HTTP_ADDR): it is in use, by a \
             relay already running here perhaps; a second `run` beside it needs another \
             address, or off"
        )),
        Err(e) => Err(format!(
            "cannot listen on {addr} (--http-addr, FGA_RELAY_HTTP_ADDR): {e}"
        )),
    }
}

/// Checks PostgreSQL; returns the (object type, relation) pairs of the oldest pending rows, for
/// the model check (none when they could not be read).
async fn check_postgres(
    report: &mut Report,
    table: &crate::config::TableName,
    pg: &crate::db::PgConnect,
) -> Vec<(String, String)> {
    let (client, conn) = match connect_within(pg).await {
        Ok(c) => c,
        Err(e) => {
            report.line("postgres", Err(e));
            for name in ["pooler", "schema", "privileges"] {
                report.skip(name, "PostgreSQL did not answer");
            }
            return Vec::new();
        }
    };
    let driver = tokio::spawn(conn);
    let watch = LockWatch::start(pg);
    // What a statement failed with; a lock waited for in vain, with who holds it.
    let said = |e: &tokio_postgres::Error| {
        if crate::db::is_lock_wait(e) {
            lock_wait::message(
                "check",
                table.as_str(),
                crate::db::COMMAND_LOCK_TIMEOUT,
                &watch.holders(),
            )
        } else {
            crate::db::describe(e)
        }
    };
    let version = async {
        crate::db::bound_lock_waits(&client).await?;
        client.query_one("SHOW server_version", &[]).await
    }
    .await
    .map(|r| r.get::<_, String>(0))
    .map_err(|e| crate::db::describe(&e));
    report.line(
        "postgres",
        version.map(|v| format!("answers: PostgreSQL {v}")),
    );
    report.line("pooler", not_a_transaction_pooler(pg, &client).await);
    let (schema, tables_exist) = schema_state(&client, table, &said).await;
    report.line("schema", schema);
    let mut pending = Vec::new();
    if tables_exist {
        report.line("privileges", privileges(&client, table).await);
        match pending_relations(&client, table).await {
            Ok(found) => pending = found,
            // Not a hang: a line of its own, which fails the check.
            Err(e) if crate::db::is_lock_wait(&e) => report.line("pending rows", Err(said(&e))),
            // As before: the model check goes without the pending rows' types.
            Err(_) => {}
        }
    } else {
        report.skip("privileges", "the tables are missing");
    }
    drop(client);
    let _ = driver.await;
    pending
}

/// A connection of its own to PostgreSQL, or why there is none, within [`CONNECT_LIMIT`].
async fn connect_within(
    pg: &crate::db::PgConnect,
) -> Result<
    (
        tokio_postgres::Client,
        tokio_postgres::Connection<tokio_postgres::Socket, crate::db::TlsStream>,
    ),
    String,
> {
    match tokio::time::timeout(CONNECT_LIMIT, crate::db::connect_dedicated(pg)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!(
            "cannot connect: {}",
            crate::db::hint::explain(&e, pg)
        )),
        Err(_) => Err(format!("no answer within {}s", CONNECT_LIMIT.as_secs())),
    }
}

/// The schema line (current, or what `migrate` would change), and whether the tables exist.
/// `said`: what a statement failed with.
async fn schema_state(
    client: &tokio_postgres::Client,
    table: &crate::config::TableName,
    said: &dyn Fn(&tokio_postgres::Error) -> String,
) -> (Result<String, String>, bool) {
    match schema::pending_changes(client, table).await {
        Ok(changes) if changes.is_empty() => {
            (Ok(format!("current (version {})", schema::VERSION)), true)
        }
        Ok(changes) => {
            let exist = !changes.iter().any(|c| c.contains("does not exist"));
            (
                Err(format!(
                    "`fga-relay migrate` (as the table's owner) would {}",
                    changes.join("; ")
                )),
                exist,
            )
        }
        Err(SchemaProblem::Db(e)) => (Err(said(&e)), false),
        Err(other) => (Err(other.to_string()), true),
    }
}

async fn check_openfga(report: &mut Report, client: &FgaClient, pending: &[(String, String)]) {
    let found = client.probe_store().await;
    report.line("openfga", found.openfga);
    match found.store {
        Some(Ok(store)) => {
            report.line("store", Ok(store));
            let model = match client.probe_model().await {
                Ok(found) => knows_pending(client, found, pending).await,
                Err(e) => Err(e),
            };
            report.line("model", model);
        }
        Some(Err(e)) => {
            report.line("store", Err(e));
            report.skip("model", "no store");
        }
        None => {
            report.skip("store", "OpenFGA did not answer");
            report.skip("model", "OpenFGA did not answer");
        }
    }
}

/// Whether the model knows the object types and relations the pending rows name (where it can
/// be read: a credential may Write without reading models).
async fn knows_pending(client: &FgaClient, found: String, pending: &[(String, String)]) -> Probe {
    if pending.is_empty() {
        return Ok(found);
    }
    match client.model_relations().await {
        Ok(model) => {
            let unknown = model.unknown(pending);
            if unknown.is_empty() {
                Ok(format!(
                    "{found} ({}); it knows the {} type and relation pairs of the pending rows",
                    model.id,
                    pending.len()
                ))
            } else {
                Err(format!(
                    "model {} has no {}: pending rows naming them will be dead-lettered",
                    model.id,
                    unknown.join(", ")
                ))
            }
        }
        Err(e) => Ok(format!(
            "{found}; the pending rows' types were not checked: {e}"
        )),
    }
}
