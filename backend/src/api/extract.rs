//! What handlers take from a request, each refusing with a problem+json `OperationError`: the caller
//! (a bearer token), the `Idempotency-Key` header, a payment id in the path, a strict JSON body.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::{StatusCode, header, request::Parts};
use checkout_shared::{IDEMPOTENCY_KEY_HEADER, IdempotencyKey, KeyError};
use serde::de::DeserializeOwned;

use crate::api::AppState;
use crate::ids;
use crate::operations::authentication::{Principal, token_hash};
use crate::operations::error::OperationError;

impl FromRequestParts<AppState> for Principal {
    type Rejection = OperationError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, OperationError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|token| !token.is_empty())
            .ok_or(OperationError::Unauthorized)?;
        app.principals
            .authenticate(&app.store, &token_hash(token))
            .await
    }
}

/// The `Idempotency-Key` header, required on every POST that moves money.
pub struct IdempotencyKeyHeader(pub IdempotencyKey);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = OperationError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let mut values = parts.headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(OperationError::InvalidRequest(
                "send exactly one Idempotency-Key header: a key you made for this payment intent (a UUID v4 is ideal), the same on every retry".into(),
            ));
        };
        let text = value
            .to_str()
            .map_err(|_| OperationError::InvalidRequest(KeyError::InvalidCharacter.to_string()))?;
        IdempotencyKey::parse(text)
            .map(IdempotencyKeyHeader)
            .map_err(|error| OperationError::InvalidRequest(error.to_string()))
    }
}

/// `{payment_id}` in the path. Anything that is not a payment id is simply not found.
pub struct PaymentIdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PaymentIdPath {
    type Rejection = OperationError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, OperationError> {
        match id_in_path(parts, state, "pay_").await {
            Some(id) => Ok(PaymentIdPath(id)),
            None => Err(OperationError::NotFound(
                "there is no such payment on this account".into(),
            )),
        }
    }
}

/// The one path parameter, if it is an id of this kind (`prefix`).
async fn id_in_path<S: Send + Sync>(parts: &mut Parts, state: &S, prefix: &str) -> Option<String> {
    match Path::<String>::from_request_parts(parts, state).await {
        Ok(Path(id)) if ids::is_id(prefix, &id) => Some(id),
        _ => None,
    }
}

/// `{event_id}` in the path. Anything that is not an event's id is not found.
pub struct EventIdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for EventIdPath {
    type Rejection = OperationError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, OperationError> {
        id_in_path(parts, state, "evt_")
            .await
            .map(EventIdPath)
            .ok_or_else(|| OperationError::NotFound("there is no such event for this shop".into()))
    }
}

/// `{session_id}` in the path. Anything that is not a checkout session's id is not found.
pub struct SessionIdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for SessionIdPath {
    type Rejection = OperationError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, OperationError> {
        id_in_path(parts, state, "cs_")
            .await
            .map(SessionIdPath)
            .ok_or_else(not_a_session)
    }
}

pub fn not_a_session() -> OperationError {
    OperationError::NotFound("there is no such checkout session".into())
}

/// A JSON request body, parsed strictly into `T` (unknown or duplicate fields, wrong types,
/// fractional or string amounts are `400`). A keyed request's fingerprint is taken over the
/// typed request with its defaults applied (see each operation's `canonical`), never over these
/// bytes: what means the same is the same request.
pub struct JsonBody<T> {
    pub value: T,
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = OperationError;

    async fn from_request(request: Request, state: &S) -> Result<Self, OperationError> {
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
            return Err(OperationError::InvalidRequest(
                "send the body as JSON with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    OperationError::PayloadTooLarge
                } else {
                    OperationError::InvalidRequest(rejection.body_text())
                }
            })?;
        let invalid = |error: serde_json::Error| {
            OperationError::InvalidRequest(format!("invalid JSON body: {error}"))
        };
        let value = serde_json::from_slice(&bytes).map_err(invalid)?;
        Ok(JsonBody { value })
    }
}
