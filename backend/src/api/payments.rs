//! `POST /api/payments` (a shopper, keyed) and `GET /api/payments/{payment_id}` (its shopper or
//! its shop).

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use checkout_shared::{CreatePayment, PaymentDetails, Refund};

use crate::api::AppState;
use crate::api::extract::{IdempotencyKeyHeader, JsonBody, PaymentIdPath};
use crate::api::keyed_requests::{self, Asked, IdempotencyKeyParam, KeyedProblems};
use crate::clock;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::payments::{Charge, not_found, payment_of};

/// `POST /api/payments`
#[utoipa::path(
    post, path = "/api/payments", operation_id = "create_payment", tag = "payments",
    summary = "Pay a checkout session (a shopper)",
    description = "Debits the shopper and credits the session's shop in one transaction, at most once per key and once per session. A decline (`402`, `409 session_already_paid`, `410`) is the key's stored outcome: a retry gets it again.",
    params(IdempotencyKeyParam),
    request_body = CreatePayment,
    responses(
        (status = 201, description = "The payment; `Location` names it", body = checkout_shared::Payment, headers(
                ("Idempotency-Key-Expires" = String, description = "When the server forgets this key (IMF-fixdate); after it, the same key would run again"),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with this key"),
                ("Location" = String, description = "Where the payment is read: `/api/payments/{payment_id}`")
            )),
        KeyedProblems,
        (status = 402, description = "`insufficient_funds`: the shopper's balance is short (`balance` says what it was)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`session_already_paid`: the session was paid (`payment_id` names the payment); the key's stored outcome, replayed. Or `idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`).", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 410, description = "`session_expired`: the session can no longer be paid", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []))
)]
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreatePayment>,
) -> Result<Response, OperationError> {
    let charge = Charge::validate(&principal, body.value, &app.store)?;
    let canonical = serde_json::json!({ "checkout_session_id": charge.checkout_session_id });
    let asked = Asked {
        route: "/api/payments",
        body: &canonical,
        location: Some(|payment| {
            Some(format!("/api/payments/{}", payment["payment_id"].as_str()?))
        }),
    };
    keyed_requests::execute(&app, &principal, &key, asked, charge).await
}

/// `GET /api/payments/{payment_id}`: for its shopper and its shop; to anyone else it does not
/// exist. Each sees its own balance and not the other's.
#[utoipa::path(
    get, path = "/api/payments/{payment_id}", operation_id = "get_payment", tag = "payments",
    summary = "Read a payment with its refunds (its shopper or its shop)",
    params(("payment_id" = String, Path, description = "`pay_…`")),
    responses(
        (status = 200, description = "The payment, what was refunded, and each refund", body = checkout_shared::PaymentDetails),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such payment for this caller", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []), ("shop_secret_key" = []))
)]
pub async fn get(
    State(app): State<AppState>,
    principal: Principal,
    PaymentIdPath(payment_id): PaymentIdPath,
) -> Result<Json<PaymentDetails>, OperationError> {
    let (row, refunds) = app
        .store
        .payment_with_refunds(&principal.account_id, &payment_id)
        .await?
        .ok_or_else(|| not_found(&payment_id))?;
    let shop_is_asking = row.shop_account_id == principal.account_id;
    let row_livemode = row.livemode;
    Ok(Json(PaymentDetails {
        refunded_total: row.refunded,
        payment: payment_of(row, !shop_is_asking),
        refunds: refunds
            .into_iter()
            .map(|r| Refund {
                refund_id: r.refund_id,
                payment_id: r.payment_id,
                amount: r.amount,
                refunded_total: r.refunded_total_after,
                balance: shop_is_asking.then_some(r.balance_after),
                created_at: clock::rfc3339(r.created_at),
                livemode: row_livemode,
            })
            .collect(),
    }))
}
