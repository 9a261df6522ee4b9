//! Refunds: the shop that was paid credits part or all of a payment back to its shopper, with
//! a key of its own. Refunds of a payment never exceed it, and the shop's balance never goes
//! below zero: the shop's waiting credits are folded into its balance under the balance row's
//! lock, then the refund is debited from it, guarded. Shop refunds queue on that row; payments
//! to the shop never do.

use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{ErrorCode, Problem, Refund};

use crate::operations::answers;
use crate::operations::error::OperationError;
use crate::operations::events;
use crate::operations::payments::not_found;
use crate::operations::staff::Member;
use crate::store::{NewRefund, Refunded, Tx};
use crate::{clock, ids};

/// A validated refund request.
#[derive(Debug)]
pub struct RefundOrder {
    pub payment_id: String,
    pub amount: i64,
    /// The shop account's mode (its payments are all of it).
    pub livemode: bool,
    /// Asked for by a member in the shop's dashboard: the audit line written with the refund.
    pub by: Option<Member>,
}

/// The business step of a refund, inside the protocol's transaction.
impl Operation<Tx> for RefundOrder {
    type Error = OperationError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, OperationError> {
        let shop = claim.scope.as_str();
        // Never more than remains of the payment; then every credit committed so far folded
        // into the shop's balance, which holds under its row's lock until commit.
        let Some((
            Refunded {
                refunded_total,
                version,
                shopper_account_id: shopper,
                order_id,
                currency,
            },
            folded,
        )) = tx
            .add_refunded_and_fold(shop, &self.payment_id, self.amount)
            .await?
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
            return Ok(Decision::Respond(answers::declined(&problem)));
        };
        // Never below zero: the guarded debit, the shopper's credit, the refund and the
        // transfer in double entry.
        let refund_id = ids::new_id("ref_");
        let transferred = tx
            .transfer_refund(
                claim,
                &shopper,
                &NewRefund {
                    refund_id: &refund_id,
                    payment_id: &self.payment_id,
                    amount: self.amount,
                    refunded_total_after: refunded_total,
                },
            )
            .await?;
        let Some(balance) = transferred else {
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
            return Ok(Decision::Respond(answers::declined(&problem)));
        };
        let refund = Refund {
            refund_id,
            payment_id: self.payment_id.clone(),
            amount: self.amount,
            refunded_total,
            balance: None,
            created_at: clock::rfc3339(claim.now_ms),
            livemode: self.livemode,
        };
        // The shop hears of it too, from the outbox, even if this answer is lost.
        let of_payment = events::OfPayment {
            order_id: &order_id,
            currency: &currency,
            version,
        };
        events::refund_succeeded(tx, shop, &refund, of_payment, claim.now_ms).await?;
        if let Some(member) = &self.by {
            let subject = format!("{} {} ({})", refund.refund_id, self.payment_id, self.amount);
            tx.audit(&member.audit("refund.created", &subject)).await?;
        }
        Ok(Decision::Respond(answers::created(&Refund {
            balance: Some(balance),
            ..refund
        })))
    }
}
