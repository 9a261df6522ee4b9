//! A live shopper's passkeys: `POST /api/shoppers/passkeys/registration` then `POST
//! /api/shoppers/passkeys` (a new one, signed in), `GET /api/shoppers/passkeys` (the list);
//! `POST /api/shoppers/passkeys/authentication` then `POST /api/shoppers/passkeys/sign-in` (a
//! sign-in with whichever the browser offers). Called only by the account window, on the
//! checkout's origin (the passkeys' relying party).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use checkout_shared::{PasskeyAnswer, PasskeyChallenge, PasskeyList, PasskeyView, ShopperToken};
use webauthn_rs::prelude::{PublicKeyCredential, RegisterPublicKeyCredential};

use crate::api::AppState;
use crate::api::extract::JsonBody;
use crate::api::shoppers::ClientAddress;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::passkeys;
use crate::store::AccountKind;

/// Passkeys are a live shopper's only.
fn live_shopper(principal: &Principal) -> Result<(), OperationError> {
    if principal.kind == AccountKind::Shopper && principal.livemode {
        Ok(())
    } else {
        Err(OperationError::Forbidden(
            "only a live shopper has passkeys".into(),
        ))
    }
}

/// The browser's credential, as WebAuthn's JSON has it; anything else is a `400`.
fn credential<T: serde::de::DeserializeOwned>(answer: &PasskeyAnswer) -> Result<T, OperationError> {
    serde_json::from_value(answer.credential.clone())
        .map_err(|e| OperationError::InvalidRequest(format!("credential: {e}")))
}

/// `POST /api/shoppers/passkeys/registration`
#[utoipa::path(
    post, path = "/api/shoppers/passkeys/registration", operation_id = "begin_passkey_registration", tag = "shoppers",
    summary = "A challenge to make a new passkey for the signed-in live shopper",
    responses(
        (status = 200, description = "The options for navigator.credentials.create(), and the ceremony to answer within five minutes", body = checkout_shared::PasskeyChallenge),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: not a live shopper", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []))
)]
pub async fn begin_registration(
    State(app): State<AppState>,
    principal: Principal,
) -> Result<Json<PasskeyChallenge>, OperationError> {
    live_shopper(&principal)?;
    let email = app
        .store
        .account(&principal.account_id)
        .await?
        .and_then(|row| row.email)
        .ok_or(OperationError::Unauthorized)?;
    let challenge =
        passkeys::begin_registration(&app.store, &app.passkeys, &principal.account_id, &email)
            .await?;
    Ok(Json(challenge))
}

/// `POST /api/shoppers/passkeys`
#[utoipa::path(
    post, path = "/api/shoppers/passkeys", operation_id = "register_passkey", tag = "shoppers",
    summary = "The browser's answer to a registration challenge: the new passkey is kept",
    request_body = PasskeyAnswer,
    responses(
        (status = 201, description = "The passkey", body = checkout_shared::PasskeyView),
        (status = 400, description = "`passkey_rejected` (no such ceremony, expired or used; an answer that does not verify) or `invalid_request`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: not a live shopper", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []))
)]
pub async fn register(
    State(app): State<AppState>,
    principal: Principal,
    body: JsonBody<PasskeyAnswer>,
) -> Result<(StatusCode, Json<PasskeyView>), OperationError> {
    live_shopper(&principal)?;
    let credential: RegisterPublicKeyCredential = credential(&body.value)?;
    let passkey = passkeys::finish_registration(
        &app.store,
        &app.passkeys,
        &principal.account_id,
        &body.value.ceremony_id,
        &credential,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(passkey)))
}

/// `GET /api/shoppers/passkeys`
#[utoipa::path(
    get, path = "/api/shoppers/passkeys", operation_id = "list_passkeys", tag = "shoppers",
    summary = "The signed-in live shopper's passkeys",
    responses(
        (status = 200, description = "The passkeys, oldest first", body = checkout_shared::PasskeyList),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: not a live shopper", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []))
)]
pub async fn list(
    State(app): State<AppState>,
    principal: Principal,
) -> Result<Json<PasskeyList>, OperationError> {
    live_shopper(&principal)?;
    let passkeys = passkeys::list(&app.store, &principal.account_id).await?;
    Ok(Json(PasskeyList { passkeys }))
}

/// `POST /api/shoppers/passkeys/authentication`
#[utoipa::path(
    post, path = "/api/shoppers/passkeys/authentication", operation_id = "begin_passkey_sign_in", tag = "shoppers",
    summary = "A challenge to sign in with a passkey (whichever of this origin the browser offers)",
    responses(
        (status = 200, description = "The options for navigator.credentials.get(), and the ceremony to answer within five minutes", body = checkout_shared::PasskeyChallenge),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn begin_sign_in(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
) -> Result<Json<PasskeyChallenge>, OperationError> {
    app.limits.passkey(address)?;
    Ok(Json(
        passkeys::begin_sign_in(&app.store, &app.passkeys).await?,
    ))
}

/// `POST /api/shoppers/passkeys/sign-in`
#[utoipa::path(
    post, path = "/api/shoppers/passkeys/sign-in", operation_id = "passkey_sign_in", tag = "shoppers",
    summary = "The browser's answer to a sign-in challenge: a new token for the passkey's account",
    request_body = PasskeyAnswer,
    responses(
        (status = 200, description = "The token (expires when idle or old; revoked by sign-out)", body = checkout_shared::ShopperToken),
        (status = 400, description = "`passkey_rejected` (no such ceremony, expired or used; a passkey no account has; a signature that does not verify) or `invalid_request`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn sign_in(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<PasskeyAnswer>,
) -> Result<Json<ShopperToken>, OperationError> {
    app.limits.passkey(address)?;
    let credential: PublicKeyCredential = credential(&body.value)?;
    let signed_in = passkeys::finish_sign_in(
        &app.store,
        &app.passkeys,
        &body.value.ceremony_id,
        &credential,
    )
    .await?;
    Ok(Json(ShopperToken {
        token: signed_in.token,
        account_id: signed_in.account_id,
    }))
}
