//! The checkout widget.
//!
//! - [`intent`]: the key lifecycle and retry policy, plain Rust, tested natively;
//! - [`checkout`]: the widget's state (cart, payment, refunds) and its Russian status lines;
//! - `app`, `api`, `storage` (wasm32 only): the Leptos component wiring that state to signals,
//!   `sessionStorage` and the network.

pub mod checkout;
pub mod intent;

#[cfg(target_arch = "wasm32")]
mod api;
#[cfg(target_arch = "wasm32")]
mod app;
#[cfg(target_arch = "wasm32")]
pub mod storage;

#[cfg(target_arch = "wasm32")]
pub use app::start;
