//! Refunds: the shop that was paid credits part or all of a payment back to its shopper, with
//! a key of its own. Refunds of a payment never exceed it, and the shop's balance never goes
//! below zero: the shop's waiting credits are folded into its balance under the balance row's
//! lock, then the refund is debited from it, guarded. Shop refunds queue on that row; payments
//! to the shop never do.

use axum::extract::State;
use axum::response::Response;
use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{CreateRefund, ErrorCode, Problem, Refund, validate_amount};

use crate::AppState;
use crate::accounts::Principal;
use crate::clock;
use crate::error::ApiError;
use crate::events;
use crate::extract::{IdempotencyKeyHeader, JsonBody, PaymentIdPath};
use crate::ids;
use crate::keyed::{self, Asked};
use crate::payments::not_found;
use crate::store::{EntryKind, LedgerEntry, NewRefund, Refunded, Tx};

/// A validated refund request.
#[derive(Debug)]
pub struct RefundOrder {
    pub payment_id: String,
    pub amount: i64,
}

/// `POST /api/payments/{payment_id}/refunds`
#[utoipa::path(
    post, path = "/api/payments/{payment_id}/refunds", operation_id = "create_refund", tag = "payments",
    summary = "Refund (part of) a payment (its shop)",
    description = "Moves the amount back from the shop to the shopper, at most once per key; refunds never exceed their payment.",
    params(("payment_id" = String, Path, description = "`pay_…`"), ("Idempotency-Key" = String, Header, description = "Names one intent: 1–255 visible ASCII characters (a UUID v4 is usual). Resend the same key with the same body on every retry; a new intent gets a new key.")),
    request_body = CreateRefund,
    responses(
        (status = 201, description = "The refund", body = checkout_shared::Refund, headers(
                ("Idempotency-Key-Expires" = String, description = "When the server forgets this key (IMF-fixdate); after it, the same key would run again"),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with this key")
            )),
        (status = 400, description = "`invalid_request`: a malformed body, header or key", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 401, description = "`unauthorized`: no valid bearer credential", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 409, description = "`idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`)", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 422, description = "`idempotency_key_reused`: this key was first used with another request", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 503, description = "`service_unavailable`: the database is unavailable; nothing was done, retry with the same key", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 402, description = "`insufficient_funds`: the shop's balance is short", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: not the payment's shop", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such payment", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`refund_exceeds_payment`: more than is left to refund (`refundable` says how much)", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    PaymentIdPath(payment_id): PaymentIdPath,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreateRefund>,
) -> Result<Response, ApiError> {
    let shop = principal.as_shop()?;
    let route = format!("/api/payments/{payment_id}/refunds");
    validate_amount(body.value.amount).map_err(ApiError::InvalidRequest)?;
    let order = RefundOrder {
        payment_id,
        amount: body.value.amount,
    };
    let canonical = serde_json::json!({ "amount": order.amount });
    let asked = Asked {
        route: &route,
        body: &canonical,
        location: None,
    };
    keyed::execute(&app, shop, &key, asked, order).await
}

/// The business step of a refund, inside the protocol's transaction.
impl Operation<Tx> for RefundOrder {
    type Error = ApiError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, ApiError> {
        let shop = claim.scope.as_str();
        // Never more than remains of the payment.
        let Some(Refunded {
            refunded_total,
            shopper_account_id: shopper,
            order_id,
            currency,
        }) = tx.add_refunded(shop, &self.payment_id, self.amount).await?
        else {
            // Not stored: an unknown payment is the caller's mistake, not an outcome.
            let payment = tx
                .payment_of_shop(shop, &self.payment_id)
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
        // Never below zero: every credit committed so far folded in, then the guarded debit.
        let folded = tx.fold_credits(shop).await?;
        let Some(balance) = tx.debit(shop, self.amount).await? else {
            tx.undo_refunded(shop, &self.payment_id, self.amount)
                .await?;
            let mut problem = Problem::new(
                402,
                ErrorCode::InsufficientFunds,
                format!(
                    "the shop's balance {folded} is less than the refund {}",
                    self.amount
                ),
            );
            problem.balance = Some(folded);
            return Ok(Decision::Respond(keyed::declined(&problem)));
        };
        tx.credit(&shopper, self.amount).await?;
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
        // The transfer, in double entry: the shop's debit (with the key's claim), the shopper's
        // credit.
        for (account_id, amount, keyed_side) in [
            (shop, -self.amount, Some(claim)),
            (shopper.as_str(), self.amount, None),
        ] {
            tx.insert_ledger(&LedgerEntry {
                account_id,
                amount,
                kind: EntryKind::Refund,
                claim: keyed_side,
                payment_id: Some(&self.payment_id),
                refund_id: Some(&refund_id),
                created_at: claim.now_ms,
            })
            .await?;
        }
        let refund = Refund {
            refund_id,
            payment_id: self.payment_id.clone(),
            amount: self.amount,
            refunded_total,
            balance: None,
            created_at: clock::rfc3339(claim.now_ms),
        };
        // The shop hears of it too, from the outbox, even if this answer is lost.
        events::refund_succeeded(tx, shop, &refund, &order_id, &currency, claim.now_ms).await?;
        Ok(Decision::Respond(keyed::created(&Refund {
            balance: Some(balance),
            ..refund
        })))
    }
}
