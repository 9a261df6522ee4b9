//! The HTTP calls, with types from `checkout-shared`. Keyed POSTs never fail: every way they
//! can end is an [`Attempt`] for the intent to judge. Other calls fail with a [`Failure`] the
//! widget can act on (a dead session is renewed; anything else is retried or reported).

use std::time::Duration;

use checkout_shared::{
    Account, CheckoutSession, IDEMPOTENCY_KEY_EXPIRES_HEADER, IDEMPOTENCY_KEY_HEADER, KeyState,
    Payment, PaymentDetails, PaymentStatus, Refund, ShopperToken,
};
use futures::future::{Either, select};
use serde::de::DeserializeOwned;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, RequestInit, Response};

use crate::intent::{Attempt, Lookup};
use crate::json::{self, Node};

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

/// A fresh test shopper (test money: pays test sessions only): the one the payment page asked
/// for while this code was still on its way (`index.html`), the first time; else a new call.
pub async fn test_shopper() -> Result<ShopperToken, Failure> {
    let text = match asked_early(EARLY_TEST_SHOPPER) {
        Some(answer) => answer.await.ok_or(Failure::Unavailable)?,
        None => fetch_text(Call::new("POST", "/api/test/shoppers".into())).await?,
    };
    parsed(&text)
}

/// Where the payment page's own script leaves the request for a test shopper it sent before
/// the widget's code arrived: a `Promise` of a `2xx` answer's body, read by the page too
/// (read here, the body would come in a task of its own, behind the widget's first render:
/// tens of milliseconds more to an enabled «Оплатить» on a slow machine).
const EARLY_TEST_SHOPPER: &str = "checkoutTestShopper";

/// The answer's body the page left under `name`, taken once (a later call sends its own).
fn asked_early(name: &str) -> Option<impl Future<Output = Option<String>>> {
    let window = web_sys::window()?;
    let name = JsValue::from_str(name);
    let promise: js_sys::Promise = js_sys::Reflect::get(&window, &name).ok()?.dyn_into().ok()?;
    let _ = js_sys::Reflect::delete_property(&window, &name);
    Some(async move { JsFuture::from(promise).await.ok()?.as_string() })
}

/// A checkout session's public view: what the shop asks to be paid.
pub async fn checkout_session(session_id: &str) -> Result<CheckoutSession, Failure> {
    let path = format!(
        "/api/checkout-sessions/{}",
        js_sys::encode_uri_component(session_id)
    );
    fetch_json(Call::new("GET", path)).await
}

pub async fn account(token: &str) -> Result<Account, Failure> {
    fetch_json(Call::new("GET", "/api/account".into()).token(token)).await
}

pub async fn payment(token: &str, payment_id: &str) -> Result<PaymentDetails, Failure> {
    let path = format!("/api/payments/{}", js_sys::encode_uri_component(payment_id));
    let wire: PaymentDetailsWire = fetch_json(Call::new("GET", path).token(token)).await?;
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
            // The widget knows the mode from the session; the wire's is not read.
            livemode: false,
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
    let found = match fetch_text(Call::new("GET", path).token(token)).await {
        Ok(text) => json::parse(&text).ok_or(Failure::Unavailable)?,
        Err(Failure::NotFound) => return Ok(Lookup::Unknown),
        Err(failure) => return Err(failure),
    };
    let status: KeyStatusWire = found.decode().ok_or(Failure::Unavailable)?;
    // The stored answer is judged from its text, like any answer.
    let body = found
        .field("response")
        .filter(|r| !r.is_null())
        .and_then(|r| js_sys::JSON::stringify(&r).ok()?.as_string());
    Ok(match (status.status, status.response_status, body) {
        (KeyState::Done, Some(status), Some(body)) => Lookup::Done { status, body },
        _ => Lookup::InProgress,
    })
}

/// [`checkout_shared::KeyStatus`] as the widget reads it; the stored answer (`response`) is
/// taken from the parsed value as it is.
#[derive(serde::Deserialize)]
struct KeyStatusWire {
    status: KeyState,
    #[serde(default)]
    response_status: Option<u16>,
}

/// One call to the checkout server, by the browser's own `fetch` (no HTTP library: the widget
/// needs a method, three headers and a text body, and every byte of code is the shopper's to
/// download).
struct Call {
    method: &'static str,
    /// On the page's own origin: the payment page is the checkout's (under `trunk serve`, the
    /// dev server proxies `/api`).
    path: String,
    token: Option<String>,
    key: Option<String>,
    body: Option<String>,
}

impl Call {
    fn new(method: &'static str, path: String) -> Call {
        Call {
            method,
            path,
            token: None,
            key: None,
            body: None,
        }
    }

    fn token(mut self, token: &str) -> Call {
        self.token = Some(token.to_owned());
        self
    }

    /// A JSON body.
    fn body(mut self, body: String) -> Call {
        self.body = Some(body);
        self
    }

    /// The answer's head (its body is read with [`text`]); `Err` when nothing came back.
    async fn send(self) -> Result<Response, JsValue> {
        let headers = Headers::new()?;
        if let Some(token) = &self.token {
            headers.set("Authorization", &format!("Bearer {token}"))?;
        }
        if let Some(key) = &self.key {
            headers.set(IDEMPOTENCY_KEY_HEADER, key)?;
        }
        let init = RequestInit::new();
        init.set_method(self.method);
        if let Some(body) = &self.body {
            headers.set("Content-Type", "application/json")?;
            init.set_body(&JsValue::from_str(body));
        }
        init.set_headers(&headers);
        let window = web_sys::window().ok_or(JsValue::NULL)?;
        let answer = JsFuture::from(window.fetch_with_str_and_init(&self.path, &init)).await?;
        answer.dyn_into()
    }
}

/// The whole body of an answer, as text.
async fn text(response: &Response) -> Result<String, JsValue> {
    JsFuture::from(response.text()?)
        .await?
        .as_string()
        .ok_or(JsValue::NULL)
}

/// An unkeyed call that either answers `2xx` with `T` or fails.
async fn fetch_json<T: DeserializeOwned>(call: Call) -> Result<T, Failure> {
    parsed(&fetch_text(call).await?)
}

/// A `2xx` body as `T` (anything else: the answer is unusable, as no answer is).
fn parsed<T: DeserializeOwned>(text: &str) -> Result<T, Failure> {
    json::from_str(text).ok_or(Failure::Unavailable)
}

/// An unkeyed call's `2xx` body, or why there is none.
async fn fetch_text(call: Call) -> Result<String, Failure> {
    answer_text(call.send().await).await
}

/// An answer's `2xx` body, or why there is none.
async fn answer_text(answer: Result<Response, JsValue>) -> Result<String, Failure> {
    let response = answer.map_err(|_| Failure::Unavailable)?;
    match response.status() {
        200..=299 => text(&response).await.map_err(|_| Failure::Unavailable),
        401 => Err(Failure::Unauthorized),
        404 => Err(Failure::NotFound),
        _ => Err(Failure::Unavailable),
    }
}

/// `body` is JSON text.
pub async fn post_keyed(path: &str, token: &str, key: &str, body: &str) -> Attempt {
    let mut call = Call::new("POST", path.to_owned())
        .token(token)
        .body(body.to_owned());
    call.key = Some(key.to_owned());
    let exchange = Box::pin(async move {
        let response = call.send().await?;
        let headers = response.headers();
        let retry_after = headers
            .get("retry-after")
            .ok()
            .flatten()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let expires_in = expires_in(&headers);
        let body = text(&response).await?;
        Ok::<_, JsValue>(Attempt::Answered {
            status: response.status(),
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
fn expires_in(headers: &Headers) -> Option<Duration> {
    let expires = js_sys::Date::parse(&headers.get(IDEMPOTENCY_KEY_EXPIRES_HEADER).ok()??);
    let now = js_sys::Date::parse(&headers.get("date").ok()??);
    let left = expires - now;
    (left.is_finite() && left >= 0.0).then(|| Duration::from_millis(left as u64))
}

/// A POST whose every answer the caller reads (the account window says each refusal in its own
/// words): its status and body; `Err` when nothing came back.
pub async fn post_json(
    path: &str,
    token: Option<&str>,
    body: String,
) -> Result<(u16, String), Failure> {
    let mut call = Call::new("POST", path.to_owned()).body(body);
    if let Some(token) = token {
        call = call.token(token);
    }
    let response = call.send().await.map_err(|_| Failure::Unavailable)?;
    let body = text(&response).await.map_err(|_| Failure::Unavailable)?;
    Ok((response.status(), body))
}

/// Ends this sign-in on the server (an answer, or none, changes nothing here: the page forgets
/// the token either way).
pub async fn sign_out(token: &str) {
    let _ = Call::new("POST", "/api/shoppers/sign-out".into())
        .token(token)
        .send()
        .await;
}

/// A `2xx` body, or what the refusal means to the shopper, in Russian (by the problem's stable
/// `code`).
pub fn said(answer: Result<(u16, String), Failure>) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct ProblemCode {
        code: checkout_shared::ErrorCode,
    }
    match answer {
        Ok((200..=299, text)) => Ok(text),
        Ok((status, text)) => Err(match json::from_str::<ProblemCode>(&text) {
            Some(problem) => crate::messages::account_refusal(problem.code).to_owned(),
            None => crate::messages::status_refusal(status),
        }),
        Err(_) => Err(crate::messages::ACCOUNT_NO_CONNECTION.to_owned()),
    }
}
