//! The checkout widget.
//!
//! - [`intent`]: the key lifecycle, retry policy and expiry-aware resume, plain Rust, tested
//!   natively;
//! - [`checkout`]: the widget's state (cart, payment, refunds), its versioned saved form and
//!   recovery from a state that cannot be read, and its Russian status lines;
//! - [`messages`]: every refusal the shopper reads, in Russian, by problem `code`;
//! - [`json`]: JSON text ⇄ Rust values (the browser's own `JSON` in the browser; `decode`, its
//!   message-less serde decoder, keeps the widget small);
//! - `app`, `api`, `storage`, `tabs`, `frame` (wasm32 only): the Leptos component wiring that
//!   state to signals, `sessionStorage`, the other tabs (Web Locks, BroadcastChannel), the
//!   network, and the shop's page that framed it (`postMessage` to that one origin);
//! - `sign_in` (wasm32): a live payment page's «Войти» (it opens the account window and takes
//!   the sign-in back from it) and «Выйти»;
//! - [`account`] and `passkeys` (wasm32): the account window, `/account`, a binary of its own
//!   (`checkout-account`): the only page where a live shopper types a password or a code, or
//!   uses a passkey.
//!
//! The widget runs on the checkout's own origin, on the payment page `/pay/{session_id}`: in a
//! frame of the shop's page (made by `v1/checkout.js`), or as a full page that returns the
//! shopper to the shop. The shopper's credential never leaves this origin.

#[cfg(target_arch = "wasm32")]
#[global_allocator]
// SAFETY: the widget runs on the browser's one thread (no wasm threads are enabled).
static ALLOCATOR: talc::TalckWasm = unsafe { talc::TalckWasm::new_global() };

pub mod checkout;
pub mod intent;
pub mod json;
pub mod messages;

#[cfg(target_arch = "wasm32")]
pub mod account;
#[cfg(target_arch = "wasm32")]
mod api;
#[cfg(target_arch = "wasm32")]
mod app;
#[cfg(target_arch = "wasm32")]
mod decode;
#[cfg(target_arch = "wasm32")]
mod frame;
#[cfg(target_arch = "wasm32")]
mod passkeys;
#[cfg(target_arch = "wasm32")]
mod shopper;
#[cfg(target_arch = "wasm32")]
mod sign_in;
#[cfg(target_arch = "wasm32")]
pub mod storage;
#[cfg(target_arch = "wasm32")]
mod tabs;

#[cfg(target_arch = "wasm32")]
pub use app::start;
