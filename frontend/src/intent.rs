//! The client half of the idempotency protocol, in plain Rust with no browser in sight.
//!
//! One intent = one request the shopper means to make once (a payment of one order, or one
//! refund) and one key made for it. An intent moves through
//! `created → sending → retrying(n) → succeeded | declined | failed`, resending the same key
//! and body on every retry. The widget persists intents, so a refresh resumes the same one.

use std::time::Duration;

use checkout_shared::{ErrorCode, Problem};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What one attempt to send an intent brought back.
#[derive(Clone, Debug, PartialEq)]
pub enum Attempt {
    /// The server answered (whatever it said).
    Answered {
        status: u16,
        body: String,
        retry_after: Option<Duration>,
    },
    /// The connection failed or was cut: the request may or may not have been executed.
    NetworkError,
    /// No answer in time: likewise unknown.
    TimedOut,
}

/// Why an intent is being sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryReason {
    /// No answer: network error, timeout, or the page was reloaded mid-flight.
    ConnectionLost,
    /// `5xx` (or `408`, `429`): the server failed before committing anything.
    ServerError,
    /// `409 idempotency_key_in_use`: the first copy is still executing on the server.
    InProgress,
}

/// Where an intent stands. Persisted as JSON in `sessionStorage`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase<Receipt> {
    Created,
    /// Attempt `attempt` is on its way; `after` says why, when it is a resend.
    Sending {
        attempt: u32,
        after: Option<RetryReason>,
    },
    /// Attempt `attempt` got no definite answer; the next one follows after a backoff.
    Retrying {
        attempt: u32,
        reason: RetryReason,
    },
    Succeeded {
        receipt: Receipt,
    },
    /// A definite refusal that is the outcome of this intent (stored by the server, so
    /// resending gives the same): `402`, `409 order_already_paid`, `409 refund_exceeds_payment`.
    Declined {
        problem: Problem,
    },
    /// No outcome. `retryable`: we gave up resending, but the outcome is unknown, so the same
    /// key may be sent again (and is, on the next page load). Otherwise the request itself
    /// was refused (`400`, `401`, `422`, …) and resending cannot help.
    Failed {
        message: String,
        retryable: bool,
    },
}

/// The verdict on one attempt, before it is applied to an intent.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict<Receipt> {
    Success(Receipt),
    Decline(Problem),
    Retry {
        reason: RetryReason,
        retry_after: Option<Duration>,
    },
    Refused(String),
}

/// Which answers retry and which never do.
pub fn judge<Receipt: DeserializeOwned>(attempt: &Attempt) -> Verdict<Receipt> {
    let (status, body, retry_after) = match attempt {
        Attempt::NetworkError | Attempt::TimedOut => {
            return Verdict::Retry {
                reason: RetryReason::ConnectionLost,
                retry_after: None,
            };
        }
        Attempt::Answered {
            status,
            body,
            retry_after,
        } => (*status, body, *retry_after),
    };
    let problem: Option<Problem> = serde_json::from_str(body).ok();
    let code = problem.as_ref().map(|p| p.code);
    match status {
        200..=299 => match serde_json::from_str(body) {
            Ok(receipt) => Verdict::Success(receipt),
            Err(_) => Verdict::Refused("сервер прислал непонятный ответ".into()),
        },
        409 if code == Some(ErrorCode::IdempotencyKeyInUse) => Verdict::Retry {
            reason: RetryReason::InProgress,
            retry_after,
        },
        402 | 409 if problem.is_some() => Verdict::Decline(problem.expect("checked")),
        408 | 429 | 500..=599 => Verdict::Retry {
            reason: RetryReason::ServerError,
            retry_after,
        },
        _ => Verdict::Refused(match problem {
            Some(p) => p.detail,
            None => format!("ошибка {status}"),
        }),
    }
}

/// Capped exponential backoff with full jitter: after the n-th failed attempt wait a uniformly
/// random time in `[0, min(cap, base · 2^(n-1))]`, but never less than a `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts in one round before the intent shows as failed (and may be retried by hand).
    pub max_attempts: u32,
}

impl RetryPolicy {
    pub const WIDGET: RetryPolicy = RetryPolicy {
        base: Duration::from_millis(300),
        cap: Duration::from_secs(8),
        max_attempts: 12,
    };

    /// `unit_random` is uniform in `[0, 1)`.
    pub fn delay(
        &self,
        failed_attempt: u32,
        unit_random: f64,
        retry_after: Option<Duration>,
    ) -> Duration {
        let exponent = failed_attempt.saturating_sub(1).min(20);
        let ceiling = self.base.saturating_mul(1 << exponent).min(self.cap);
        let jittered = ceiling.mul_f64(unit_random.clamp(0.0, 1.0));
        jittered.max(retry_after.unwrap_or_default().min(self.cap))
    }
}

/// One request meant to take effect once, with its key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intent<Request, Receipt> {
    /// Made by the client (UUID v4) when the intent is created, never changed afterwards.
    pub key: String,
    pub request: Request,
    pub phase: Phase<Receipt>,
}

impl<Request, Receipt: DeserializeOwned> Intent<Request, Receipt> {
    pub fn new(key: String, request: Request) -> Self {
        Intent {
            key,
            request,
            phase: Phase::Created,
        }
    }

    /// Whether the outcome is still unknown, so the intent must be (re)sent to learn it.
    pub fn is_pending(&self) -> bool {
        match &self.phase {
            Phase::Created | Phase::Sending { .. } | Phase::Retrying { .. } => true,
            Phase::Failed { retryable, .. } => *retryable,
            Phase::Succeeded { .. } | Phase::Declined { .. } => false,
        }
    }

    /// Whether a request is on its way or about to be resent: the pay button is disabled.
    pub fn is_in_flight(&self) -> bool {
        matches!(self.phase, Phase::Sending { .. } | Phase::Retrying { .. })
    }

    /// After a page load: a send that was in flight lost its answer with the old page.
    pub fn resume_after_reload(&mut self) {
        if let Phase::Sending { attempt, .. } = self.phase {
            self.phase = Phase::Retrying {
                attempt,
                reason: RetryReason::ConnectionLost,
            };
        }
    }

    /// Begins an attempt and returns its number, or `None` if one is already on its way or the
    /// outcome is known: a second click, or a second driver, sends nothing.
    pub fn start_attempt(&mut self) -> Option<u32> {
        let (attempt, after) = match &self.phase {
            Phase::Created => (1, None),
            Phase::Retrying { attempt, reason } => (attempt + 1, Some(*reason)),
            // A new round, by hand or on reload: the outcome is still unknown.
            Phase::Failed {
                retryable: true, ..
            } => (1, Some(RetryReason::ConnectionLost)),
            Phase::Sending { .. } | Phase::Succeeded { .. } | Phase::Declined { .. } => {
                return None;
            }
            Phase::Failed {
                retryable: false, ..
            } => return None,
        };
        self.phase = Phase::Sending { attempt, after };
        Some(attempt)
    }

    /// Applies an attempt's result. Returns how long to wait before the next attempt, or
    /// `None` when there is nothing more to send (an outcome, or this round gave up).
    pub fn finish_attempt(
        &mut self,
        attempt: &Attempt,
        policy: &RetryPolicy,
        unit_random: f64,
    ) -> Option<Duration> {
        let Phase::Sending {
            attempt: number, ..
        } = self.phase
        else {
            return None; // not ours: another driver already settled this intent
        };
        match judge(attempt) {
            Verdict::Success(receipt) => self.phase = Phase::Succeeded { receipt },
            Verdict::Decline(problem) => self.phase = Phase::Declined { problem },
            Verdict::Refused(message) => {
                self.phase = Phase::Failed {
                    message,
                    retryable: false,
                }
            }
            Verdict::Retry { reason, .. } if number >= policy.max_attempts => {
                let message = match reason {
                    RetryReason::InProgress => "сервер всё ещё проводит платёж",
                    _ => "нет связи с сервером",
                };
                self.phase = Phase::Failed {
                    message: message.into(),
                    retryable: true,
                };
            }
            Verdict::Retry {
                reason,
                retry_after,
            } => {
                self.phase = Phase::Retrying {
                    attempt: number,
                    reason,
                };
                return Some(policy.delay(number, unit_random, retry_after));
            }
        }
        None
    }
}

/// A key for a new intent: a UUID v4 from 16 random bytes.
pub fn new_key(random: [u8; 16]) -> String {
    uuid::Builder::from_random_bytes(random)
        .into_uuid()
        .hyphenated()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkout_shared::{Payment, PaymentStatus};

    type PaymentIntent = Intent<String, Payment>;

    fn receipt() -> Payment {
        Payment {
            payment_id: "pay_1".into(),
            order_id: "ORD-1".into(),
            amount: 45_000,
            currency: "RUB".into(),
            status: PaymentStatus::Succeeded,
            balance: 55_000,
            created_at: "2026-12-02T10:00:00Z".into(),
        }
    }

    fn answer(status: u16, body: String) -> Attempt {
        Attempt::Answered {
            status,
            body,
            retry_after: None,
        }
    }

    fn problem(status: u16, code: ErrorCode) -> String {
        serde_json::to_string(&Problem::new(status, code, "detail")).unwrap()
    }

    const POLICY: RetryPolicy = RetryPolicy {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(2),
        max_attempts: 4,
    };

    #[test]
    fn a_lost_answer_is_resent_with_the_same_key_until_it_succeeds() {
        let mut intent = PaymentIntent::new("key-1".into(), "order".into());
        assert_eq!(intent.start_attempt(), Some(1));
        assert_eq!(
            intent.start_attempt(),
            None,
            "a second click while sending sends nothing"
        );
        let wait = intent.finish_attempt(&Attempt::NetworkError, &POLICY, 0.5);
        assert_eq!(wait, Some(Duration::from_millis(50)));
        assert_eq!(
            intent.phase,
            Phase::Retrying {
                attempt: 1,
                reason: RetryReason::ConnectionLost
            }
        );
        assert!(intent.is_in_flight() && intent.is_pending());

        assert_eq!(intent.start_attempt(), Some(2));
        let body = serde_json::to_string(&receipt()).unwrap();
        assert_eq!(
            intent.finish_attempt(&answer(201, body), &POLICY, 0.5),
            None
        );
        assert_eq!(intent.phase, Phase::Succeeded { receipt: receipt() });
        assert_eq!(intent.key, "key-1", "the key never changes");
        assert!(!intent.is_pending());
        assert_eq!(
            intent.start_attempt(),
            None,
            "a finished intent is never sent again"
        );
    }

    #[test]
    fn which_answers_retry_and_which_never_do() {
        let retry = |attempt: Attempt| matches!(judge::<Payment>(&attempt), Verdict::Retry { .. });
        assert!(retry(Attempt::NetworkError));
        assert!(retry(Attempt::TimedOut));
        assert!(retry(answer(500, "oops".into())));
        assert!(retry(answer(
            503,
            problem(503, ErrorCode::ServiceUnavailable)
        )));
        assert!(retry(answer(
            409,
            problem(409, ErrorCode::IdempotencyKeyInUse)
        )));
        assert!(!retry(answer(
            402,
            problem(402, ErrorCode::InsufficientFunds)
        )));
        assert!(!retry(answer(
            409,
            problem(409, ErrorCode::OrderAlreadyPaid)
        )));
        assert!(!retry(answer(
            409,
            problem(409, ErrorCode::RefundExceedsPayment)
        )));
        for (status, code) in [
            (400, ErrorCode::InvalidRequest),
            (401, ErrorCode::Unauthorized),
            (422, ErrorCode::IdempotencyKeyReused),
        ] {
            assert!(matches!(
                judge::<Payment>(&answer(status, problem(status, code))),
                Verdict::Refused(_)
            ));
        }
        assert!(matches!(
            judge::<Payment>(&answer(402, problem(402, ErrorCode::InsufficientFunds))),
            Verdict::Decline(_)
        ));
    }

    #[test]
    fn a_decline_is_final_and_keeps_its_problem() {
        let mut intent = PaymentIntent::new("k".into(), "order".into());
        intent.start_attempt();
        intent.finish_attempt(
            &answer(402, problem(402, ErrorCode::InsufficientFunds)),
            &POLICY,
            0.0,
        );
        let Phase::Declined { problem } = &intent.phase else {
            panic!("{:?}", intent.phase)
        };
        assert_eq!(problem.code, ErrorCode::InsufficientFunds);
        assert!(!intent.is_pending());
    }

    #[test]
    fn in_progress_waits_at_least_retry_after() {
        let mut intent = PaymentIntent::new("k".into(), "order".into());
        intent.start_attempt();
        let busy = Attempt::Answered {
            status: 409,
            body: problem(409, ErrorCode::IdempotencyKeyInUse),
            retry_after: Some(Duration::from_secs(1)),
        };
        assert_eq!(
            intent.finish_attempt(&busy, &POLICY, 0.0),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            intent.phase,
            Phase::Retrying {
                attempt: 1,
                reason: RetryReason::InProgress
            }
        );
    }

    #[test]
    fn giving_up_keeps_the_intent_pending_with_its_key() {
        let mut intent = PaymentIntent::new("k".into(), "order".into());
        for attempt in 1..=POLICY.max_attempts {
            assert_eq!(intent.start_attempt(), Some(attempt));
            let wait = intent.finish_attempt(&answer(503, "down".into()), &POLICY, 0.3);
            assert_eq!(wait.is_some(), attempt < POLICY.max_attempts);
        }
        assert!(matches!(
            intent.phase,
            Phase::Failed {
                retryable: true,
                ..
            }
        ));
        assert!(
            intent.is_pending(),
            "the outcome is unknown, so it is still to be learned"
        );
        assert_eq!(
            intent.start_attempt(),
            Some(1),
            "«Повторить» starts a new round, same key"
        );
        assert_eq!(intent.key, "k");
    }

    #[test]
    fn a_refused_request_is_not_resent() {
        let mut intent = PaymentIntent::new("k".into(), "order".into());
        intent.start_attempt();
        intent.finish_attempt(
            &answer(422, problem(422, ErrorCode::IdempotencyKeyReused)),
            &POLICY,
            0.0,
        );
        assert!(matches!(
            intent.phase,
            Phase::Failed {
                retryable: false,
                ..
            }
        ));
        assert_eq!(intent.start_attempt(), None);
    }

    #[test]
    fn a_reload_mid_send_resumes_as_a_retry_of_the_same_key() {
        let mut intent = PaymentIntent::new("k".into(), "order".into());
        intent.start_attempt();
        let saved = serde_json::to_string(&intent).unwrap();
        let mut reloaded: PaymentIntent = serde_json::from_str(&saved).unwrap();
        assert_eq!(
            reloaded, intent,
            "an intent survives sessionStorage unchanged"
        );
        reloaded.resume_after_reload();
        assert_eq!(
            reloaded.phase,
            Phase::Retrying {
                attempt: 1,
                reason: RetryReason::ConnectionLost
            }
        );
        assert_eq!(reloaded.start_attempt(), Some(2));
    }

    #[test]
    fn a_late_answer_from_a_superseded_attempt_changes_nothing() {
        let mut intent = PaymentIntent::new("k".into(), "order".into());
        intent.start_attempt();
        let body = serde_json::to_string(&receipt()).unwrap();
        intent.finish_attempt(&answer(201, body.clone()), &POLICY, 0.0);
        assert_eq!(
            intent.finish_attempt(&Attempt::NetworkError, &POLICY, 0.0),
            None
        );
        assert_eq!(intent.phase, Phase::Succeeded { receipt: receipt() });
    }

    #[test]
    fn backoff_is_capped_exponential_with_full_jitter() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            max_attempts: 10,
        };
        assert_eq!(policy.delay(1, 1.0, None), Duration::from_millis(100));
        assert_eq!(policy.delay(2, 1.0, None), Duration::from_millis(200));
        assert_eq!(policy.delay(4, 1.0, None), Duration::from_millis(800));
        assert_eq!(policy.delay(5, 1.0, None), Duration::from_secs(1), "capped");
        assert_eq!(
            policy.delay(60, 1.0, None),
            Duration::from_secs(1),
            "no overflow"
        );
        assert_eq!(
            policy.delay(3, 0.0, None),
            Duration::ZERO,
            "full jitter reaches zero"
        );
        assert_eq!(policy.delay(3, 0.5, None), Duration::from_millis(200));
        assert_eq!(
            policy.delay(1, 0.0, Some(Duration::from_millis(700))),
            Duration::from_millis(700)
        );
        assert_eq!(
            policy.delay(1, 0.0, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn keys_are_uuid_v4() {
        let key = new_key([7; 16]);
        let parsed = uuid::Uuid::parse_str(&key).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_ne!(new_key([7; 16]), new_key([8; 16]));
        assert!(checkout_shared::IdempotencyKey::parse(&key).is_ok());
    }
}
