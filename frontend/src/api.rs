//! The HTTP calls, with types from `checkout-shared`. Keyed POSTs never fail: every way they
//! can end is an [`Attempt`] for the intent to judge.

use std::time::Duration;

use checkout_shared::{Account, DemoSession, IDEMPOTENCY_KEY_HEADER};
use futures::future::{Either, select};
use gloo_net::http::Request;
use serde::Serialize;

use crate::intent::Attempt;

/// How long one attempt may take before it counts as lost and is resent.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

pub async fn demo_session() -> Result<DemoSession, String> {
    fetch_json(Request::post("/api/demo/session")).await
}

pub async fn account(token: &str) -> Result<Account, String> {
    fetch_json(Request::get("/api/account").header("Authorization", &format!("Bearer {token}")))
        .await
}

/// An unkeyed call that either answers `2xx` with `T` or fails with a message.
async fn fetch_json<T: serde::de::DeserializeOwned>(
    request: gloo_net::http::RequestBuilder,
) -> Result<T, String> {
    let response = request.send().await.map_err(|e| e.to_string())?;
    if !response.ok() {
        return Err(format!("сервер ответил {}", response.status()));
    }
    response.json().await.map_err(|e| e.to_string())
}

pub async fn post_keyed(path: &str, token: &str, key: &str, body: &impl Serialize) -> Attempt {
    let Ok(request) = Request::post(path)
        .header("Authorization", &format!("Bearer {token}"))
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
        let body = response.text().await?;
        Ok::<_, gloo_net::Error>(Attempt::Answered {
            status,
            body,
            retry_after,
        })
    });
    match select(exchange, gloo_timers::future::sleep(ATTEMPT_TIMEOUT)).await {
        Either::Left((Ok(answer), _)) => answer,
        Either::Left((Err(_), _)) => Attempt::NetworkError,
        Either::Right(_) => Attempt::TimedOut,
    }
}
