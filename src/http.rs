//! The health and metrics endpoint (`--http-addr`): `GET /livez` (the main loop makes progress),
//! `GET /readyz` (PostgreSQL and the LISTEN connection are up; says `leader` or `standby`),
//! `GET /healthz` (the LISTEN connection is up) and `GET /metrics`.

use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::openfga::FgaClient;
use crate::store::Store;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// What the endpoint reports. It serves from the start of `run`, before PostgreSQL is reached
/// (so that a relay waiting for its database is live, and not ready); the relay's metrics
/// follow once it is built.
pub struct Endpoint {
    /// The main loop's sign of life.
    pub liveness: Arc<Liveness>,
    /// The LISTEN session's `lost` token while the relay holds one: cancelled as soon as the
    /// connection ends or a heartbeat (a query PostgreSQL must answer within
    /// `--heartbeat-interval`) fails.
    listening: Mutex<Option<CancellationToken>>,
    relay: OnceLock<Served>,
}

/// The relay's part of the endpoint, once it is built.
pub struct Served {
    pub registry: Registry,
    pub metrics: Metrics,
    /// For the table's gauges, refreshed at each scrape (no query runs unless scraped).
    pub store: Store,
    /// For `fga_relay_store_info`: the store's id, once known.
    pub client: Arc<FgaClient>,
}

impl Endpoint {
    pub fn new(liveness: Arc<Liveness>) -> Endpoint {
        Endpoint {
            liveness,
            listening: Mutex::default(),
            relay: OnceLock::new(),
        }
    }

    /// The relay is built: its metrics are served from now on.
    pub fn serve_relay(&self, served: Served) {
        let _ = self.relay.set(served);
    }

    /// The relay's LISTEN session, or `None` once it is given up.
    pub fn set_listening(&self, session: Option<CancellationToken>) {
        *self.listening.lock().unwrap_or_else(|e| e.into_inner()) = session;
    }

    /// Whether the LISTEN connection is up, and PostgreSQL answered its last heartbeat.
    fn listen_up(&self) -> bool {
        self.listening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|lost| !lost.is_cancelled())
    }
}

/// Binds `addr` (so a bad address fails at start) and returns the bound address and a task
/// serving until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    endpoint: Arc<Endpoint>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => return,
            };
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let endpoint = endpoint.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(&endpoint, req).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(error = %e, "metrics endpoint connection");
                }
            });
        }
    });
    Ok((bound, task))
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a static response always builds")
}

/// Before the relay is built: waiting for PostgreSQL and the schema.
fn starting() -> Response<Full<Bytes>> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain",
        "starting: waiting for PostgreSQL\n".into(),
    )
}

fn down() -> Response<Full<Bytes>> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain",
        "LISTEN connection down\n".into(),
    )
}

async fn handle(endpoint: &Endpoint, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/livez" => match endpoint.liveness.stalled_for() {
            None => text(StatusCode::OK, "text/plain", "alive\n".into()),
            Some(since) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!(
                    "stuck: the main loop made no progress for {}s\n",
                    since.as_secs()
                ),
            ),
        },
        "/readyz" => match endpoint.relay.get() {
            Some(relay) if endpoint.listen_up() => {
                let role = if relay.metrics.leader.get() == 1 {
                    "leader\n"
                } else {
                    "standby\n"
                };
                text(StatusCode::OK, "text/plain", role.into())
            }
            Some(_) => down(),
            None => starting(),
        },
        "/healthz" => {
            if endpoint.listen_up() {
                text(StatusCode::OK, "text/plain", "ok\n".into())
            } else {
                down()
            }
        }
        "/metrics" => {
            let Some(relay) = endpoint.relay.get() else {
                return starting();
            };
            let m = &relay.metrics;
            match relay.store.status_pending().await {
                Ok(now) => {
                    m.pending_rows.set(now.pending);
                    m.dead_rows.set(now.dead);
                    m.oldest_pending_age_seconds
                        .set(now.oldest_pending_age_seconds.unwrap_or(0.0));
                    if m.table_count_ok.set(1) == 0 {
                        info!("metrics: the table can be counted again");
                    }
                }
                // The three gauges keep the last values counted; this one says they are stale.
                Err(e) => {
                    if m.table_count_ok.set(0) == 1 {
                        warn!(error = %e, "metrics: cannot count the table's rows; \
                            fga_relay_table_count_ok is 0 and the pending, oldest and dead gauges \
                            show the last values counted");
                    } else {
                        debug!(error = %e, "metrics: cannot count the table's rows");
                    }
                }
            }
            if let Some(id) = relay.client.configured_store_id() {
                m.store(id);
            }
            text(
                StatusCode::OK,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                crate::metrics::render(&relay.registry),
            )
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
