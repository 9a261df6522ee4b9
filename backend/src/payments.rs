//! Payments: the keyed debit of a shopper's account for one order.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{
    CreatePayment, ErrorCode, Payment, PaymentDetails, PaymentStatus, Problem, Refund,
    validate_amount, validate_currency, validate_order_id,
};

use crate::AppState;
use crate::accounts::Principal;
use crate::clock;
use crate::error::ApiError;
use crate::extract::{IdempotencyKeyHeader, JsonBody, PaymentIdPath};
use crate::ids;
use crate::keyed::{self, Asked};
use crate::store::{Charged, NewPayment, PaymentRow, Tx};

/// A validated payment request.
#[derive(Debug)]
pub struct Charge {
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
}

impl Charge {
    pub fn validate(principal: &Principal, request: CreatePayment) -> Result<Charge, ApiError> {
        validate_order_id(&request.order_id).map_err(ApiError::InvalidRequest)?;
        validate_amount(request.amount).map_err(ApiError::InvalidRequest)?;
        let currency = request
            .currency
            .unwrap_or_else(|| principal.currency.clone());
        validate_currency(&currency).map_err(ApiError::InvalidRequest)?;
        if currency != principal.currency {
            return Err(ApiError::InvalidRequest(format!(
                "this account pays in {}, not {currency}",
                principal.currency
            )));
        }
        Ok(Charge {
            order_id: request.order_id,
            amount: request.amount,
            currency,
        })
    }
}

/// `POST /api/payments`
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreatePayment>,
) -> Result<Response, ApiError> {
    let charge = Charge::validate(&principal, body.value)?;
    let asked = Asked {
        route: "/api/payments",
        body: &body.canonical,
    };
    keyed::execute(&app, &principal, &key, asked, charge).await
}

/// The business step of a payment, inside the protocol's transaction: the guarded debit, the
/// payment row and its ledger entry.
impl Operation<Tx> for Charge {
    type Error = ApiError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, ApiError> {
        let payment_id = ids::new_id("pay_");
        let new_payment = NewPayment {
            payment_id: &payment_id,
            order_id: &self.order_id,
            amount: self.amount,
            currency: &self.currency,
        };
        let balance = match tx.charge(claim, &new_payment).await? {
            Charged::Debited { balance } => balance,
            // A payment of this order under another key committed after our check: the unique
            // index caught it. Undo the debit by rolling back; the next attempt answers 409.
            Charged::OrderTaken => return Ok(Decision::Restart),
            Charged::NotDebited => return declined(tx, &claim.scope, self).await,
        };
        let payment = Payment {
            payment_id,
            order_id: self.order_id.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
            status: PaymentStatus::Succeeded,
            balance,
            created_at: clock::rfc3339(claim.now_ms),
        };
        Ok(Decision::Respond(keyed::created(&payment)))
    }
}

/// Why nothing was debited: the order was paid already (`409`), or the balance is short (`402`).
/// Both are outcomes, stored under the key.
async fn declined(tx: &mut Tx, account_id: &str, charge: &Charge) -> Result<Decision, ApiError> {
    if let Some(payment_id) = tx.paid_order(account_id, &charge.order_id).await? {
        let mut problem = Problem::new(
            409,
            ErrorCode::OrderAlreadyPaid,
            format!(
                "order {} is already paid by payment {payment_id}",
                charge.order_id
            ),
        );
        problem.payment_id = Some(payment_id);
        return Ok(Decision::Respond(keyed::declined(&problem)));
    }
    let balance = tx.balance(account_id).await?;
    let mut problem = Problem::new(
        402,
        ErrorCode::InsufficientFunds,
        format!(
            "the balance {balance} is less than the amount {}",
            charge.amount
        ),
    );
    problem.balance = Some(balance);
    Ok(Decision::Respond(keyed::declined(&problem)))
}

/// `GET /api/payments/{payment_id}`: only its owner sees it; to anyone else it does not exist.
pub async fn get(
    State(app): State<AppState>,
    principal: Principal,
    PaymentIdPath(payment_id): PaymentIdPath,
) -> Result<Json<PaymentDetails>, ApiError> {
    let (row, refunds) = app
        .store
        .payment_with_refunds(&principal.account_id, &payment_id)
        .await?
        .ok_or_else(|| not_found(&payment_id))?;
    Ok(Json(PaymentDetails {
        refunded_total: row.refunded,
        payment: payment_of(row),
        refunds: refunds
            .into_iter()
            .map(|r| Refund {
                refund_id: r.refund_id,
                payment_id: r.payment_id,
                amount: r.amount,
                refunded_total: r.refunded_total_after,
                balance: r.balance_after,
                created_at: clock::rfc3339(r.created_at),
            })
            .collect(),
    }))
}

pub(crate) fn not_found(payment_id: &str) -> ApiError {
    ApiError::NotFound(format!("there is no payment {payment_id} on this account"))
}

fn payment_of(row: PaymentRow) -> Payment {
    Payment {
        payment_id: row.payment_id,
        order_id: row.order_id,
        amount: row.amount,
        currency: row.currency,
        status: PaymentStatus::Succeeded,
        balance: row.balance_after,
        created_at: clock::rfc3339(row.created_at),
    }
}
