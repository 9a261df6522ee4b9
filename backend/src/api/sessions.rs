//! `POST /api/checkout-sessions` (a shop, keyed) and `GET /api/checkout-sessions/{session_id}`
//! (anyone holding the id).

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use checkout_shared::{CheckoutSession, CreateCheckoutSession};

use crate::api::AppState;
use crate::api::extract::{IdempotencyKeyHeader, JsonBody, SessionIdPath, not_a_session};
use crate::api::keyed_requests::{self, Asked, IdempotencyKeyParam, KeyedProblems};
use crate::clock;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::sessions::{NewCheckoutSession, public_view};

/// The route a session is made on: part of its key's fingerprint.
pub const ROUTE: &str = "/api/checkout-sessions";

/// `POST /api/checkout-sessions`
#[utoipa::path(
    post, path = "/api/checkout-sessions", operation_id = "create_checkout_session", tag = "checkout sessions",
    summary = "Create a checkout session (a shop, with its secret key)",
    description = "What the shop asks to be paid: an order id (one session per order), the amount in kopecks and its items. Keyed: a retry with the same key and body returns the same session.",
    params(IdempotencyKeyParam),
    request_body = CreateCheckoutSession,
    responses(
        (status = 201, description = "The session; `Location` names it", body = checkout_shared::CheckoutSession, headers(
                ("Idempotency-Key-Expires" = String, description = "When the server forgets this key (IMF-fixdate); after it, the same key would run again"),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with this key"),
                ("Location" = String, description = "Where the session is read: `/api/checkout-sessions/{session_id}`")
            )),
        KeyedProblems,
        (status = 403, description = "`forbidden`: a shopper's token, not a shop's secret key", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`order_session_exists`: this order has a session already (`checkout_session_id` names it); the key's stored outcome, replayed. Or `idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`).", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreateCheckoutSession>,
) -> Result<Response, OperationError> {
    let shop = principal.as_shop()?;
    let session = NewCheckoutSession::validate(shop, body.value, app.session_ttl)?;
    let asked = Asked {
        route: ROUTE,
        body: &session.canonical(),
        location: Some(location),
    };
    keyed_requests::execute(&app, shop, &key, asked, session).await
}

/// Where a new session is read.
pub fn location(session: &serde_json::Value) -> Option<String> {
    Some(format!("{ROUTE}/{}", session["session_id"].as_str()?))
}

/// `GET /api/checkout-sessions/{session_id}`: for anyone holding the id (128 random bits): what
/// the widget renders. No secrets in it.
#[utoipa::path(
    get, path = "/api/checkout-sessions/{session_id}", operation_id = "get_checkout_session", tag = "checkout sessions",
    summary = "Read a checkout session (anyone holding its id)",
    params(("session_id" = String, Path, description = "`cs_…`")),
    responses(
        (status = 200, description = "The session", body = checkout_shared::CheckoutSession),
        (status = 404, description = "`not_found`: no such session", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    SessionIdPath(session_id): SessionIdPath,
) -> Result<Json<CheckoutSession>, OperationError> {
    let row = app
        .store
        .session(&session_id)
        .await?
        .ok_or_else(not_a_session)?;
    Ok(Json(public_view(row, clock::now_ms())))
}
