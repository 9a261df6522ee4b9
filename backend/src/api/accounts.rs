//! `GET /api/account`: the caller's account and balance.

use axum::Json;
use axum::extract::State;
use checkout_shared::Account;

use crate::api::AppState;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;

/// `GET /api/account`
#[utoipa::path(
    get, path = "/api/account", operation_id = "get_account", tag = "accounts",
    summary = "The caller's account and balance",
    responses(
        (status = 200, description = "The account", body = checkout_shared::Account),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []), ("shop_secret_key" = []))
)]
pub async fn get(
    State(app): State<AppState>,
    principal: Principal,
) -> Result<Json<Account>, OperationError> {
    let row = app
        .store
        .account(&principal.account_id)
        .await?
        .ok_or(OperationError::Unauthorized)?;
    Ok(Json(Account {
        account_id: row.account_id,
        balance: row.balance,
        currency: row.currency,
        livemode: row.livemode,
        email: row.email,
    }))
}
