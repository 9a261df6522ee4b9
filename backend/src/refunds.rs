//! Refunds: keyed credits back against a payment, never more in total than the payment.

use axum::extract::State;
use axum::response::Response;
use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{CreateRefund, ErrorCode, Problem, Refund, validate_amount};

use crate::AppState;
use crate::accounts::Principal;
use crate::clock;
use crate::error::ApiError;
use crate::extract::{IdempotencyKeyHeader, JsonBody, PaymentIdPath};
use crate::ids;
use crate::keyed::{self, Asked};
use crate::payments::not_found;
use crate::store::{EntryKind, LedgerEntry, NewRefund, Tx};

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
    PaymentIdPath(payment_id): PaymentIdPath,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreateRefund>,
) -> Result<Response, ApiError> {
    let route = format!("/api/payments/{payment_id}/refunds");
    validate_amount(body.value.amount).map_err(ApiError::InvalidRequest)?;
    let order = RefundOrder {
        payment_id,
        amount: body.value.amount,
    };
    let asked = Asked {
        route: &route,
        body: &body.canonical,
    };
    keyed::execute(&app, &principal, &key, asked, order).await
}

/// The business step of a refund, inside the protocol's transaction: the guarded increase of
/// the payment's refunded total, the credit, the refund row and its ledger entry.
impl Operation<Tx> for RefundOrder {
    type Error = ApiError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, ApiError> {
        let account_id = claim.scope.as_str();
        let Some(refunded_total) = tx
            .add_refunded(account_id, &self.payment_id, self.amount)
            .await?
        else {
            // Not stored: an unknown payment is the caller's mistake, not an outcome.
            let payment = tx
                .payment(account_id, &self.payment_id)
                .await?
                .ok_or_else(|| not_found(&self.payment_id))?;
            let refundable = payment.amount - payment.refunded;
            let mut problem = Problem::new(
                409,
                ErrorCode::RefundExceedsPayment,
                format!(
                    "{} exceeds the {refundable} that remains refundable of payment {}",
                    self.amount, self.payment_id
                ),
            );
            problem.payment_id = Some(self.payment_id.clone());
            problem.refundable = Some(refundable);
            return Ok(Decision::Respond(keyed::declined(&problem)));
        };

        let balance = tx.credit(account_id, self.amount).await?;
        let refund_id = ids::new_id("ref_");
        tx.insert_refund(
            claim,
            &NewRefund {
                refund_id: &refund_id,
                payment_id: &self.payment_id,
                amount: self.amount,
                refunded_total_after: refunded_total,
                balance_after: balance,
            },
        )
        .await?;
        tx.insert_ledger(&LedgerEntry {
            account_id,
            amount: self.amount,
            kind: EntryKind::Refund,
            claim: Some(claim),
            payment_id: Some(&self.payment_id),
            refund_id: Some(&refund_id),
            created_at: claim.now_ms,
        })
        .await?;

        let refund = Refund {
            refund_id,
            payment_id: self.payment_id.clone(),
            amount: self.amount,
            refunded_total,
            balance,
            created_at: clock::rfc3339(claim.now_ms),
        };
        Ok(Decision::Respond(keyed::created(&refund)))
    }
}
