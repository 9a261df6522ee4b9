//! The HTTP calls, with types from `checkout-shared`. Keyed POSTs never fail: every way they
//! can end is an [`Attempt`] for the intent to judge. Other calls fail with a [`Failure`] the
//! widget can act on (a dead session is renewed; anything else is retried or reported).

use std::time::Duration;

use checkout_shared::{
    Account, CheckoutSession, DemoCart, DemoSession, IDEMPOTENCY_KEY_EXPIRES_HEADER,
    IDEMPOTENCY_KEY_HEADER, KeyState, Payment, PaymentDetails, PaymentStatus, Refund,
};
use futures::future::{Either, select};
use gloo_net::http::{Request, Response};
use serde::de::DeserializeOwned;

use crate::intent::{Attempt, Lookup};
use crate::json;

#[wasm_bindgen::prelude::wasm_bindgen(
    inline_js = "export function widget_origin() { return new URL(import.meta.url).origin; }"
)]
extern "C" {
    /// The origin the widget's own script came from: the checkout server, whatever page the
    /// widget was put into (or, under `trunk serve`, the dev server that proxies `/api`).
    fn widget_origin() -> String;
}

/// `path` on the checkout server.
fn url(path: &str) -> String {
    thread_local! {
        static ORIGIN: String = widget_origin();
    }
    ORIGIN.with(|origin| format!("{origin}{path}"))
}

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
    fetch_json(Request::post(&url("/api/demo/session"))).await
}

/// The demo shop's cart `cart` as a checkout session, made by the server (the page names a
/// cart, never an amount).
pub async fn demo_checkout_session(cart: u32) -> Result<CheckoutSession, Failure> {
    let request = Request::post(&url("/api/demo/checkout-session"))
        .header("Content-Type", "application/json")
        .body(json::to_string(&DemoCart { cart }).unwrap_or_default())
        .map_err(|_| Failure::Unavailable)?;
    json_of(request.send().await).await
}

/// A checkout session's public view: what the shop asks to be paid.
pub async fn checkout_session(session_id: &str) -> Result<CheckoutSession, Failure> {
    let path = format!(
        "/api/checkout-sessions/{}",
        js_sys::encode_uri_component(session_id)
    );
    fetch_json(Request::get(&url(&path))).await
}

pub async fn account(token: &str) -> Result<Account, Failure> {
    fetch_json(Request::get(&url("/api/account")).header("Authorization", &bearer(token))).await
}

pub async fn payment(token: &str, payment_id: &str) -> Result<PaymentDetails, Failure> {
    let path = format!("/api/payments/{}", js_sys::encode_uri_component(payment_id));
    let wire: PaymentDetailsWire =
        fetch_json(Request::get(&url(&path)).header("Authorization", &bearer(token))).await?;
    Ok(PaymentDetails {
        payment: Payment {
            payment_id: wire.payment_id,
            checkout_session_id: wire.checkout_session_id,
            order_id: wire.order_id,
            amount: wire.amount,
            currency: wire.currency,
            status: wire.status,
            balance: wire.balance,
            created_at: wire.created_at,
        },
        refunded_total: wire.refunded_total,
        refunds: wire.refunds,
    })
}

/// [`PaymentDetails`] as the wire has it, read field by field: its `#[serde(flatten)]` makes
/// serde buffer every field first, which cost the widget tens of kilobytes of code.
#[derive(serde::Deserialize)]
struct PaymentDetailsWire {
    payment_id: String,
    #[serde(default)]
    checkout_session_id: Option<String>,
    order_id: String,
    amount: i64,
    currency: String,
    status: PaymentStatus,
    #[serde(default)]
    balance: Option<i64>,
    created_at: String,
    refunded_total: i64,
    refunds: Vec<Refund>,
}

/// What the server says of one of this shopper's keys.
pub async fn key_status(token: &str, key: &str) -> Result<Lookup, Failure> {
    let path = format!(
        "/api/idempotency-keys/{}",
        js_sys::encode_uri_component(key)
    );
    let status: KeyStatusWire =
        match fetch_json(Request::get(&url(&path)).header("Authorization", &bearer(token))).await {
            Ok(status) => status,
            Err(Failure::NotFound) => return Ok(Lookup::Unknown),
            Err(failure) => return Err(failure),
        };
    Ok(
        match (
            status.status,
            status.response_status,
            stored_body(&status.response),
        ) {
            (KeyState::Done, Some(status), Some(body)) => Lookup::Done { status, body },
            _ => Lookup::InProgress,
        },
    )
}

/// [`checkout_shared::KeyStatus`] as the widget reads it: the stored answer kept as the browser
/// parsed it, to be judged from its text like any answer.
#[derive(serde::Deserialize)]
struct KeyStatusWire {
    status: KeyState,
    #[serde(default)]
    response_status: Option<u16>,
    #[serde(default, with = "serde_wasm_bindgen::preserve")]
    response: wasm_bindgen::JsValue,
}

fn stored_body(response: &wasm_bindgen::JsValue) -> Option<String> {
    if response.is_undefined() || response.is_null() {
        return None;
    }
    js_sys::JSON::stringify(response).ok()?.as_string()
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
        200..=299 => {
            let text = response.text().await.map_err(|_| Failure::Unavailable)?;
            json::from_str(&text).ok_or(Failure::Unavailable)
        }
        401 => Err(Failure::Unauthorized),
        404 => Err(Failure::NotFound),
        _ => Err(Failure::Unavailable),
    }
}

/// `body` is JSON text.
pub async fn post_keyed(path: &str, token: &str, key: &str, body: &str) -> Attempt {
    let Ok(request) = Request::post(&url(path))
        .header("Authorization", &bearer(token))
        .header(IDEMPOTENCY_KEY_HEADER, key)
        .header("Content-Type", "application/json")
        .body(body)
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
