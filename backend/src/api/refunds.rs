//! `POST /api/payments/{payment_id}/refunds` (the paid shop, keyed).

use axum::extract::State;
use axum::response::Response;
use checkout_shared::{CreateRefund, validate_amount};

use crate::api::AppState;
use crate::api::extract::{IdempotencyKeyHeader, JsonBody, PaymentIdPath};
use crate::api::keyed_requests::{self, Asked, IdempotencyKeyParam, KeyedProblems};
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::refunds::RefundOrder;

/// `POST /api/payments/{payment_id}/refunds`
#[utoipa::path(
    post, path = "/api/payments/{payment_id}/refunds", operation_id = "create_refund", tag = "payments",
    summary = "Refund (part of) a payment (its shop)",
    description = "Moves the amount back from the shop to the shopper, at most once per key; refunds never exceed their payment.",
    params(("payment_id" = String, Path, description = "`pay_…`"), IdempotencyKeyParam),
    request_body = CreateRefund,
    responses(
        (status = 201, description = "The refund", body = checkout_shared::Refund, headers(
                ("Idempotency-Key-Expires" = String, description = "When the server forgets this key (IMF-fixdate); after it, the same key would run again"),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with this key")
            )),
        KeyedProblems,
        (status = 402, description = "`insufficient_funds`: the shop's balance is short", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: not the payment's shop", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such payment", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`refund_exceeds_payment`: more than is left to refund (`refundable` says how much); the key's stored outcome, replayed. Or `idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`).", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    PaymentIdPath(payment_id): PaymentIdPath,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreateRefund>,
) -> Result<Response, OperationError> {
    let shop = principal.as_shop()?;
    let route = format!("/api/payments/{payment_id}/refunds");
    validate_amount(body.value.amount).map_err(OperationError::InvalidRequest)?;
    let order = RefundOrder {
        payment_id,
        amount: body.value.amount,
        livemode: shop.livemode,
        by: None,
    };
    let canonical = serde_json::json!({ "amount": order.amount });
    let asked = Asked {
        route: &route,
        body: &canonical,
        location: None,
    };
    keyed_requests::execute(&app, shop, &key, asked, order).await
}
