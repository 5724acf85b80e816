//! The health and metrics endpoint (`--http-addr`): `GET /healthz` and `GET /metrics`.

use crate::metrics::Metrics;
use crate::store::Store;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// What the endpoint reports.
pub struct Endpoint {
    pub registry: Registry,
    pub metrics: Metrics,
    /// True while the relay runs and its LISTEN connection is up.
    pub healthy: AtomicBool,
    /// For the pending gauges, refreshed at each scrape (no query runs unless scraped).
    pub store: Store,
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

async fn handle(endpoint: &Endpoint, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => {
            if endpoint.healthy.load(Ordering::Relaxed) {
                text(StatusCode::OK, "text/plain", "ok\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "LISTEN connection down\n".into(),
                )
            }
        }
        "/metrics" => {
            match endpoint.store.status_pending().await {
                Ok(now) => {
                    let m = &endpoint.metrics;
                    m.pending_rows.set(now.pending);
                    m.dead_rows.set(now.dead);
                    m.oldest_pending_age_seconds
                        .set(now.oldest_pending_age_seconds.unwrap_or(0.0));
                }
                Err(e) => debug!(error = %e, "metrics: cannot count pending rows"),
            }
            text(
                StatusCode::OK,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                crate::metrics::render(&endpoint.registry),
            )
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
