//! The price of idempotency, measured: `POST /api/bench/unkeyed-payments` runs the very same
//! debit, payment row and ledger row in one transaction, but without claiming a key or storing
//! the response. Compiled only with the `bench-routes` feature; never in the default build.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use checkout_shared::CreatePayment;

use crate::AppState;
use crate::accounts::Principal;
use crate::clock;
use crate::error::ApiError;
use crate::http::JsonBody;
use crate::idempotency::Decision;
use crate::payments::{self, Charge};
use crate::store::Claim;

pub async fn unkeyed_payment(
    State(app): State<AppState>,
    principal: Principal,
    body: JsonBody<CreatePayment>,
) -> Result<Response, ApiError> {
    let charge = Charge::validate(&principal, body.value)?;
    let mut tx = app.store.begin().await?;
    // The ledger row still carries a claim id (it is unique there), but no key row is written.
    let claim = Claim {
        account_id: &principal.account_id,
        key: "unkeyed",
        claim_id: uuid::Uuid::new_v4().simple().to_string(),
        request_hash: "",
        now_ms: clock::now_ms(),
    };
    match payments::charge(&mut tx, &claim, &charge).await? {
        Decision::Respond(response) => {
            tx.commit().await?;
            Ok((
                response.status,
                [("content-type", "application/json")],
                response.body,
            )
                .into_response())
        }
        Decision::Restart => Ok(StatusCode::CONFLICT.into_response()),
    }
}
