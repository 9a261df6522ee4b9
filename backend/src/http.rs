//! The router and what surrounds every request: body limit, timeout, request id, tracing, and
//! problem+json for errors the framework produces itself.

use std::{path::Path, time::Duration};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router, middleware};
use checkout_shared::{ErrorCode, PROBLEM_CONTENT_TYPE, Problem};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::services::ServeDir;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::error::{ApiError, problem_response};
use crate::{AppState, accounts, payments, refunds};

pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;
/// Longer than any transaction should take; a request cut here rolls back, and its retry
/// either replays or runs afresh.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub fn router(app: AppState, static_dir: &Path) -> Router {
    let api = Router::new()
        .route("/api/payments", post(payments::create))
        .route("/api/payments/{payment_id}", get(payments::get))
        .route("/api/payments/{payment_id}/refunds", post(refunds::create))
        .route("/api/account", get(accounts::get))
        .route("/api/demo/session", post(accounts::create_demo_session))
        .route("/healthz", get(healthz));
    #[cfg(feature = "bench-routes")]
    let api = api.route(
        "/api/bench/unkeyed-payments",
        post(crate::bench::unkeyed_payment),
    );
    let api = api.with_state(app);
    let api = if static_dir.is_dir() {
        api.fallback_service(ServeDir::new(static_dir).append_index_html_on_directories(true))
    } else {
        api
    };
    // Innermost first: each `layer` wraps everything above it.
    api.layer(RequestBodyLimitLayer::new(BODY_LIMIT_BYTES))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .layer(middleware::map_response(problem_for_bare_errors))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    let request_id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!(
                        "request",
                        method = %request.method(),
                        uri = %request.uri(),
                        request_id,
                        idempotency = tracing::field::Empty,
                    )
                })
                // One line per request, with its status, latency and idempotency outcome.
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}

/// `GET /healthz`: `200` when the database answers.
async fn healthz(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    app.store.ping().await?;
    Ok(Json(serde_json::json!({ "status": "ok" })))
}

/// Errors made outside our handlers (unknown route `404`, `405`, the body limit's `413`, the
/// timeout's `408`) come without a problem body; give them one, so that every error a client
/// sees has the same shape and a `code`.
async fn problem_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_CONTENT_TYPE.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (code, detail) = match status {
        StatusCode::NOT_FOUND => (ErrorCode::NotFound, "no such resource"),
        StatusCode::METHOD_NOT_ALLOWED => (
            ErrorCode::MethodNotAllowed,
            "this method is not allowed here",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            ErrorCode::PayloadTooLarge,
            "the request body is larger than 1 MiB",
        ),
        StatusCode::REQUEST_TIMEOUT => (
            ErrorCode::RequestTimeout,
            "the request took too long; retry it with the same key",
        ),
        s if s.is_server_error() => (ErrorCode::InternalError, "internal error"),
        _ => (ErrorCode::InvalidRequest, "the request is invalid"),
    };
    let mut problem_answer = problem_response(&Problem::new(status.as_u16(), code, detail));
    // Keep the request id and any other header the layers set.
    for (name, value) in response.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem_answer
                .headers_mut()
                .insert(name.clone(), value.clone());
        }
    }
    problem_answer
}

/// A JSON request body: parsed strictly into `T` (unknown fields, wrong types, fractional or
/// string amounts are `400`), and kept as a JSON value for the request's fingerprint.
pub struct JsonBody<T> {
    pub value: T,
    pub canonical: Value,
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
        let is_json = content_type.as_deref().is_some_and(|t| {
            t == "application/json" || (t.starts_with("application/") && t.ends_with("+json"))
        });
        if !is_json {
            return Err(ApiError::InvalidRequest(
                "send the body as JSON with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge
                } else {
                    ApiError::InvalidRequest(rejection.body_text())
                }
            })?;
        let invalid = |error: serde_json::Error| {
            ApiError::InvalidRequest(format!("invalid JSON body: {error}"))
        };
        // Parsed twice on purpose: straight into `T` refuses duplicate fields, which a
        // `Value` would silently collapse; the `Value` is what the fingerprint canonicalises.
        let value = serde_json::from_slice(&bytes).map_err(invalid)?;
        let canonical = serde_json::from_slice(&bytes).map_err(invalid)?;
        Ok(JsonBody { value, canonical })
    }
}
