//! `GET /api/idempotency-keys/{key}`: where one of the caller's own keys stands, so that a
//! client can learn an old intent's fate without sending it again (and perhaps running it a
//! second time after the key has expired). Another principal's keys, unknown keys and expired
//! keys are all simply not found.

use axum::Json;
use axum::extract::{Path, State};
use checkout_idempotency::KeyStatus;
use checkout_shared::{IdempotencyKey, KeyState};

use crate::api::AppState;
use crate::clock;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;

#[utoipa::path(
    get, path = "/api/idempotency-keys/{key}", operation_id = "get_idempotency_key", tag = "idempotency keys",
    summary = "What became of one of the caller's keys",
    description = "Whether the server knows the key, whether its request is done, and if so its stored answer (status and body): a client whose answer was lost learns the outcome without resending.",
    params(("key" = String, Path, description = "The Idempotency-Key as sent")),
    responses(
        (status = 200, description = "The key's state and, once done, its stored answer", body = checkout_shared::KeyStatus),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: the key is unknown, or expired and forgotten", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []), ("shop_secret_key" = []))
)]
pub async fn status(
    State(app): State<AppState>,
    principal: Principal,
    Path(key): Path<String>,
) -> Result<Json<checkout_shared::KeyStatus>, OperationError> {
    let not_found =
        || OperationError::NotFound("there is no such idempotency key (or it has expired)".into());
    let key = IdempotencyKey::parse(&key).map_err(|_| not_found())?;
    let status = app
        .protocol
        .key_status(&app.store, &principal.account_id, key.as_str())
        .await?;
    Ok(Json(match status {
        KeyStatus::Done {
            response,
            expires_at_ms,
        } => checkout_shared::KeyStatus {
            status: KeyState::Done,
            response_status: Some(response.status),
            response: serde_json::from_str(&response.body).ok(),
            expires_at: Some(clock::rfc3339(expires_at_ms)),
        },
        KeyStatus::InProgress { expires_at_ms } => checkout_shared::KeyStatus {
            status: KeyState::InProgress,
            response_status: None,
            response: None,
            expires_at: expires_at_ms.map(clock::rfc3339),
        },
        KeyStatus::Unknown => return Err(not_found()),
    }))
}
