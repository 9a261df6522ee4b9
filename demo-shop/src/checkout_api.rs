//! The checkout's public API as the shop's server uses it: with its secret key, and with an
//! idempotency key of its own on every POST, resent unchanged until the checkout gives an
//! answer that settles it. A lost answer, a `5xx`, a timeout, or `409 idempotency_key_in_use`
//! never make the shop act twice: the same key gets the stored answer.

use std::path::PathBuf;
use std::sync::RwLock;
use std::time::Duration;

use checkout_shared::{
    CheckoutSession, CreateCheckoutSession, CreateRefund, ErrorCode, IDEMPOTENCY_KEY_HEADER,
    PaymentDetails, Problem, Refund,
};
use reqwest::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use url::Url;

/// One attempt may take this long before it counts as lost (and is resent with the same key).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of one call before the shop gives up for now (a later retry resends the same key).
const ATTEMPTS: u32 = 8;
const FIRST_DELAY: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_secs(2);

/// How a call ended without the answer the shop wanted.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The checkout answered with a refusal that settles the call (`4xx`).
    #[error("the checkout refused: {} ({})", .0.detail, .0.code.as_str())]
    Refused(Problem),
    /// No settling answer after every attempt; safe to try again later with the same key.
    #[error("the checkout did not answer: {0}")]
    Unavailable(String),
}

/// The shop's credentials, as `checkout-server shop add` prints them.
#[derive(Clone, Debug, Deserialize)]
pub struct Credentials {
    pub shop_id: String,
    pub secret_key: String,
    pub signing_secret: String,
}

impl Credentials {
    pub fn read(path: &PathBuf) -> Result<Credentials, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

pub struct CheckoutApi {
    base: Url,
    http: reqwest::Client,
    credentials_file: PathBuf,
    /// Re-read when the checkout says `401`: a demo checkout gives the demo shop a new key at
    /// every start, in the same file. `None` until the file exists: the shop may start before
    /// the checkout that writes it.
    credentials: RwLock<Option<Credentials>>,
}

impl CheckoutApi {
    pub fn new(base: Url, credentials_file: PathBuf) -> Result<CheckoutApi, String> {
        let credentials = if credentials_file.exists() {
            Some(Credentials::read(&credentials_file)?)
        } else {
            tracing::warn!(
                file = %credentials_file.display(),
                "no credentials yet: they are read when first needed"
            );
            None
        };
        let http = reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(CheckoutApi {
            base,
            http,
            credentials_file,
            credentials: RwLock::new(credentials),
        })
    }

    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The credentials in use, read from the file if there were none yet.
    pub fn credentials(&self) -> Option<Credentials> {
        if let Some(credentials) = self.credentials.read().expect("credentials lock").clone() {
            return Some(credentials);
        }
        let fresh = Credentials::read(&self.credentials_file).ok()?;
        *self.credentials.write().expect("credentials lock") = Some(fresh.clone());
        Some(fresh)
    }

    /// Opens the checkout session of an order; `key` is the order's own, so that every retry
    /// (here, or after a restart of the shop) names the same session.
    pub async fn create_session(
        &self,
        key: &str,
        session: &CreateCheckoutSession,
    ) -> Result<CheckoutSession, CallError> {
        self.call(Call::Post {
            path: "/api/checkout-sessions",
            key,
            body: serde_json::to_value(session).expect("a session serializes"),
        })
        .await
    }

    /// A session's public view: what the widget shows, and whether it was paid.
    pub async fn session(&self, session_id: &str) -> Result<CheckoutSession, CallError> {
        self.call(Call::Get {
            path: &format!("/api/checkout-sessions/{session_id}"),
        })
        .await
    }

    /// A payment to this shop, with its refunds.
    pub async fn payment(&self, payment_id: &str) -> Result<PaymentDetails, CallError> {
        self.call(Call::Get {
            path: &format!("/api/payments/{payment_id}"),
        })
        .await
    }

    pub async fn refund(
        &self,
        payment_id: &str,
        key: &str,
        amount: i64,
    ) -> Result<Refund, CallError> {
        self.call(Call::Post {
            path: &format!("/api/payments/{payment_id}/refunds"),
            key,
            body: serde_json::to_value(CreateRefund { amount }).expect("a refund serializes"),
        })
        .await
    }

    /// Sends `call` until it is settled: a `2xx` (its body), or a refusal that retrying cannot
    /// change. Everything else is resent, unchanged, after a growing pause with jitter.
    async fn call<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, CallError> {
        let mut last = String::new();
        let mut reloaded = false;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt)).await;
            }
            let url = self.base.join(call.path()).expect("a path on the checkout");
            let Some(Credentials {
                secret_key: secret, ..
            }) = self.credentials()
            else {
                last = format!("no credentials in {}", self.credentials_file.display());
                tracing::warn!(attempt, "{last}; waiting for them");
                continue;
            };
            let request = match &call {
                Call::Get { .. } => self.http.get(url),
                Call::Post { key, body, .. } => self
                    .http
                    .post(url)
                    .header(IDEMPOTENCY_KEY_HEADER, *key)
                    .json(body),
            }
            .bearer_auth(secret);
            let response = match request.send().await {
                Ok(response) => response,
                Err(error) => {
                    last = format!("{} {}: {error}", call.method(), call.path());
                    tracing::warn!(attempt, "{last}; resending");
                    continue;
                }
            };
            let status = response.status();
            let body = match response.bytes().await {
                Ok(body) => body,
                Err(error) => {
                    last = format!("{} {}: answer cut: {error}", call.method(), call.path());
                    tracing::warn!(attempt, "{last}; resending");
                    continue;
                }
            };
            if status.is_success() {
                return serde_json::from_slice(&body).map_err(|e| {
                    CallError::Unavailable(format!("{}: unexpected answer: {e}", call.path()))
                });
            }
            let problem: Option<Problem> = serde_json::from_slice(&body).ok();
            let code = problem.as_ref().map(|p| p.code);
            if status == StatusCode::UNAUTHORIZED && !reloaded {
                reloaded = true;
                if self.reread_credentials().is_some() {
                    continue;
                }
            }
            if worth_resending(status, code) {
                last = format!("{} {}: {status}", call.method(), call.path());
                tracing::warn!(attempt, "{last}; resending");
                continue;
            }
            return Err(match problem {
                Some(problem) => CallError::Refused(problem),
                None => CallError::Unavailable(format!("{}: {status}", call.path())),
            });
        }
        Err(CallError::Unavailable(last))
    }

    /// The credentials as the file holds them now, if they differ from those in use (which
    /// they then replace).
    pub fn reread_credentials(&self) -> Option<Credentials> {
        let fresh = Credentials::read(&self.credentials_file).ok()?;
        let mut current = self.credentials.write().expect("credentials lock");
        let changed = current.as_ref().is_none_or(|c| {
            c.secret_key != fresh.secret_key || c.signing_secret != fresh.signing_secret
        });
        *current = Some(fresh.clone());
        changed.then_some(fresh)
    }
}

enum Call<'a> {
    Get {
        path: &'a str,
    },
    Post {
        path: &'a str,
        key: &'a str,
        body: serde_json::Value,
    },
}

impl Call<'_> {
    fn path(&self) -> &str {
        match self {
            Call::Get { path } | Call::Post { path, .. } => path,
        }
    }

    fn method(&self) -> &'static str {
        match self {
            Call::Get { .. } => "GET",
            Call::Post { .. } => "POST",
        }
    }
}

/// Answers that say nothing final: the same request, resent, may settle it.
fn worth_resending(status: StatusCode, code: Option<ErrorCode>) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::CONFLICT && code == Some(ErrorCode::IdempotencyKeyInUse))
}

/// Capped exponential backoff with jitter: up to half the pause again, at random, so that
/// retries of many calls do not arrive together.
fn backoff(attempt: u32) -> Duration {
    let base = FIRST_DELAY
        .saturating_mul(1 << attempt.min(10))
        .min(MAX_DELAY);
    let random = uuid::Uuid::new_v4().as_u128() as u64 % 1000;
    base + base.mul_f64(random as f64 / 2000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resends_only_what_a_resend_can_settle() {
        assert!(worth_resending(StatusCode::SERVICE_UNAVAILABLE, None));
        assert!(worth_resending(
            StatusCode::CONFLICT,
            Some(ErrorCode::IdempotencyKeyInUse)
        ));
        assert!(!worth_resending(
            StatusCode::CONFLICT,
            Some(ErrorCode::SessionAlreadyPaid)
        ));
        assert!(!worth_resending(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(ErrorCode::IdempotencyKeyReused)
        ));
        assert!(!worth_resending(StatusCode::PAYMENT_REQUIRED, None));
    }

    #[test]
    fn pauses_grow_and_stay_capped() {
        assert!(backoff(1) >= Duration::from_millis(200));
        assert!(backoff(1) <= Duration::from_millis(300));
        assert!(backoff(20) <= MAX_DELAY.mul_f64(1.5));
    }
}
