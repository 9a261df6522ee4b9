//! The one error type of the checkout: what an operation or a request refuses, as the RFC 9457
//! problem it is answered with ([`OperationError::problem`]; `api::problem` sends it as
//! problem+json).

use checkout_idempotency::{Classify, Failure};
use checkout_shared::{ErrorCode, Problem};

use crate::store::StoreError;

/// Errors that are answered but never stored under an idempotency key: they moved no money,
/// so a retry with the same key runs afresh.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("a valid bearer token is required: send `Authorization: Bearer <token>`")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the request body is larger than 1 MiB")]
    PayloadTooLarge,
    /// The fields of the body that differ from the key's first request.
    #[error(
        "this Idempotency-Key was first used with a different request; make a new key for a new request"
    )]
    KeyReused(Vec<String>),
    #[error(
        "a request with this Idempotency-Key is still executing; retry it shortly with the same key"
    )]
    KeyInUse,
    /// Every attempt lost a race with concurrent requests (rare; a retry will see their result).
    #[error(
        "the request kept colliding with concurrent ones; nothing was charged, retry it with the same key"
    )]
    Contended,
    /// More password and code checks wait than the server runs at once: try again shortly.
    #[error("too many sign-ins are being checked at once; try again shortly")]
    PasswordChecksBusy,
    /// A shopper of one mode and a session of the other: test money never pays a live session,
    /// live money never a test one.
    #[error("{0}")]
    ModeMismatch(String),
    /// Too many attempts from this address or at this account: wait this many seconds.
    #[error("too many attempts; try again in {0} s")]
    TooManyRequests(u64),
    /// A wrong password and an unknown e-mail are told apart by no one.
    #[error("wrong e-mail or password")]
    InvalidCredentials,
    /// A code that is wrong, expired, used, or out of tries: which, is not said.
    #[error("the code is wrong, expired or used up; ask for a new one")]
    InvalidCode,
    /// A live shopper that has not proved its e-mail: no money reaches it, none leaves it.
    #[error("{0}")]
    EmailUnconfirmed(String),
    /// The mail with the code could not be sent (no SMTP server set, or it refused).
    #[error("the mail with the code could not be sent; try again shortly")]
    MailUnavailable,
    /// A passkey's answer that does not hold: no such ceremony (expired, used), a signature
    /// that does not verify, a passkey no account has.
    #[error("the passkey was not accepted: {0}")]
    PasskeyRejected(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether the protocol may run the transaction again (a lost race) or must stop.
impl Classify for OperationError {
    fn failure(&self) -> Failure {
        match self {
            OperationError::Store(error) => error.failure(),
            _ => Failure::Fatal,
        }
    }
}

impl OperationError {
    /// Its status and stable code.
    pub fn status_and_code(&self) -> (u16, ErrorCode) {
        match self {
            OperationError::InvalidRequest(_) => (400, ErrorCode::InvalidRequest),
            OperationError::Unauthorized => (401, ErrorCode::Unauthorized),
            OperationError::Forbidden(_) => (403, ErrorCode::Forbidden),
            OperationError::NotFound(_) => (404, ErrorCode::NotFound),
            OperationError::PayloadTooLarge => (413, ErrorCode::PayloadTooLarge),
            OperationError::KeyReused(_) => (422, ErrorCode::IdempotencyKeyReused),
            OperationError::KeyInUse => (409, ErrorCode::IdempotencyKeyInUse),
            OperationError::Contended => (503, ErrorCode::ServiceUnavailable),
            OperationError::PasswordChecksBusy => (503, ErrorCode::ServiceUnavailable),
            OperationError::ModeMismatch(_) => (403, ErrorCode::LivemodeMismatch),
            OperationError::TooManyRequests(_) => (429, ErrorCode::TooManyRequests),
            OperationError::InvalidCredentials => (401, ErrorCode::InvalidCredentials),
            OperationError::InvalidCode => (400, ErrorCode::InvalidCode),
            OperationError::EmailUnconfirmed(_) => (403, ErrorCode::EmailUnconfirmed),
            OperationError::MailUnavailable => (503, ErrorCode::MailUnavailable),
            OperationError::PasskeyRejected(_) => (400, ErrorCode::PasskeyRejected),
            OperationError::Store(StoreError::Other(_) | StoreError::LostClaim) => {
                (500, ErrorCode::InternalError)
            }
            OperationError::Store(_) => (503, ErrorCode::ServiceUnavailable),
        }
    }

    /// Whether the same request may simply be sent again later (`Retry-After`).
    pub fn is_transient(&self) -> bool {
        matches!(self, OperationError::KeyInUse) || self.status_and_code().0 == 503
    }

    /// How many seconds a client should wait before sending it again, if it may.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            OperationError::TooManyRequests(seconds) => Some((*seconds).max(1)),
            _ if self.is_transient() => Some(1),
            _ => None,
        }
    }

    /// The problem the caller reads: its detail says what happened and what a retry does, never
    /// the database's words (those are for the log).
    pub fn problem(&self) -> Problem {
        let (status, code) = self.status_and_code();
        let detail = match self {
            OperationError::Store(error) => {
                tracing::error!(%error, "store error");
                match error {
                    StoreError::Other(_) | StoreError::LostClaim => {
                        "internal error; nothing was charged, retry with the same key"
                    }
                    // The commit was sent; whether it took is not known here. The key knows:
                    // a retry with it answers what happened, and never charges twice.
                    StoreError::InDoubt(_) => {
                        "the database did not confirm the outcome; retry with the same key: the answer will say what happened, and nothing is charged twice"
                    }
                    _ => "the database is busy or unreachable; nothing was charged, retry with the same key",
                }
                .to_owned()
            }
            other => other.to_string(),
        };
        let mut problem = Problem::new(status, code, detail);
        if let OperationError::KeyReused(fields) = self {
            problem.detail = match fields.as_slice() {
                [] => "this Idempotency-Key was first used on another route or method; make a new key for a new request".into(),
                fields => format!(
                    "this Idempotency-Key was first used with different values of: {}; make a new key for a new request",
                    fields.join(", ")
                ),
            };
            problem.fields = Some(fields.clone());
        }
        problem
    }
}
