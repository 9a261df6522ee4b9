//! Shoppers' endpoints: `POST /api/test/shoppers` (a test shopper: anyone, always, limited per
//! address); a live shopper's `POST /api/shoppers` (sign-up: a code to the e-mail), `POST
//! /api/shoppers/confirm` (the code: the account), `POST /api/shoppers/recovery` and
//! `…/recovery/confirm` (a code, then a new password), `POST /api/shoppers/sign-in` and `POST
//! /api/shoppers/sign-out`. Called only by the payment page, on the checkout's origin.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use checkout_shared::{
    CodeSent, EmailCode, Recovery, RecoveryRequest, ShopperCredentials, ShopperToken, SignUp,
};

use crate::api::AppState;
use crate::api::extract::JsonBody;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::shoppers::{self, SignedIn};

/// The client's address as this server sees it (behind a proxy: the proxy's; see the README).
pub struct ClientAddress(pub IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientAddress {
    type Rejection = OperationError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, OperationError> {
        Ok(ClientAddress(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |info| info.0.ip()),
        ))
    }
}

fn token(signed_in: SignedIn) -> Json<ShopperToken> {
    Json(ShopperToken {
        token: signed_in.token,
        account_id: signed_in.account_id,
    })
}

/// `POST /api/test/shoppers`: a fresh test shopper holding 1 000,00 ₽ of test money.
#[utoipa::path(
    post, path = "/api/test/shoppers", operation_id = "create_test_shopper", tag = "shoppers",
    summary = "A fresh test shopper holding 1 000,00 ₽ of test money (pays test sessions only)",
    responses(
        (status = 201, description = "The shopper's token and account", body = checkout_shared::ShopperToken),
        (status = 429, description = "`too_many_requests`: too many from this address; see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn create_test_shopper(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
) -> Result<(StatusCode, Json<ShopperToken>), OperationError> {
    app.limits.test_shopper(address)?;
    let shopper = shoppers::new_test_shopper(&app.store).await?;
    Ok((StatusCode::CREATED, token(shopper)))
}

/// `POST /api/demo/session`: the old name of `POST /api/test/shoppers` (answers `200`).
#[utoipa::path(
    post, path = "/api/demo/session", operation_id = "create_demo_shopper", tag = "shoppers",
    summary = "Deprecated: POST /api/test/shoppers",
    responses(
        (status = 200, description = "The test shopper's token and account", body = checkout_shared::ShopperToken),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn create_demo_shopper(
    State(app): State<AppState>,
    address: ClientAddress,
) -> Result<Json<ShopperToken>, OperationError> {
    create_test_shopper(State(app), address)
        .await
        .map(|(_, body)| body)
}

/// `POST /api/shoppers`: a live shopper signs up; a code goes to the e-mail.
#[utoipa::path(
    post, path = "/api/shoppers", operation_id = "sign_up", tag = "shoppers",
    summary = "A live shopper signs up: a code is mailed to the address (the same answer whether or not it has an account)",
    request_body = SignUp,
    responses(
        (status = 202, description = "A mail went to the address: the code to confirm it (or, to an address that has an account, a word that it has one). Confirm with POST /api/shoppers/confirm", body = checkout_shared::CodeSent),
        (status = 400, description = "`invalid_request`: not an e-mail, or a password under 8 characters", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 503, description = "`mail_unavailable`: the mail could not be sent; nothing was made", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn sign_up(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<SignUp>,
) -> Result<(StatusCode, Json<CodeSent>), OperationError> {
    app.limits.mail(address, &body.value.email)?;
    let sent = shoppers::sign_up(
        &app.store,
        app.mailer.as_deref(),
        &body.value.email,
        body.value.password.as_deref(),
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(sent)))
}

/// `POST /api/shoppers/confirm`: the sign-up's code; the account is made and signed in.
#[utoipa::path(
    post, path = "/api/shoppers/confirm", operation_id = "confirm_sign_up", tag = "shoppers",
    summary = "The code mailed at sign-up: the account is made (with the password given then) and signed in",
    request_body = EmailCode,
    responses(
        (status = 201, description = "The account exists and is signed in: the token", body = checkout_shared::ShopperToken),
        (status = 400, description = "`invalid_code`: wrong, expired (10 minutes), used, or out of its 5 tries: ask for a new one", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn confirm_sign_up(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<EmailCode>,
) -> Result<(StatusCode, Json<ShopperToken>), OperationError> {
    let guess = app.limits.guess(address, &body.value.email)?;
    let shopper =
        shoppers::confirm_sign_up(&app.store, &body.value.email, &body.value.code).await?;
    app.limits.right(guess);
    Ok((StatusCode::CREATED, token(shopper)))
}

/// `POST /api/shoppers/recovery`: a code to a confirmed account's address.
#[utoipa::path(
    post, path = "/api/shoppers/recovery", operation_id = "request_recovery", tag = "shoppers",
    summary = "A live shopper who lost the password: a code is mailed to the address (the same answer for any address)",
    request_body = RecoveryRequest,
    responses(
        (status = 202, description = "A mail went to the address: the code, if it has a confirmed account", body = checkout_shared::CodeSent),
        (status = 400, description = "`invalid_request`: not an e-mail", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 503, description = "`mail_unavailable`: the mail could not be sent", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn request_recovery(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<RecoveryRequest>,
) -> Result<(StatusCode, Json<CodeSent>), OperationError> {
    app.limits.mail(address, &body.value.email)?;
    let sent =
        shoppers::request_recovery(&app.store, app.mailer.as_deref(), &body.value.email).await?;
    Ok((StatusCode::ACCEPTED, Json(sent)))
}

/// `POST /api/shoppers/recovery/confirm`: the code and a new password; every old sign-in ends.
#[utoipa::path(
    post, path = "/api/shoppers/recovery/confirm", operation_id = "recover", tag = "shoppers",
    summary = "The recovery code and a new password (or none, to make a new passkey next): every earlier sign-in of the account ended, and signed in",
    request_body = Recovery,
    responses(
        (status = 200, description = "The new sign-in's token", body = checkout_shared::ShopperToken),
        (status = 400, description = "`invalid_code` (wrong, expired, used, out of tries) or `invalid_request` (a password under 8 characters)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn recover(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<Recovery>,
) -> Result<Json<ShopperToken>, OperationError> {
    let guess = app.limits.guess(address, &body.value.email)?;
    let shopper = shoppers::recover(
        &app.store,
        &body.value.email,
        &body.value.code,
        body.value.password.as_deref(),
    )
    .await?;
    app.limits.right(guess);
    Ok(token(shopper))
}

/// `POST /api/shoppers/sign-in`
#[utoipa::path(
    post, path = "/api/shoppers/sign-in", operation_id = "sign_in", tag = "shoppers",
    summary = "A live shopper signs in: a new token",
    request_body = ShopperCredentials,
    responses(
        (status = 200, description = "The token (expires when idle or old; revoked by sign-out)", body = checkout_shared::ShopperToken),
        (status = 401, description = "`invalid_credentials`: wrong e-mail or password (which, is not said)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`email_unconfirmed`: the right password of a shopper that never confirmed its e-mail (it signs up again, and enters the code)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: too many attempts at this account or from this address; see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn sign_in(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<ShopperCredentials>,
) -> Result<Json<ShopperToken>, OperationError> {
    let guess = app.limits.guess(address, &body.value.email)?;
    let shopper = shoppers::sign_in(&app.store, &body.value.email, &body.value.password).await?;
    app.limits.right(guess);
    Ok(token(shopper))
}

/// `POST /api/shoppers/sign-out`: the caller's sign-in ends («Выйти»).
#[utoipa::path(
    post, path = "/api/shoppers/sign-out", operation_id = "sign_out", tag = "shoppers",
    summary = "A live shopper signs out: the token stops working",
    responses(
        (status = 204, description = "Signed out"),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shopper_token" = []))
)]
pub async fn sign_out(
    State(app): State<AppState>,
    _principal: Principal,
    headers: HeaderMap,
) -> Result<StatusCode, OperationError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .map(|(_, token)| token.trim())
        .ok_or(OperationError::Unauthorized)?;
    shoppers::sign_out(&app.store, token).await?;
    Ok(StatusCode::NO_CONTENT)
}
