//! Errors as HTTP answers: every one an RFC 9457 problem+json body with a stable `code`, and
//! `Retry-After` on those a client may simply send again.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use checkout_shared::{PROBLEM_CONTENT_TYPE, Problem};

use crate::operations::error::OperationError;

impl IntoResponse for OperationError {
    fn into_response(self) -> Response {
        let mut response = problem_response(&self.problem());
        if let Some(seconds) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
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
