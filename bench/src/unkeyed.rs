//! The price of idempotency, measured: `POST /api/bench/unkeyed-payments` runs the very same
//! debit, payment row and ledger row in one transaction, but without claiming a key or storing
//! the response. Served only by `checkout-server-bench`, never by the shipped server.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use checkout_backend::api::AppState;
use checkout_backend::api::extract::JsonBody;
use checkout_backend::operations::authentication::Principal;
use checkout_backend::operations::error::OperationError;
use checkout_backend::operations::payments::Charge;
use checkout_backend::store::Tx;
use checkout_idempotency::{Claim, Decision, Finish, KeyStore, Operation, Work, now_ms};
use checkout_shared::CreatePayment;

pub fn routes() -> Router<AppState> {
    Router::new().route("/api/bench/unkeyed-payments", post(unkeyed_payment))
}

async fn unkeyed_payment(
    State(app): State<AppState>,
    principal: Principal,
    body: JsonBody<CreatePayment>,
) -> Result<Response, OperationError> {
    let charge = Charge::validate(&principal, body.value, &app.store)?;
    // The ledger row still carries a claim id (it is unique there) and a key of its own, but
    // no key row is written.
    let claim_id = uuid::Uuid::new_v4().simple().to_string();
    let claim = Claim {
        scope: principal.account_id,
        key: format!("unkeyed-{claim_id}"),
        claim_id,
        request_hash: String::new(),
        request_body: String::new(),
        now_ms: now_ms(),
    };
    match app.store.transaction(Unkeyed { charge, claim }).await? {
        Some(decision) => Ok((
            StatusCode::from_u16(decision.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [("content-type", "application/json")],
            decision.body,
        )
            .into_response()),
        None => Ok(StatusCode::CONFLICT.into_response()),
    }
}

/// The payment's own step, committed without any key.
struct Unkeyed {
    charge: Charge,
    claim: Claim,
}

impl Work<Tx> for Unkeyed {
    type Output = Option<checkout_idempotency::StoredResponse>;
    type Error = OperationError;

    async fn run(self, tx: &mut Tx) -> Result<Finish<Self::Output>, OperationError> {
        Ok(match self.charge.apply(tx, &self.claim).await? {
            Decision::Respond(response) => Finish::Commit(Some(response)),
            Decision::Restart => Finish::Rollback(None),
        })
    }
}
