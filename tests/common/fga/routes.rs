//! Routes as grpc-gateway maps them, and the answer every handler builds (`Reply`).

use super::*;
use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use axum::routing::{get, post};

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(healthz_route))
        .route("/stores", get(list_stores_route))
        .route("/stores/{store_id}", get(get_store_route))
        .route("/stores/{store_id}/write", post(write_route))
        .route("/stores/{store_id}/read", post(read_route))
        // grpc-gateway's routing errors: an unknown path is NotFound → 5000,
        // a known path with another method is 405 → Unimplemented → 5004; both are HTTP 404.
        .fallback(|| async { Reply::error(404, "undefined_endpoint", "Not Found").into_response() })
        .method_not_allowed_fallback(|| async {
            Reply::error(404, "unimplemented", "Method Not Allowed").into_response()
        })
        // The gateway has no body limit of its own; gRPC's message limit is applied below.
        .layer(DefaultBodyLimit::disable())
        .with_state(shared)
}

/// A response, before it becomes an HTTP one.
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) content_type: Cow<'static, str>,
    pub(super) body: Bytes,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
}

impl Reply {
    pub(super) fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            content_type: Cow::Borrowed("application/json"),
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// OpenFGA's error envelope: Go `json.Encoder` with `SetEscapeHTML(false)`, hence the
    /// trailing newline.
    pub(super) fn error(status: u16, code: &str, message: &str) -> Reply {
        let mut body = String::with_capacity(code.len() + message.len() + 32);
        body.push_str("{\"code\":");
        write_go_json_str(code, &mut body);
        body.push_str(",\"message\":");
        write_go_json_str(message, &mut body);
        body.push_str("}\n");
        Reply::json(status, body)
    }

    /// An OpenFGA error code (its numeric range sets the status) with its message run through
    /// `sanitizedMessage`.
    pub(super) fn encoded(status: u16, code: &str, message: &str) -> Reply {
        Reply::error(status, code, &sanitized_message(message))
    }

    /// A gRPC `InvalidArgument` (gateway decoding, PGV): the code is derived from the message
    /// as `ConvertToEncodedErrorCode` does.
    pub(super) fn invalid_argument(message: &str) -> Reply {
        let sanitized = sanitized_message(message);
        let code = invalid_argument_code(&sanitized);
        Reply::error(400, code, &sanitized)
    }

    pub(super) fn header(mut self, name: &'static str, value: &str) -> Reply {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((HeaderName::from_static(name), v));
        }
        self
    }

    pub(super) fn into_response(self) -> Response<Body> {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        if let Ok(ct) = HeaderValue::from_str(&self.content_type) {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

/// A random v4 UUID for `X-Request-Id`.
pub(super) fn request_id() -> String {
    let r = fastrand::u128(..);
    let r = (r & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{r:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub(super) async fn healthz_route(RawQuery(query): RawQuery) -> Response<Body> {
    // grpc-gateway's healthz endpoint calls the gRPC health service, which bypasses authn
    //; the `service` query parameter names the service to check.
    let service = query
        .as_deref()
        .and_then(|q| {
            parse_query(q)
                .ok()?
                .into_iter()
                .rev()
                .find(|(k, _)| k == "service")
        })
        .map(|(_, v)| v)
        .unwrap_or_default();
    if service.is_empty() || service == HEALTH_SERVICE {
        Reply::json(200, r#"{"status":"SERVING"}"#).into_response()
    } else {
        Reply::encoded(
            404,
            "undefined_endpoint",
            &format!("service '{service}' is not registered with the Health server"),
        )
        .into_response()
    }
}

pub(super) async fn get_store_route(
    State(fga): State<Arc<Shared>>,
    Path(store_id): Path<String>,
    headers: HeaderMap,
) -> Response<Body> {
    fga.get_store(&store_id, &headers).into_response()
}

pub(super) async fn list_stores_route(
    State(fga): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response<Body> {
    fga.list_stores(query.as_deref().unwrap_or(""), &headers)
        .into_response()
}

pub(super) async fn read_route(
    State(fga): State<Arc<Shared>>,
    Path(store_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    fga.read(&store_id, &headers, &body).into_response()
}

pub(super) async fn write_route(
    State(fga): State<Arc<Shared>>,
    Path(store_id): Path<String>,
    Extension(conn): Extension<ConnCtl>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let record = fga.record_write(body.clone(), authorization);
    let reply = fga.write(&store_id, &headers, &body, &conn, record).await;
    fga.finish_write(record, reply.status);
    reply.into_response()
}
