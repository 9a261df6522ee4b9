//! Shoppers' endpoints: `POST /api/test/shoppers` (a test shopper: anyone, always, limited per
//! address); a live shopper's `POST /api/shoppers` (sign-up), `POST /api/shoppers/sign-in` and
//! `POST /api/shoppers/sign-out`. Called only by the payment page, on the checkout's origin.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use checkout_shared::{ShopperCredentials, ShopperToken};

use crate::api::AppState;
use crate::api::extract::JsonBody;
use crate::operations::accounts::Principal;
use crate::operations::error::ApiError;
use crate::operations::shoppers::{self, SignedIn};

/// The client's address as this server sees it (behind a proxy: the proxy's; see the README).
pub struct ClientAddress(pub IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientAddress {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, ApiError> {
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
) -> Result<(StatusCode, Json<ShopperToken>), ApiError> {
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
) -> Result<Json<ShopperToken>, ApiError> {
    create_test_shopper(State(app), address)
        .await
        .map(|(_, body)| body)
}

/// `POST /api/shoppers`: a live shopper signs up (and is signed in).
#[utoipa::path(
    post, path = "/api/shoppers", operation_id = "sign_up", tag = "shoppers",
    summary = "A live shopper signs up with an e-mail and a password (then is signed in)",
    request_body = ShopperCredentials,
    responses(
        (status = 201, description = "Signed in: the token (expires; revoked by sign-out)", body = checkout_shared::ShopperToken),
        (status = 400, description = "`invalid_request`: not an e-mail, or a password under 8 characters", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`email_taken`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn sign_up(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<ShopperCredentials>,
) -> Result<(StatusCode, Json<ShopperToken>), ApiError> {
    app.limits.sign_in(address, &body.value.email)?;
    let shopper = shoppers::sign_up(&app.store, &body.value.email, &body.value.password).await?;
    Ok((StatusCode::CREATED, token(shopper)))
}

/// `POST /api/shoppers/sign-in`
#[utoipa::path(
    post, path = "/api/shoppers/sign-in", operation_id = "sign_in", tag = "shoppers",
    summary = "A live shopper signs in: a new token",
    request_body = ShopperCredentials,
    responses(
        (status = 200, description = "The token (expires when idle or old; revoked by sign-out)", body = checkout_shared::ShopperToken),
        (status = 401, description = "`invalid_credentials`: wrong e-mail or password (which, is not said)", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_requests`: too many attempts at this account or from this address; see `Retry-After`", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn sign_in(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    body: JsonBody<ShopperCredentials>,
) -> Result<Json<ShopperToken>, ApiError> {
    app.limits.sign_in(address, &body.value.email)?;
    let shopper = shoppers::sign_in(&app.store, &body.value.email, &body.value.password).await?;
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
) -> Result<StatusCode, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .map(|(_, token)| token.trim())
        .ok_or(ApiError::Unauthorized)?;
    shoppers::sign_out(&app.store, token).await?;
    Ok(StatusCode::NO_CONTENT)
}
