//! The checkout widget.
//!
//! - [`intent`]: the key lifecycle, retry policy and expiry-aware resume, plain Rust, tested
//!   natively;
//! - [`checkout`]: the widget's state (cart, payment, refunds), its versioned saved form and
//!   recovery from a state that cannot be read, and its Russian status lines;
//! - [`messages`]: every refusal the shopper reads, in Russian, by problem `code`;
//! - [`json`]: JSON text ⇄ Rust values (the browser's own `JSON` in the browser; `decode`, its
//!   message-less serde decoder, keeps the widget small);
//! - `app`, `api`, `storage`, `tabs` (wasm32 only): the Leptos component wiring that state to
//!   signals, `sessionStorage`, the other tabs (Web Locks, BroadcastChannel) and the network.

pub mod checkout;
pub mod intent;
pub mod json;
pub mod messages;

#[cfg(target_arch = "wasm32")]
mod api;
#[cfg(target_arch = "wasm32")]
mod app;
#[cfg(target_arch = "wasm32")]
mod decode;
#[cfg(target_arch = "wasm32")]
mod shopper;
#[cfg(target_arch = "wasm32")]
pub mod storage;
#[cfg(target_arch = "wasm32")]
mod tabs;

#[cfg(target_arch = "wasm32")]
pub use app::{CheckoutWidget, start};

/// For a shop's page: `import init, { mount } from "…/checkout-frontend.js"; await init();
/// mount(element, "cs_…")`. (A `<div data-checkout-session="cs_…">` is mounted on its own.)
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(js_name = mount)]
pub fn mount(host: web_sys::HtmlElement, session_id: String) {
    app::mount(host, session_id);
}
