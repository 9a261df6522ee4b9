//! `GET /healthz`: whether this instance can reach its database.

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use crate::api::state::AppState;
use crate::operations::error::OperationError;

/// `GET /healthz`: `200` when the database answers.
#[utoipa::path(
    get, path = "/healthz", operation_id = "healthz", tag = "operations",
    summary = "Liveness: 200 when the database answers",
    responses(
        (status = 200, description = "`{\"status\": \"ok\"}`", content_type = "application/json"),
        (status = 503, description = "`service_unavailable`: the database does not answer", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn healthz(State(app): State<AppState>) -> Result<Json<Value>, OperationError> {
    app.store.ping().await?;
    Ok(Json(serde_json::json!({ "status": "ok" })))
}
