//! Refunds: keyed credits back against a payment, never more in total than the payment.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use checkout_shared::{CreateRefund, ErrorCode, Problem, Refund, validate_amount};

use crate::AppState;
use crate::accounts::Principal;
use crate::clock;
use crate::error::ApiError;
use crate::http::JsonBody;
use crate::idempotency::{self, Decision, Fingerprint, Operation, RequiredKey, StoredResponse};
use crate::payments::not_found;
use crate::store::{Claim, EntryKind, LedgerEntry, NewRefund, Tx};

/// A validated refund request.
#[derive(Debug)]
pub struct RefundOrder {
    pub payment_id: String,
    pub amount: i64,
}

/// `POST /api/payments/{payment_id}/refunds`
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    Path(payment_id): Path<String>,
    RequiredKey(key): RequiredKey,
    body: JsonBody<CreateRefund>,
) -> Result<Response, ApiError> {
    let route = format!("/api/payments/{payment_id}/refunds");
    let fingerprint = Fingerprint::of("POST", &route, &body.canonical);
    validate_amount(body.value.amount).map_err(ApiError::InvalidRequest)?;
    let order = RefundOrder {
        payment_id,
        amount: body.value.amount,
    };
    idempotency::execute(
        &app,
        &principal,
        &key,
        &fingerprint,
        &Operation::Refund(order),
    )
    .await
}

/// The business step of a refund, inside the protocol's transaction.
pub(crate) async fn refund(
    tx: &mut Tx,
    claim: &Claim<'_>,
    order: &RefundOrder,
) -> Result<Decision, ApiError> {
    let account_id = claim.account_id;
    let Some(refunded_total) = tx
        .add_refunded(account_id, &order.payment_id, order.amount)
        .await?
    else {
        // Not stored: an unknown payment is the caller's mistake, not an outcome.
        let payment = tx
            .payment(account_id, &order.payment_id)
            .await?
            .ok_or_else(|| not_found(&order.payment_id))?;
        let refundable = payment.amount - payment.refunded;
        let mut problem = Problem::new(
            409,
            ErrorCode::RefundExceedsPayment,
            format!(
                "{} exceeds the {refundable} that remains refundable of payment {}",
                order.amount, order.payment_id
            ),
        );
        problem.payment_id = Some(order.payment_id.clone());
        problem.refundable = Some(refundable);
        return Ok(Decision::Respond(StoredResponse::problem(&problem)));
    };

    let balance = tx.credit(account_id, order.amount).await?;
    let refund_id = format!("ref_{}", uuid::Uuid::new_v4().simple());
    tx.insert_refund(
        claim,
        &NewRefund {
            refund_id: &refund_id,
            payment_id: &order.payment_id,
            amount: order.amount,
            refunded_total_after: refunded_total,
            balance_after: balance,
        },
    )
    .await?;
    tx.insert_ledger(&LedgerEntry {
        account_id,
        amount: order.amount,
        kind: EntryKind::Refund,
        claim: Some(claim),
        payment_id: Some(&order.payment_id),
        refund_id: Some(&refund_id),
        created_at: claim.now_ms,
    })
    .await?;

    let refund = Refund {
        refund_id,
        payment_id: order.payment_id.clone(),
        amount: order.amount,
        refunded_total,
        balance,
        created_at: clock::rfc3339(claim.now_ms),
    };
    Ok(Decision::Respond(StoredResponse::json(
        StatusCode::CREATED,
        &refund,
    )))
}
