//! The HTTP calls, with types from `checkout-shared`. Keyed POSTs never fail: every way they
//! can end is an [`Attempt`] for the intent to judge. Other calls fail with a [`Failure`] the
//! widget can act on (a dead session is renewed; anything else is retried or reported).

use std::time::Duration;

use checkout_shared::{
    Account, CheckoutSession, DemoCart, DemoSession, IDEMPOTENCY_KEY_EXPIRES_HEADER,
    IDEMPOTENCY_KEY_HEADER, KeyState, KeyStatus, PaymentDetails,
};
use futures::future::{Either, select};
use gloo_net::http::{Request, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::intent::{Attempt, Lookup};

/// How long one attempt may take before it counts as lost and is resent.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a call that is not a keyed POST did not give its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// `401`: the session is unknown to the server.
    Unauthorized,
    /// `404`.
    NotFound,
    /// No answer, or a `5xx`: worth trying again.
    Unavailable,
}

pub async fn demo_session() -> Result<DemoSession, Failure> {
    fetch_json(Request::post("/api/demo/session")).await
}

/// The demo shop's cart `cart` as a checkout session, made by the server (the page names a
/// cart, never an amount).
pub async fn demo_checkout_session(cart: u32) -> Result<CheckoutSession, Failure> {
    let request = Request::post("/api/demo/checkout-session")
        .json(&DemoCart { cart })
        .map_err(|_| Failure::Unavailable)?;
    json_of(request.send().await).await
}

/// A checkout session's public view: what the shop asks to be paid.
pub async fn checkout_session(session_id: &str) -> Result<CheckoutSession, Failure> {
    let path = format!(
        "/api/checkout-sessions/{}",
        js_sys::encode_uri_component(session_id)
    );
    fetch_json(Request::get(&path)).await
}

pub async fn account(token: &str) -> Result<Account, Failure> {
    fetch_json(Request::get("/api/account").header("Authorization", &bearer(token))).await
}

pub async fn payment(token: &str, payment_id: &str) -> Result<PaymentDetails, Failure> {
    let path = format!("/api/payments/{}", js_sys::encode_uri_component(payment_id));
    fetch_json(Request::get(&path).header("Authorization", &bearer(token))).await
}

/// What the server says of one of this shopper's keys.
pub async fn key_status(token: &str, key: &str) -> Result<Lookup, Failure> {
    let path = format!(
        "/api/idempotency-keys/{}",
        js_sys::encode_uri_component(key)
    );
    let status: KeyStatus =
        match fetch_json(Request::get(&path).header("Authorization", &bearer(token))).await {
            Ok(status) => status,
            Err(Failure::NotFound) => return Ok(Lookup::Unknown),
            Err(failure) => return Err(failure),
        };
    Ok(
        match (status.status, status.response_status, status.response) {
            (KeyState::Done, Some(status), Some(body)) => Lookup::Done {
                status,
                body: body.to_string(),
            },
            _ => Lookup::InProgress,
        },
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// An unkeyed call that either answers `2xx` with `T` or fails.
async fn fetch_json<T: DeserializeOwned>(
    request: gloo_net::http::RequestBuilder,
) -> Result<T, Failure> {
    json_of(request.send().await).await
}

/// What an unkeyed call's answer says: `2xx` with `T`, or why not.
async fn json_of<T: DeserializeOwned>(
    sent: Result<Response, gloo_net::Error>,
) -> Result<T, Failure> {
    let response = sent.map_err(|_| Failure::Unavailable)?;
    match response.status() {
        200..=299 => response.json().await.map_err(|_| Failure::Unavailable),
        401 => Err(Failure::Unauthorized),
        404 => Err(Failure::NotFound),
        _ => Err(Failure::Unavailable),
    }
}

pub async fn post_keyed(path: &str, token: &str, key: &str, body: &impl Serialize) -> Attempt {
    let Ok(request) = Request::post(path)
        .header("Authorization", &bearer(token))
        .header(IDEMPOTENCY_KEY_HEADER, key)
        .json(body)
    else {
        return Attempt::NetworkError;
    };
    let exchange = Box::pin(async move {
        let response = request.send().await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let expires_in = expires_in(&response);
        let body = response.text().await?;
        Ok::<_, gloo_net::Error>(Attempt::Answered {
            status,
            body,
            retry_after,
            expires_in,
        })
    });
    match select(exchange, gloo_timers::future::sleep(ATTEMPT_TIMEOUT)).await {
        Either::Left((Ok(answer), _)) => answer,
        Either::Left((Err(_), _)) => Attempt::NetworkError,
        Either::Right(_) => Attempt::TimedOut,
    }
}

/// How much longer the server keeps the key: `Idempotency-Key-Expires` − `Date`, both the
/// server's clock, so that the browser's own clock may be off by any amount.
fn expires_in(response: &Response) -> Option<Duration> {
    let headers = response.headers();
    let expires = js_sys::Date::parse(&headers.get(IDEMPOTENCY_KEY_EXPIRES_HEADER)?);
    let now = js_sys::Date::parse(&headers.get("date")?);
    let left = expires - now;
    (left.is_finite() && left >= 0.0).then(|| Duration::from_millis(left as u64))
}
