//! RFC 9457 problem details, the body of every error answer, with a stable machine `code`.

use serde::{Deserialize, Serialize};

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// The stable codes a client may branch on. Never renamed; new ones may be added, which an older
/// client reads as [`ErrorCode::Unknown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    IdempotencyKeyReused,
    IdempotencyKeyInUse,
    InsufficientFunds,
    OrderAlreadyPaid,
    RefundExceedsPayment,
    Forbidden,
    OrderSessionExists,
    SessionAlreadyPaid,
    SessionExpired,
    RequestTimeout,
    ServiceUnavailable,
    InternalError,
    LivemodeMismatch,
    TooManyRequests,
    InvalidCredentials,
    InvalidCode,
    EmailUnconfirmed,
    MailUnavailable,
    PasskeyRejected,
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::IdempotencyKeyInUse => "idempotency_key_in_use",
            ErrorCode::InsufficientFunds => "insufficient_funds",
            ErrorCode::OrderAlreadyPaid => "order_already_paid",
            ErrorCode::RefundExceedsPayment => "refund_exceeds_payment",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::OrderSessionExists => "order_session_exists",
            ErrorCode::SessionAlreadyPaid => "session_already_paid",
            ErrorCode::SessionExpired => "session_expired",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::ServiceUnavailable => "service_unavailable",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::LivemodeMismatch => "livemode_mismatch",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::InvalidCredentials => "invalid_credentials",
            ErrorCode::InvalidCode => "invalid_code",
            ErrorCode::EmailUnconfirmed => "email_unconfirmed",
            ErrorCode::MailUnavailable => "mail_unavailable",
            ErrorCode::PasskeyRejected => "passkey_rejected",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// A short English summary, the problem's `title`.
    pub fn title(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "The request is invalid",
            ErrorCode::Unauthorized => "Authentication is required",
            ErrorCode::NotFound => "Not found",
            ErrorCode::MethodNotAllowed => "Method not allowed",
            ErrorCode::PayloadTooLarge => "The request body is too large",
            ErrorCode::IdempotencyKeyReused => "The idempotency key was used for another request",
            ErrorCode::IdempotencyKeyInUse => "A request with this idempotency key is in progress",
            ErrorCode::InsufficientFunds => "Insufficient funds",
            ErrorCode::OrderAlreadyPaid => "The order is already paid",
            ErrorCode::RefundExceedsPayment => "The refund exceeds what remains of the payment",
            ErrorCode::Forbidden => "Not allowed for this kind of account",
            ErrorCode::OrderSessionExists => "The order already has a checkout session",
            ErrorCode::SessionAlreadyPaid => "The checkout session is already paid",
            ErrorCode::SessionExpired => "The checkout session has expired",
            ErrorCode::RequestTimeout => "The request took too long",
            ErrorCode::ServiceUnavailable => "The service is temporarily unavailable",
            ErrorCode::InternalError => "Internal error",
            ErrorCode::LivemodeMismatch => "Test money and live money do not mix",
            ErrorCode::TooManyRequests => "Too many attempts",
            ErrorCode::InvalidCredentials => "Wrong e-mail or password",
            ErrorCode::InvalidCode => "The code is wrong, expired or used up",
            ErrorCode::EmailUnconfirmed => "The e-mail address is not confirmed",
            ErrorCode::MailUnavailable => "Mail could not be sent",
            ErrorCode::PasskeyRejected => "The passkey was not accepted",
            ErrorCode::Unknown => "Unknown error",
        }
    }
}

/// `application/problem+json` (RFC 9457) with the checkout's extension members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// `urn:problem:checkout:<code>`.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: ErrorCode,
    /// For `order_session_exists`: the order's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkout_session_id: Option<String>,
    /// For `session_already_paid`, `order_already_paid` and `refund_exceeds_payment`: the
    /// payment concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    /// For `insufficient_funds`: the balance at the time of the decline (the shopper's to the
    /// shopper, the shop's to the shop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<i64>,
    /// For `refund_exceeds_payment`: what may still be refunded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refundable: Option<i64>,
    /// For `idempotency_key_reused`: the top-level fields of the body that differ from the
    /// key's first request (names only, never values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
}

impl Problem {
    pub fn new(status: u16, code: ErrorCode, detail: impl Into<String>) -> Self {
        Problem {
            problem_type: format!("urn:problem:checkout:{}", code.as_str()),
            title: code.title().to_owned(),
            status,
            detail: detail.into(),
            code,
            checkout_session_id: None,
            payment_id: None,
            balance: None,
            refundable: None,
            fields: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialize_as_their_stable_names() {
        for code in [ErrorCode::IdempotencyKeyReused, ErrorCode::OrderAlreadyPaid] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
        let later: ErrorCode = serde_json::from_str("\"a_code_from_the_future\"").unwrap();
        assert_eq!(later, ErrorCode::Unknown);
    }
}
