//! The checkout's wire contract, shared by the server and the widget.
//!
//! Serde only, so it builds for `wasm32-unknown-unknown`: the widget and the server can never
//! disagree about a field name, an error code or what a valid idempotency key is.

pub mod api;
pub mod broker;
pub mod key;
pub mod money;
pub mod problem;

pub use api::{
    Account, CheckoutSession, CheckoutSessionStatus, CodeSent, CreateCheckoutSession,
    CreatePayment, CreateRefund, DeliveryAttempt, DeliveryAttempts, DemoCart, DemoSession,
    EVENTS_EXCHANGE, EmailCode, EventBody, EventList, EventRecovery, EventView, EventsRecovered,
    KeyState, KeyStatus, LineItem, PasskeyAnswer, PasskeyChallenge, PasskeyList, PasskeyView,
    Payment, PaymentDetails, PaymentStatus, Recovery, RecoveryRequest, Refund, RollSigningSecret,
    ShopView, ShopperCredentials, ShopperToken, SignUp, SigningSecretRolled, TestEventSent,
    UpdateWebhookEndpoint, WebhookEndpoint,
};
pub use key::{
    IDEMPOTENCY_KEY_EXPIRES_HEADER, IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER,
    IdempotencyKey, KeyError,
};
pub use money::{
    MAX_AMOUNT, format_rub, parse_rub, validate_amount, validate_currency, validate_order_id,
};
pub use problem::{ErrorCode, PROBLEM_CONTENT_TYPE, Problem};
