//! Request and response bodies of the HTTP API.

use serde::{Deserialize, Serialize};

/// `POST /api/payments`: debit the principal's account for one order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePayment {
    pub order_id: String,
    /// Kopecks, `1..=10^12`.
    pub amount: i64,
    /// Defaults to the account's currency; any other currency is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// `POST /api/payments/{payment_id}/refunds`: credit part or all of a payment back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRefund {
    pub amount: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    Succeeded,
}

/// A succeeded payment, as answered by `POST /api/payments` (`201`) and replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    pub payment_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub status: PaymentStatus,
    /// The account's balance right after this debit.
    pub balance: i64,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// A refund, as answered by `POST /api/payments/{payment_id}/refunds` (`201`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub refund_id: String,
    pub payment_id: String,
    pub amount: i64,
    /// All refunds of the payment so far, this one included.
    pub refunded_total: i64,
    /// The account's balance right after this credit.
    pub balance: i64,
    pub created_at: String,
}

/// `GET /api/payments/{payment_id}`: the payment with every refund made against it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentDetails {
    #[serde(flatten)]
    pub payment: Payment,
    pub refunded_total: i64,
    pub refunds: Vec<Refund>,
}

/// `GET /api/account`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub account_id: String,
    pub balance: i64,
    pub currency: String,
}

/// `POST /api/demo/session`: a fresh demo shopper holding 1 000,00 ₽.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoSession {
    pub token: String,
    pub account_id: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    InProgress,
    Done,
}

/// `GET /api/idempotency-keys/{key}`: where one of the caller's own keys stands, so that a client
/// can learn an old intent's fate without sending it again. Unknown or expired keys are `404`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyStatus {
    pub status: KeyState,
    /// Once done: the stored answer's status…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// …and its body, as a replay would send it (it is the caller's own answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<serde_json::Value>,
    /// RFC 3339: when the key will be forgotten (unknown while its first request is executing
    /// elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}
