//! The client half of the idempotency protocol, in plain Rust with no browser in sight.
//!
//! One intent = one request the shopper means to make once (a payment of one order, or one
//! refund) and one key made for it. An intent moves through
//! `created → sending → retrying(n) → succeeded | declined | failed`, resending the same key
//! and body on every retry. The widget persists intents, so a refresh resumes the same one.
//!
//! An intent whose outcome is unknown is resent only while its key is surely still known to the
//! server (the server says until when, `Idempotency-Key-Expires`). Past that, or when the expiry
//! was never learned, the server is asked first what became of the key
//! (`GET /api/idempotency-keys/{key}`): a resend after expiry would be a new request.

use std::time::Duration;

use checkout_shared::{ErrorCode, Problem};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::messages;

/// How long before the advertised expiry a key is treated as possibly forgotten already: room
/// for clock drift and for a request still on its way.
pub const EXPIRY_MARGIN_MS: i64 = 60_000;

/// What one attempt to send an intent brought back.
#[derive(Clone, Debug, PartialEq)]
pub enum Attempt {
    /// The server answered (whatever it said).
    Answered {
        status: u16,
        body: String,
        retry_after: Option<Duration>,
        /// How much longer the server keeps the key (`Idempotency-Key-Expires` − `Date`).
        expires_in: Option<Duration>,
    },
    /// The connection failed or was cut: the request may or may not have been executed.
    NetworkError,
    /// No answer in time: likewise unknown.
    TimedOut,
}

impl Attempt {
    /// An answer without the timing headers (for tests and for stored answers).
    pub fn answered(status: u16, body: String) -> Attempt {
        Attempt::Answered {
            status,
            body,
            retry_after: None,
            expires_in: None,
        }
    }
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
    /// The outcome is unknown and the key may be forgotten: the server is asked what became
    /// of it before anything is resent.
    LookingUp,
    /// The order was paid already (by this intent before its key expired, or by another): the
    /// payment named is fetched, and its receipt is this intent's outcome.
    Confirming {
        payment_id: String,
    },
    /// A refund whose key the server has forgotten: the payment's refunds tell whether it was
    /// made, before it is sent again.
    Reconciling,
    /// The server did not know the session (`401`): a new one is needed before resending.
    NeedsSession,
    Succeeded {
        receipt: Receipt,
    },
    /// A definite refusal that is the outcome of this intent (stored by the server, so
    /// resending gives the same): `402`, `409 refund_exceeds_payment`.
    Declined {
        problem: Problem,
    },
    /// No outcome. `retryable`: we gave up resending, but the outcome is unknown, so the same
    /// key may be sent again (and is, on the next page load). Otherwise the request itself
    /// was refused (`400`, `422`, …) and resending cannot help.
    Failed {
        message: String,
        retryable: bool,
    },
}

/// The verdict on one answer, before it is applied to an intent.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict<Receipt> {
    Success(Receipt),
    Decline(Problem),
    /// The money for this order has moved already: here is the payment.
    AlreadyPaid(String),
    Retry {
        reason: RetryReason,
        retry_after: Option<Duration>,
    },
    Unauthorized,
    Refused(String),
    /// A `2xx` this build cannot read (a proxy's page, a shape it does not know): the request
    /// did take effect, but what it made is unknown; the server is asked.
    Unreadable,
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
            ..
        } => (*status, body, *retry_after),
    };
    let problem: Option<Problem> = crate::json::from_str(body);
    let code = problem.as_ref().map(|p| p.code);
    match status {
        200..=299 => match crate::json::from_str(body) {
            Some(receipt) => Verdict::Success(receipt),
            None => Verdict::Unreadable,
        },
        401 => Verdict::Unauthorized,
        409 if code == Some(ErrorCode::IdempotencyKeyInUse) => Verdict::Retry {
            reason: RetryReason::InProgress,
            retry_after,
        },
        409 if matches!(
            code,
            Some(ErrorCode::OrderAlreadyPaid | ErrorCode::SessionAlreadyPaid)
        ) =>
        {
            match problem.and_then(|p| p.payment_id) {
                Some(payment_id) => Verdict::AlreadyPaid(payment_id),
                None => Verdict::Refused(messages::refusal(ErrorCode::SessionAlreadyPaid)),
            }
        }
        // Stored outcomes of the key: a decline, a refund too large, a session expired.
        402 | 409 | 410 if problem.is_some() => Verdict::Decline(problem.expect("checked")),
        408 | 429 | 500..=599 => Verdict::Retry {
            reason: RetryReason::ServerError,
            retry_after,
        },
        _ => Verdict::Refused(match code {
            Some(code) => messages::refusal(code),
            None => messages::status_refusal(status),
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
    /// When the intent was made (the browser's clock, Unix ms).
    #[serde(default)]
    pub created_at_ms: i64,
    /// Until when the server surely keeps the key (the browser's clock, Unix ms), once an answer
    /// has said so.
    #[serde(default)]
    pub key_expires_at_ms: Option<i64>,
}

/// What to do with an intent found pending when the page loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    /// Nothing: it has an outcome, or it was never sent (it waits for a click).
    Nothing,
    /// Resend the same key and body: the server surely still knows the key.
    Send,
    /// Ask the server what became of the key first.
    LookUp,
    /// Fetch this payment: it is the outcome.
    Confirm(String),
    /// Look for the refund among the payment's refunds.
    Reconcile,
    /// Get a new session, then resend.
    Renew,
}

/// What the server said of a key when asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Done: its stored answer.
    Done { status: u16, body: String },
    /// Its first request is executing now.
    InProgress,
    /// Never seen, or expired and forgotten.
    Unknown,
}

/// For a key the server does not know: resend it (a payment: the order is paid at most once,
/// so a payment that did happen comes back `409 order_already_paid` with its id), or look at
/// what the request would have made (a refund: nothing would stop a second one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenForgotten {
    Resend,
    Reconcile,
    /// An intent salvaged from a state that could not be read: whether it was ever sent is
    /// unknown, so it waits for the shopper's click (with the same key) rather than pay alone.
    AwaitClick,
}

impl<Request, Receipt: DeserializeOwned> Intent<Request, Receipt> {
    pub fn new(key: String, request: Request, now_ms: i64) -> Self {
        Intent {
            key,
            request,
            phase: Phase::Created,
            created_at_ms: now_ms,
            key_expires_at_ms: None,
        }
    }

    /// Whether the outcome is still unknown, so the intent must be (re)sent or looked up.
    pub fn is_pending(&self) -> bool {
        match &self.phase {
            Phase::Failed { retryable, .. } => *retryable,
            Phase::Succeeded { .. } | Phase::Declined { .. } => false,
            _ => true,
        }
    }

    /// Whether something is on its way: the button is disabled.
    pub fn is_in_flight(&self) -> bool {
        matches!(
            self.phase,
            Phase::Sending { .. }
                | Phase::Retrying { .. }
                | Phase::LookingUp
                | Phase::Confirming { .. }
                | Phase::Reconciling
                | Phase::NeedsSession
        )
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

    /// Whether the server surely still knows the key at `now_ms`.
    pub fn key_surely_known(&self, now_ms: i64) -> bool {
        self.key_expires_at_ms
            .is_some_and(|expires| now_ms.saturating_add(EXPIRY_MARGIN_MS) < expires)
    }

    /// What to do with this intent when the page loads.
    pub fn resume(&self, now_ms: i64) -> Resume {
        match &self.phase {
            Phase::Created
            | Phase::Succeeded { .. }
            | Phase::Declined { .. }
            | Phase::Failed {
                retryable: false, ..
            } => Resume::Nothing,
            Phase::Confirming { payment_id } => Resume::Confirm(payment_id.clone()),
            Phase::Reconciling => Resume::Reconcile,
            Phase::NeedsSession => Resume::Renew,
            Phase::Sending { .. }
            | Phase::Retrying { .. }
            | Phase::LookingUp
            | Phase::Failed {
                retryable: true, ..
            } => {
                if self.key_surely_known(now_ms) {
                    Resume::Send
                } else {
                    Resume::LookUp
                }
            }
        }
    }

    /// Within one page, after a step has run: what comes next (unlike [`Intent::resume`], a
    /// round that gave up stays given up until the shopper asks again).
    pub fn next_step(&self) -> Resume {
        match &self.phase {
            Phase::Retrying { .. } => Resume::Send,
            Phase::LookingUp => Resume::LookUp,
            Phase::Confirming { payment_id } => Resume::Confirm(payment_id.clone()),
            Phase::Reconciling => Resume::Reconcile,
            Phase::NeedsSession => Resume::Renew,
            _ => Resume::Nothing,
        }
    }

    /// A click on the button: a new intent is sent, and a round that gave up starts again.
    pub fn sendable_by_hand(&self) -> bool {
        matches!(
            self.phase,
            Phase::Created
                | Phase::Failed {
                    retryable: true,
                    ..
                }
        )
    }

    /// The session was refused while finding something out (not while sending).
    pub fn unauthorized(&mut self) {
        if self.is_pending() {
            self.phase = Phase::NeedsSession;
        }
    }

    /// No answer from the server while finding something out, for too long: the outcome is
    /// still unknown; the shopper may try again (nothing will be charged twice).
    pub fn give_up(&mut self) {
        if self.is_in_flight() {
            self.phase = Phase::Failed {
                message: messages::NO_CONNECTION.into(),
                retryable: true,
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
            }
            | Phase::NeedsSession => (1, Some(RetryReason::ConnectionLost)),
            _ => return None,
        };
        self.phase = Phase::Sending { attempt, after };
        Some(attempt)
    }

    /// Applies an attempt's result. Returns how long to wait before the next attempt, or
    /// `None` when there is nothing more to send (an outcome, something to fetch or renew, or
    /// this round gave up).
    pub fn finish_attempt(
        &mut self,
        attempt: &Attempt,
        policy: &RetryPolicy,
        unit_random: f64,
        now_ms: i64,
    ) -> Option<Duration> {
        let Phase::Sending {
            attempt: number, ..
        } = self.phase
        else {
            return None; // not ours: another driver already settled this intent
        };
        if let Attempt::Answered {
            expires_in: Some(left),
            ..
        } = attempt
        {
            let left = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            self.key_expires_at_ms = Some(now_ms.saturating_add(left));
        }
        match judge(attempt) {
            Verdict::Retry { reason, .. } if number >= policy.max_attempts => {
                let message = match reason {
                    RetryReason::InProgress => messages::STILL_IN_PROGRESS,
                    _ => messages::NO_CONNECTION,
                };
                self.phase = Phase::Failed {
                    message: message.into(),
                    retryable: true,
                };
                None
            }
            Verdict::Retry {
                reason,
                retry_after,
            } => {
                self.phase = Phase::Retrying {
                    attempt: number,
                    reason,
                };
                Some(policy.delay(number, unit_random, retry_after))
            }
            verdict => {
                self.settle(verdict);
                None
            }
        }
    }

    /// A verdict that ends the sending: an outcome, or the next thing to find out.
    fn settle(&mut self, verdict: Verdict<Receipt>) {
        self.phase = match verdict {
            Verdict::Success(receipt) => Phase::Succeeded { receipt },
            Verdict::Decline(problem) => Phase::Declined { problem },
            Verdict::AlreadyPaid(payment_id) => Phase::Confirming { payment_id },
            Verdict::Unauthorized => Phase::NeedsSession,
            Verdict::Refused(message) => Phase::Failed {
                message,
                retryable: false,
            },
            Verdict::Retry { reason, .. } => Phase::Retrying { attempt: 0, reason },
            // Asked of the key first; if even its stored answer cannot be read, the outcome
            // is found by what the request made (the session's payment).
            Verdict::Unreadable if matches!(self.phase, Phase::LookingUp) => Phase::Reconciling,
            Verdict::Unreadable => Phase::LookingUp,
        };
    }

    /// Starts asking the server about the key; `false` if there is nothing to ask.
    pub fn start_lookup(&mut self) -> bool {
        let pending = self.is_pending() && !matches!(self.phase, Phase::Created);
        if pending {
            self.phase = Phase::LookingUp;
        }
        pending
    }

    /// Applies what the server said of the key; returns what to do next.
    pub fn finish_lookup(&mut self, found: Lookup, when_forgotten: WhenForgotten) -> Resume {
        if !matches!(self.phase, Phase::LookingUp) {
            return Resume::Nothing; // settled meanwhile (e.g. by another tab)
        }
        match found {
            Lookup::Done { status, body } => {
                // The key is known (its stored answer says so) for as long as a replay would be.
                self.settle(judge(&Attempt::answered(status, body)));
                self.resume(i64::MAX)
            }
            Lookup::InProgress => {
                self.phase = Phase::Retrying {
                    attempt: 0,
                    reason: RetryReason::InProgress,
                };
                Resume::Send
            }
            Lookup::Unknown => {
                // Whatever the key was, it is a new key now.
                self.key_expires_at_ms = None;
                match when_forgotten {
                    WhenForgotten::Resend => {
                        self.phase = Phase::Retrying {
                            attempt: 0,
                            reason: RetryReason::ConnectionLost,
                        };
                        Resume::Send
                    }
                    WhenForgotten::Reconcile => {
                        self.phase = Phase::Reconciling;
                        Resume::Reconcile
                    }
                    WhenForgotten::AwaitClick => {
                        self.phase = Phase::Created;
                        Resume::Nothing
                    }
                }
            }
        }
    }

    /// The outcome found elsewhere (the paid order's payment, the refund among the payment's
    /// refunds): this intent has succeeded.
    pub fn succeed_with(&mut self, receipt: Receipt) {
        if matches!(self.phase, Phase::Confirming { .. } | Phase::Reconciling) {
            self.phase = Phase::Succeeded { receipt };
        }
    }

    /// Reconciling found nothing: the request never took effect, so it is sent again.
    pub fn found_nothing(&mut self) {
        if matches!(self.phase, Phase::Reconciling) {
            self.phase = Phase::Retrying {
                attempt: 0,
                reason: RetryReason::ConnectionLost,
            };
        }
    }

    /// A new session was had after `401`: the same key is sent again under it (to the new
    /// principal it is a new key, and the old one never took effect).
    pub fn session_renewed(&mut self) {
        if matches!(self.phase, Phase::NeedsSession) {
            self.key_expires_at_ms = None;
            self.phase = Phase::Retrying {
                attempt: 0,
                reason: RetryReason::ConnectionLost,
            };
        }
    }

    /// After `401` where no new session can be had: the shopper is told, nothing is resent.
    pub fn session_lost(&mut self) {
        if matches!(self.phase, Phase::NeedsSession) {
            self.phase = Phase::Failed {
                message: messages::SESSION_LOST.into(),
                retryable: false,
            };
        }
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
            checkout_session_id: None,
            payment_id: "pay_1".into(),
            order_id: "ORD-1".into(),
            amount: 45_000,
            currency: "RUB".into(),
            status: PaymentStatus::Succeeded,
            balance: Some(55_000),
            created_at: "2026-12-02T10:00:00Z".into(),
            livemode: false,
        }
    }

    fn answer(status: u16, body: String) -> Attempt {
        Attempt::answered(status, body)
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
        let mut intent = PaymentIntent::new("key-1".into(), "order".into(), 0);
        assert_eq!(intent.start_attempt(), Some(1));
        assert_eq!(
            intent.start_attempt(),
            None,
            "a second click while sending sends nothing"
        );
        let wait = intent.finish_attempt(&Attempt::NetworkError, &POLICY, 0.5, 0);
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
            intent.finish_attempt(&answer(201, body), &POLICY, 0.5, 0),
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
            (422, ErrorCode::IdempotencyKeyReused),
        ] {
            let verdict = judge::<Payment>(&answer(status, problem(status, code)));
            let Verdict::Refused(message) = verdict else {
                panic!("{verdict:?}")
            };
            assert!(
                !message.contains("detail"),
                "the server's words stay out: {message}"
            );
        }
        assert_eq!(
            judge::<Payment>(&answer(401, problem(401, ErrorCode::Unauthorized))),
            Verdict::Unauthorized
        );
        let mut paid = Problem::new(409, ErrorCode::OrderAlreadyPaid, "detail");
        paid.payment_id = Some("pay_1".into());
        assert_eq!(
            judge::<Payment>(&answer(409, serde_json::to_string(&paid).unwrap())),
            Verdict::AlreadyPaid("pay_1".into()),
            "a paid order is never a decline: its payment is the outcome"
        );
        assert!(matches!(
            judge::<Payment>(&answer(402, problem(402, ErrorCode::InsufficientFunds))),
            Verdict::Decline(_)
        ));
    }

    #[test]
    fn a_decline_is_final_and_keeps_its_problem() {
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        intent.start_attempt();
        intent.finish_attempt(
            &answer(402, problem(402, ErrorCode::InsufficientFunds)),
            &POLICY,
            0.0,
            0,
        );
        let Phase::Declined { problem } = &intent.phase else {
            panic!("{:?}", intent.phase)
        };
        assert_eq!(problem.code, ErrorCode::InsufficientFunds);
        assert!(!intent.is_pending());
    }

    #[test]
    fn in_progress_waits_at_least_retry_after() {
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        intent.start_attempt();
        let busy = Attempt::Answered {
            status: 409,
            body: problem(409, ErrorCode::IdempotencyKeyInUse),
            retry_after: Some(Duration::from_secs(1)),
            expires_in: None,
        };
        assert_eq!(
            intent.finish_attempt(&busy, &POLICY, 0.0, 0),
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
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        for attempt in 1..=POLICY.max_attempts {
            assert_eq!(intent.start_attempt(), Some(attempt));
            let wait = intent.finish_attempt(&answer(503, "down".into()), &POLICY, 0.3, 0);
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
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        intent.start_attempt();
        intent.finish_attempt(
            &answer(422, problem(422, ErrorCode::IdempotencyKeyReused)),
            &POLICY,
            0.0,
            0,
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
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
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
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        intent.start_attempt();
        let body = serde_json::to_string(&receipt()).unwrap();
        intent.finish_attempt(&answer(201, body.clone()), &POLICY, 0.0, 0);
        assert_eq!(
            intent.finish_attempt(&Attempt::NetworkError, &POLICY, 0.0, 0),
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
    fn a_pending_intent_is_resent_only_while_its_key_is_surely_known() {
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        assert_eq!(
            intent.resume(0),
            Resume::Nothing,
            "never sent: it waits for a click"
        );
        intent.start_attempt();
        assert_eq!(
            intent.resume(1_000),
            Resume::LookUp,
            "no answer yet: expiry unknown"
        );
        let busy = Attempt::Answered {
            status: 409,
            body: problem(409, ErrorCode::IdempotencyKeyInUse),
            retry_after: None,
            expires_in: Some(Duration::from_secs(3_600)),
        };
        intent.finish_attempt(&busy, &POLICY, 0.0, 10_000);
        assert_eq!(intent.key_expires_at_ms, Some(3_610_000));
        assert_eq!(intent.resume(20_000), Resume::Send, "well within its life");
        assert_eq!(
            intent.resume(3_610_000 - EXPIRY_MARGIN_MS),
            Resume::LookUp,
            "near its expiry it is looked up, not resent blindly"
        );
        assert_eq!(intent.resume(4_000_000), Resume::LookUp);
    }

    #[test]
    fn a_lookup_settles_or_resends() {
        let looked_up = |found: Lookup, when: WhenForgotten| {
            let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
            intent.start_attempt();
            assert!(intent.start_lookup());
            let next = intent.finish_lookup(found, when);
            (intent, next)
        };
        let body = serde_json::to_string(&receipt()).unwrap();
        let (done, next) = looked_up(Lookup::Done { status: 201, body }, WhenForgotten::Resend);
        assert_eq!(done.phase, Phase::Succeeded { receipt: receipt() });
        assert_eq!(next, Resume::Nothing);

        let mut paid = Problem::new(409, ErrorCode::OrderAlreadyPaid, "d");
        paid.payment_id = Some("pay_7".into());
        let body = serde_json::to_string(&paid).unwrap();
        let (confirming, next) =
            looked_up(Lookup::Done { status: 409, body }, WhenForgotten::Resend);
        assert_eq!(next, Resume::Confirm("pay_7".into()));
        assert!(confirming.is_pending());

        let (_, next) = looked_up(Lookup::InProgress, WhenForgotten::Resend);
        assert_eq!(next, Resume::Send);
        let (forgotten, next) = looked_up(Lookup::Unknown, WhenForgotten::Resend);
        assert_eq!(
            next,
            Resume::Send,
            "a payment: the order's own uniqueness guards a resend"
        );
        assert_eq!(forgotten.key_expires_at_ms, None);
        let (_, next) = looked_up(Lookup::Unknown, WhenForgotten::Reconcile);
        assert_eq!(next, Resume::Reconcile);
    }

    #[test]
    fn an_unknown_session_is_renewed_then_the_same_key_is_resent() {
        let mut intent = PaymentIntent::new("k".into(), "order".into(), 0);
        intent.start_attempt();
        let wait = intent.finish_attempt(
            &answer(401, problem(401, ErrorCode::Unauthorized)),
            &POLICY,
            0.0,
            0,
        );
        assert_eq!(wait, None);
        assert_eq!(intent.phase, Phase::NeedsSession);
        assert_eq!(intent.resume(0), Resume::Renew);
        assert_eq!(
            intent.start_attempt(),
            Some(1),
            "with the new session, the same key"
        );
        assert_eq!(intent.key, "k");
        let mut lost = PaymentIntent::new("k".into(), "order".into(), 0);
        lost.phase = Phase::NeedsSession;
        lost.session_lost();
        assert!(matches!(
            lost.phase,
            Phase::Failed {
                retryable: false,
                ..
            }
        ));
    }

    #[test]
    fn keys_are_uuid_v4() {
        let key = new_key([7; 16]);
        let parsed = uuid::Uuid::parse_str(&key).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_ne!(new_key([7; 16]), new_key([8; 16]));
        assert!(checkout_shared::IdempotencyKey::parse(&key).is_ok());
    }

    #[test]
    fn an_unreadable_success_is_looked_up_never_shown_as_a_failure() {
        let mut intent = PaymentIntent::new("key-u".into(), "order".into(), 0);
        intent.start_attempt();
        let proxy_page = "<html><body>502 Bad Gateway</body></html>".to_owned();
        assert_eq!(
            intent.finish_attempt(&answer(200, proxy_page.clone()), &POLICY, 0.0, 0),
            None
        );
        assert_eq!(
            intent.phase,
            Phase::LookingUp,
            "the money may have moved: ask the key"
        );
        assert!(intent.is_in_flight() && intent.is_pending());
        // The key's stored answer is the real receipt.
        let stored = serde_json::to_string(&receipt()).unwrap();
        intent.finish_lookup(
            Lookup::Done {
                status: 201,
                body: stored,
            },
            WhenForgotten::Resend,
        );
        assert!(matches!(intent.phase, Phase::Succeeded { .. }));

        // Even the stored answer unreadable: found out from what the request made.
        let mut again = PaymentIntent::new("key-v".into(), "order".into(), 0);
        again.start_attempt();
        again.finish_attempt(&answer(201, proxy_page.clone()), &POLICY, 0.0, 0);
        let next = again.finish_lookup(
            Lookup::Done {
                status: 201,
                body: proxy_page,
            },
            WhenForgotten::Resend,
        );
        assert_eq!(again.phase, Phase::Reconciling);
        assert_eq!(next, Resume::Reconcile);
        // A status this build does not know is read, not refused.
        let newer = serde_json::to_string(&receipt())
            .unwrap()
            .replace("succeeded", "settled_later");
        let mut tolerant = PaymentIntent::new("key-w".into(), "order".into(), 0);
        tolerant.start_attempt();
        tolerant.finish_attempt(&answer(201, newer), &POLICY, 0.0, 0);
        assert!(
            matches!(tolerant.phase, Phase::Succeeded { .. }),
            "{:?}",
            tolerant.phase
        );
    }
}
