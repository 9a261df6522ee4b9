//! Payments: a shopper pays a checkout session, whose amount its shop fixed. The money moves
//! from the shopper to the shop in one transaction: the session is taken (at most one payment
//! each), the shopper's balance is debited (guarded), and the transfer is written as two
//! ledger rows that sum to zero. The shop's credit waits beside its balance row instead of
//! updating it, so that no payment to a shop ever queues on that one row.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{
    CreatePayment, ErrorCode, Payment, PaymentDetails, PaymentStatus, Problem, Refund,
};

use crate::AppState;
use crate::accounts::Principal;
use crate::clock;
use crate::error::ApiError;
use crate::events;
use crate::extract::{IdempotencyKeyHeader, JsonBody, PaymentIdPath};
use crate::ids;
use crate::keyed::{self, Asked};
use crate::store::{EntryKind, LedgerEntry, NewPayment, PaymentRow, Tx};

/// A validated payment request: this shopper pays this session.
#[derive(Debug)]
pub struct Charge {
    pub checkout_session_id: String,
    /// What the shopper's account pays in; the session must be in it.
    pub currency: String,
}

impl Charge {
    pub fn validate(principal: &Principal, request: CreatePayment) -> Result<Charge, ApiError> {
        let shopper = principal.as_shopper()?;
        if !ids::is_id("cs_", &request.checkout_session_id) {
            return Err(ApiError::InvalidRequest(
                "checkout_session_id must be a checkout session's id (cs_…)".into(),
            ));
        }
        Ok(Charge {
            checkout_session_id: request.checkout_session_id,
            currency: shopper.currency.clone(),
        })
    }
}

/// `POST /api/payments`
#[utoipa::path(
    post, path = "/api/payments", operation_id = "create_payment", tag = "payments",
    summary = "Pay a checkout session (a shopper)",
    description = "Debits the shopper and credits the session's shop in one transaction, at most once per key and once per session. A decline (`402`, `409 session_already_paid`, `410`) is the key's stored outcome: a retry gets it again.",
    params(("Idempotency-Key" = String, Header, description = "Names one intent: 1–255 visible ASCII characters (a UUID v4 is usual). Resend the same key with the same body on every retry; a new intent gets a new key.")),
    request_body = CreatePayment,
    responses(
        (status = 201, description = "The payment", body = checkout_shared::Payment, headers(
                ("Idempotency-Key-Expires" = String, description = "When the server forgets this key (IMF-fixdate); after it, the same key would run again"),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with this key")
            )),
        (status = 400, description = "`invalid_request`: a malformed body, header or key", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 401, description = "`unauthorized`: no valid bearer credential", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 409, description = "`idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`)", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 422, description = "`idempotency_key_reused`: this key was first used with another request", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 503, description = "`service_unavailable`: the database is unavailable; nothing was done, retry with the same key", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 402, description = "`insufficient_funds`: the shopper's balance is short (`balance` says what it was)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`session_already_paid`: the session was paid (`payment_id` names the payment)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 410, description = "`session_expired`: the session can no longer be paid", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []))
)]
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreatePayment>,
) -> Result<Response, ApiError> {
    let charge = Charge::validate(&principal, body.value)?;
    let canonical = serde_json::json!({ "checkout_session_id": charge.checkout_session_id });
    let asked = Asked {
        route: "/api/payments",
        body: &canonical,
        location: Some(|payment| {
            Some(format!("/api/payments/{}", payment["payment_id"].as_str()?))
        }),
    };
    keyed::execute(&app, &principal, &key, asked, charge).await
}

/// The business step of a payment, inside the protocol's transaction.
impl Operation<Tx> for Charge {
    type Error = ApiError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, ApiError> {
        let shopper = claim.scope.as_str();
        let session_id = self.checkout_session_id.as_str();
        let payment_id = ids::new_id("pay_");
        // The session first: paid at most once, and never after it expired.
        let Some(session) = tx
            .take_session(session_id, &payment_id, claim.now_ms)
            .await?
        else {
            return not_payable(tx, session_id).await;
        };
        if session.currency != self.currency {
            return Err(ApiError::InvalidRequest(format!(
                "the session is in {}; this account pays in {}",
                session.currency, self.currency
            )));
        }
        // The guarded debit. Short of money: the session is open again, and the decline is
        // this key's outcome.
        let Some(balance) = tx.debit(shopper, session.amount).await? else {
            tx.release_session(session_id, &payment_id).await?;
            let balance = tx.balance(shopper).await?;
            let mut problem = Problem::new(
                402,
                ErrorCode::InsufficientFunds,
                format!(
                    "the balance {balance} is less than the amount {}",
                    session.amount
                ),
            );
            problem.balance = Some(balance);
            return Ok(Decision::Respond(keyed::declined(&problem)));
        };
        let inserted = tx
            .insert_payment(
                claim,
                &NewPayment {
                    payment_id: &payment_id,
                    checkout_session_id: session_id,
                    shopper_account_id: shopper,
                    shop_account_id: &session.shop_account_id,
                    order_id: &session.order_id,
                    amount: session.amount,
                    currency: &session.currency,
                    balance_after: balance,
                },
            )
            .await?;
        if !inserted {
            // Another payment of this session committed first: the next attempt says so.
            return Ok(Decision::Restart);
        }
        // The transfer, in double entry: the shopper's debit (with the key's claim), the shop's
        // credit, which waits to be folded into the shop's balance.
        for (account_id, amount, keyed_side) in [
            (shopper, -session.amount, Some(claim)),
            (session.shop_account_id.as_str(), session.amount, None),
        ] {
            tx.insert_ledger(&LedgerEntry {
                account_id,
                amount,
                kind: EntryKind::Payment,
                claim: keyed_side,
                payment_id: Some(&payment_id),
                refund_id: None,
                created_at: claim.now_ms,
            })
            .await?;
        }
        tx.credit_unfolded(&payment_id, &session.shop_account_id, session.amount)
            .await?;
        let payment = Payment {
            payment_id,
            checkout_session_id: Some(self.checkout_session_id.clone()),
            order_id: session.order_id,
            amount: session.amount,
            currency: session.currency,
            status: PaymentStatus::Succeeded,
            balance: None,
            created_at: clock::rfc3339(claim.now_ms),
        };
        // The shop hears of it from the outbox, in this transaction: even if the shopper's tab
        // is gone before this answer arrives.
        events::payment_succeeded(tx, &session.shop_account_id, &payment, claim.now_ms).await?;
        // The shopper's balance is the shopper's: in this answer, never in the shop's event.
        Ok(Decision::Respond(keyed::created(&Payment {
            balance: Some(balance),
            ..payment
        })))
    }
}

/// Why a session could not be taken: unknown (`404`, nothing stored), paid already (`409` with
/// its payment), or expired (`410`). The last two are this key's outcome.
async fn not_payable(tx: &mut Tx, session_id: &str) -> Result<Decision, ApiError> {
    let Some(session) = tx.session(session_id).await? else {
        return Err(ApiError::NotFound(
            "there is no such checkout session".into(),
        ));
    };
    let problem = match (session.status.as_str(), session.payment_id) {
        ("paid", Some(payment_id)) => {
            let mut problem = Problem::new(
                409,
                ErrorCode::SessionAlreadyPaid,
                format!("checkout session {session_id} is already paid by payment {payment_id}"),
            );
            problem.payment_id = Some(payment_id);
            problem
        }
        _ => Problem::new(
            410,
            ErrorCode::SessionExpired,
            format!("checkout session {session_id} has expired; the shop can make a new one"),
        ),
    };
    Ok(Decision::Respond(keyed::declined(&problem)))
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
) -> Result<Json<PaymentDetails>, ApiError> {
    let (row, refunds) = app
        .store
        .payment_with_refunds(&principal.account_id, &payment_id)
        .await?
        .ok_or_else(|| not_found(&payment_id))?;
    let shop_is_asking = row.shop_account_id == principal.account_id;
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
            })
            .collect(),
    }))
}

pub(crate) fn not_found(payment_id: &str) -> ApiError {
    ApiError::NotFound(format!("there is no payment {payment_id} of yours"))
}

fn payment_of(row: PaymentRow, with_shopper_balance: bool) -> Payment {
    Payment {
        payment_id: row.payment_id,
        checkout_session_id: row.checkout_session_id,
        order_id: row.order_id,
        amount: row.amount,
        currency: row.currency,
        status: PaymentStatus::Succeeded,
        balance: with_shopper_balance.then_some(row.balance_after),
        created_at: clock::rfc3339(row.created_at),
    }
}
