//! The one error type of the API. Every error leaves as an RFC 9457 problem+json body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use checkout_idempotency::{Classify, Failure};
use checkout_shared::{ErrorCode, PROBLEM_CONTENT_TYPE, Problem};

use crate::store::StoreError;

/// How long a client is asked to wait before retrying a `409` in-use or a `503`.
pub const RETRY_AFTER_SECS: &str = "1";

/// Errors that are answered but never stored under an idempotency key: they moved no money,
/// so a retry with the same key runs afresh.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("a valid bearer token is required: send `Authorization: Bearer <token>`")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the request body is larger than 1 MiB")]
    PayloadTooLarge,
    /// The fields of the body that differ from the key's first request.
    #[error(
        "this Idempotency-Key was first used with a different request; make a new key for a new request"
    )]
    KeyReused(Vec<String>),
    #[error(
        "a request with this Idempotency-Key is still executing; retry it shortly with the same key"
    )]
    KeyInUse,
    /// Every attempt lost a race with concurrent requests (rare; a retry will see their result).
    #[error(
        "the request kept colliding with concurrent ones; nothing was charged, retry it with the same key"
    )]
    Contended,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether the protocol may run the transaction again (a lost race) or must stop.
impl Classify for ApiError {
    fn failure(&self) -> Failure {
        match self {
            ApiError::Store(error) => error.failure(),
            _ => Failure::Fatal,
        }
    }
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, ErrorCode) {
        match self {
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::PayloadTooLarge => {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge)
            }
            ApiError::KeyReused(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::IdempotencyKeyReused,
            ),
            ApiError::KeyInUse => (StatusCode::CONFLICT, ErrorCode::IdempotencyKeyInUse),
            ApiError::Contended => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ServiceUnavailable,
            ),
            ApiError::Store(StoreError::Other(_) | StoreError::LostClaim) => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError)
            }
            ApiError::Store(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ServiceUnavailable,
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let detail = match &self {
            // The database's words are for the log, not for the client.
            ApiError::Store(error) => {
                tracing::error!(%error, "store error");
                match error {
                    StoreError::Other(_) | StoreError::LostClaim => {
                        "internal error; nothing was charged, retry with the same key"
                    }
                    // The commit was sent; whether it took is not known here. The key knows:
                    // a retry with it answers what happened, and never charges twice.
                    StoreError::InDoubt(_) => {
                        "the database did not confirm the outcome; retry with the same key: the answer will say what happened, and nothing is charged twice"
                    }
                    _ => "the database is busy or unreachable; nothing was charged, retry with the same key",
                }
                .to_owned()
            }
            other => other.to_string(),
        };
        let mut problem = Problem::new(status.as_u16(), code, detail);
        if let ApiError::KeyReused(fields) = &self {
            problem.detail = match fields.as_slice() {
                [] => "this Idempotency-Key was first used on another route or method; make a new key for a new request".into(),
                fields => format!(
                    "this Idempotency-Key was first used with different values of: {}; make a new key for a new request",
                    fields.join(", ")
                ),
            };
            problem.fields = Some(fields.clone());
        }
        let mut response = problem_response(&problem);
        if status == StatusCode::CONFLICT || status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

/// A problem+json response with the problem's own status.
pub fn problem_response(problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_string(problem).expect("a problem always serializes");
    (status, [(header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE)], body).into_response()
}
