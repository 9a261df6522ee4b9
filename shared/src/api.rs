//! Request and response bodies of the HTTP API.

use serde::{Deserialize, Serialize};

/// One line of a checkout session: what is bought, how many, at what unit price.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LineItem {
    pub name: String,
    pub quantity: u32,
    /// Kopecks.
    pub unit_price: i64,
}

impl LineItem {
    /// `quantity × unit_price`, or `None` past what an `i64` holds.
    pub fn total(&self) -> Option<i64> {
        self.unit_price.checked_mul(i64::from(self.quantity))
    }
}

/// `POST /api/checkout-sessions` (a shop, keyed): what is to be paid for. The amount is the
/// shop's; the shopper's browser only confirms it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateCheckoutSession {
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._-]{1,64}$"))]
    pub order_id: String,
    /// Kopecks, `1..=10^12`; the items, if given, must sum to it.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64)
    )]
    pub amount: i64,
    /// Defaults to the shop's currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<LineItem>>,
    /// Where the payment page, opened as a full page (`/pay/{session_id}`), sends the shopper
    /// back after the outcome: `https://`, or `http://` to a loopback address, on one of the
    /// shop's registered origins (its own pages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_url: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CheckoutSessionStatus {
    Open,
    Paid,
    Expired,
    /// Never sent by this server: a client reads a status it does not know (a newer
    /// server's) as this, rather than refuse the whole answer.
    #[serde(other)]
    Unknown,
}

/// A checkout session: the shop's answer to its `POST`, and (with the shop's name) the public
/// view a widget renders from `GET /api/checkout-sessions/{session_id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckoutSession {
    pub session_id: String,
    /// Present in the public view: whom the shopper pays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shop: Option<ShopView>,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub description: Option<String>,
    pub items: Vec<LineItem>,
    pub status: CheckoutSessionStatus,
    /// RFC 3339: after it an unpaid session cannot be paid.
    pub expires_at: String,
    #[serde(default)]
    pub payment_id: Option<String>,
    /// Where the full payment page returns the shopper after the outcome, if the shop said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_url: Option<String>,
    /// `false`: test money (made with the shop's `sk_test_` key, paid by a test shopper);
    /// `true`: live money (`sk_live_`, paid by a signed-in shopper).
    #[serde(default)]
    pub livemode: bool,
}

/// A shop as a shopper sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShopView {
    pub name: String,
}

/// `POST /api/payments` (a shopper, keyed): pay this checkout session, whose amount the shop
/// fixed. Any other field (an `amount` above all) is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreatePayment {
    pub checkout_session_id: String,
}

/// `POST /api/payments/{payment_id}/refunds` (the paid shop, keyed): credit part or all of a
/// payment back to its shopper.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateRefund {
    /// Kopecks, at least 1 and at most what is left to refund.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000_000_000_i64)
    )]
    pub amount: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    Succeeded,
    /// Never sent by this server: a client reads a status it does not know (a newer
    /// server's) as this, rather than refuse the whole answer.
    #[serde(other)]
    Unknown,
}

/// A succeeded payment, as answered by `POST /api/payments` (`201`) and replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Payment {
    pub payment_id: String,
    /// `None` only for payments made before checkout sessions existed.
    #[serde(default)]
    pub checkout_session_id: Option<String>,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub status: PaymentStatus,
    /// The shopper's balance right after this debit: shown to the shopper only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<i64>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// The session's mode: test money or live money.
    #[serde(default)]
    pub livemode: bool,
}

/// A refund, as answered by `POST /api/payments/{payment_id}/refunds` (`201`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Refund {
    pub refund_id: String,
    pub payment_id: String,
    pub amount: i64,
    /// All refunds of the payment so far, this one included.
    pub refunded_total: i64,
    /// The shop's balance right after this refund: shown to the shop only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<i64>,
    pub created_at: String,
    /// The payment's mode.
    #[serde(default)]
    pub livemode: bool,
}

/// `GET /api/payments/{payment_id}`: the payment with every refund made against it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PaymentDetails {
    #[serde(flatten)]
    pub payment: Payment,
    pub refunded_total: i64,
    pub refunds: Vec<Refund>,
}

/// `GET /api/account`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Account {
    pub account_id: String,
    pub balance: i64,
    pub currency: String,
    /// A live shopper's or a shop's live account: live money; otherwise test money.
    #[serde(default)]
    pub livemode: bool,
    /// A live shopper's e-mail (to the shopper only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

/// `POST /api/demo/checkout-session` (demo mode only): a checkout session of the demo shop for
/// one of its demo carts, made server-side (the browser never names an amount).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DemoCart {
    /// Which demo cart: any number, taken modulo the number of carts.
    pub cart: u32,
}

/// `POST /api/test/shoppers` (and `POST /api/demo/session`, its old name): a fresh test shopper
/// holding 1 000,00 ₽ of test money; or a live shopper's sign-in (`POST /api/shoppers/sign-in`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShopperToken {
    pub token: String,
    pub account_id: String,
}

/// The old name of [`ShopperToken`] (`POST /api/demo/session`).
pub type DemoSession = ShopperToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    InProgress,
    Done,
}

/// `GET /api/idempotency-keys/{key}`: where one of the caller's own keys stands, so that a client
/// can learn an old intent's fate without sending it again. Unknown or expired keys are `404`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// The RabbitMQ exchange (durable, topic) the checkout publishes its events to, each with its
/// type as the routing key, its id as `message_id`, and the webhook's body.
pub const EVENTS_EXCHANGE: &str = "checkout.events";

/// An event to a shop, as its webhook body (Standard Webhooks): the `webhook-id` header carries
/// its id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventBody {
    /// `payment.succeeded`, `refund.succeeded` or `checkout_session.expired`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The event's place among its object's events: the version the change left the object at.
    /// A payment's `payment.succeeded` is 1 and each of its `refund.succeeded` one more (a
    /// refused refund takes no number); a session's or a deposit's event is 1. Events of one
    /// object are sent in order, but a redelivery can bring an older one after a newer: a
    /// receiver that keeps the highest `sequence` applied per payment can tell. Absent (0)
    /// from events written before it existed.
    #[serde(default)]
    pub sequence: i64,
    /// Test money (`false`) or live money (`true`): a shop's events of each mode are listed with
    /// that mode's key and signed with that mode's signing secret.
    #[serde(default)]
    pub livemode: bool,
    /// RFC 3339, UTC: when the change happened.
    pub timestamp: String,
    /// The payment, the refund (with its `order_id`), or the session.
    pub data: serde_json::Value,
}

/// One event as `GET /api/events` lists it for its shop: the body, and how its delivery goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventView {
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub created_at: String,
    /// `pending`, `delivered` or `dead`.
    pub status: String,
    pub attempts: i64,
    /// While pending: when the next attempt is due (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<String>,
    pub body: EventBody,
}

/// `GET /api/events`: newest first; `next_page` continues with `?starting_after=` it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList {
    pub events: Vec<EventView>,
    pub has_more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page: Option<String>,
}

/// `POST /api/events/recovery`: every event made since `since` that the shop never received is
/// sent again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EventRecovery {
    /// RFC 3339: events made at or after it.
    #[cfg_attr(feature = "openapi", schema(example = "2026-12-05T10:00:00Z"))]
    pub since: String,
    /// The delivered ones too (a shop that lost its own records); default: only the `dead`.
    #[serde(default)]
    pub include_delivered: bool,
}

/// What `POST /api/events/recovery` queued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventsRecovered {
    /// Events sent again (each with its `webhook-id`, in its object's order).
    pub recovered: i64,
    /// `since`, as the checkout read it (UTC).
    pub since: String,
}

/// A shop's webhook endpoint in the key's mode: `GET /api/webhook-endpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookEndpoint {
    /// Where events are sent; `null`: nowhere (they are kept as `no_endpoint`).
    pub url: Option<String>,
    /// The event types it takes; empty: every type. Others are kept as `filtered`. A
    /// `webhook.test` always reaches it.
    pub event_types: Vec<String>,
    /// `false` once disabled, by its owner or by the checkout after it failed for days without a
    /// success (then a `webhook_endpoint.disabled` event is in the list and its owners are
    /// mailed); events wait as `no_endpoint` and go to it when it is enabled again.
    pub enabled: bool,
    /// RFC 3339: when it was disabled.
    pub disabled_at: Option<String>,
    pub disabled_reason: Option<String>,
    /// RFC 3339: its first failure since its last success, while it is failing.
    pub failing_since: Option<String>,
    /// RFC 3339: until when the rolled signing secret still signs beside the new one.
    pub old_signing_secret_expires_at: Option<String>,
    pub livemode: bool,
}

/// `POST /api/webhook-endpoint`: what to change; a field left out stays as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateWebhookEndpoint {
    /// An `https` URL (`http` only to a loopback address); `""` removes the endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// Among `payment.succeeded`, `refund.succeeded`, `checkout_session.expired`; `[]`: every type.
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// `false` disables it; `true` enables it, and what it missed is sent.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `POST /api/webhook-endpoint/signing-secret`: a new signing secret for the key's mode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RollSigningSecret {
    /// Seconds the old secret still signs beside the new one (every event then carries both
    /// signatures), at most 604 800 (7 days); 0 (default): it stops now.
    #[serde(default)]
    pub overlap_secs: u64,
}

/// The new signing secret, shown in this answer and on the owner's dashboard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SigningSecretRolled {
    pub signing_secret: String,
    /// RFC 3339: until when the old one signs too; `null`: it stopped.
    pub old_signing_secret_expires_at: Option<String>,
}

/// `POST /api/webhook-endpoint/test-event`: the test event written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestEventSent {
    pub event_id: String,
}

/// One attempt to deliver an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryAttempt {
    /// 1 for the first attempt (counted again from 1 after a redelivery or a recovery).
    pub attempt: i64,
    pub url: String,
    /// RFC 3339: when it was sent.
    pub at: String,
    /// The HTTP status answered; `null`: none came (a timeout, a refused connection).
    pub status: Option<i64>,
    pub latency_ms: i64,
    /// The answer's first 200 bytes, or why there was none.
    pub excerpt: String,
}

/// `GET /api/events/{event_id}/attempts`: every attempt, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryAttempts {
    pub attempts: Vec<DeliveryAttempt>,
}

/// `POST /api/shoppers` (sign-up) and `POST /api/shoppers/sign-in`: a live shopper's e-mail and
/// password, sent only to the checkout's own origin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ShopperCredentials {
    pub email: String,
    pub password: String,
}

/// `POST /api/shoppers`: a live shopper signs up with an e-mail, and a password (or none: the
/// account is then entered with a passkey, made right after the code, or by a recovery).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignUp {
    pub email: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// `POST /api/shoppers/confirm`: the code mailed to the address at sign-up; right, it makes the
/// account (with the password chosen at sign-up) and signs it in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EmailCode {
    pub email: String,
    /// Six digits.
    pub code: String,
}

/// `POST /api/shoppers/recovery`: a code to the confirmed address, for a new password.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RecoveryRequest {
    pub email: String,
}

/// `POST /api/shoppers/recovery/confirm`: the recovery code and a new password (or none: the
/// shopper makes a new passkey next, signed in by this); every earlier sign-in of the account
/// ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Recovery {
    pub email: String,
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// A WebAuthn challenge: `options` go to `navigator.credentials.create()` (a new passkey) or
/// `.get()` (a sign-in) as they are (`{"publicKey": …}`, in WebAuthn's JSON form); the answer
/// comes back with `ceremony_id` within five minutes, once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PasskeyChallenge {
    pub ceremony_id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: serde_json::Value,
}

/// The browser's answer to a [`PasskeyChallenge`]: `credential` is `PublicKeyCredential.toJSON()`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PasskeyAnswer {
    pub ceremony_id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub credential: serde_json::Value,
}

/// One of a live shopper's passkeys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PasskeyView {
    /// The credential id (base64url).
    pub passkey_id: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
}

/// `GET /api/shoppers/passkeys`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PasskeyList {
    pub passkeys: Vec<PasskeyView>,
}

/// The answer to a sign-up or a recovery request, the same whatever the address is (new, taken,
/// unknown): a mail went to it, and what it says is for the address's owner only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeSent {
    /// `"code_sent"`.
    pub status: String,
    /// How long a code lives, in seconds.
    pub expires_in: u64,
}
