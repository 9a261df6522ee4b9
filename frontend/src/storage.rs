//! `sessionStorage`: the intent and its key outlive refreshes of this tab, and nothing else.
//! What to make of a saved text is decided in plain Rust (`checkout::restore`); this is only
//! the browser's side of it.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The test shopper's token and account id.
pub const SESSION: &str = "checkout.session";
/// The live shopper's sign-in (token and account id), on this tab only.
pub const LIVE: &str = "checkout.live";
/// The widget's state, in its versioned envelope: the cart, the intents with their keys.
pub const STATE: &str = "checkout.state";
/// Prefix of a state that could not be read, kept aside (never overwritten) for inspection.
pub const UNREADABLE: &str = "checkout.state.unreadable.";

fn session_storage() -> Option<web_sys::Storage> {
    web_sys::window()?.session_storage().ok()?
}

pub fn read(name: &str) -> Option<String> {
    session_storage()?.get_item(name).ok()?
}

/// Written synchronously, before any request that depends on it leaves the page. `false` when
/// the browser refused (storage full, or disabled): the caller tells the shopper.
pub fn write(name: &str, text: &str) -> bool {
    session_storage().is_some_and(|storage| storage.set_item(name, text).is_ok())
}

pub fn load<T: DeserializeOwned>(name: &str) -> Option<T> {
    crate::json::from_str(&read(name)?)
}

pub fn save<T: Serialize>(name: &str, value: &T) -> bool {
    crate::json::to_string(value).is_some_and(|text| write(name, &text))
}

pub fn remove(name: &str) {
    if let Some(storage) = session_storage() {
        let _ = storage.remove_item(name);
    }
}

/// Keeps an unreadable state under a name of its own, so that the next save cannot erase it.
pub fn keep_aside(text: &str, now_ms: i64) -> bool {
    write(&format!("{UNREADABLE}{now_ms}"), text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkout::{Checkout, Read, Seed, read_saved, write_saved};
    use wasm_bindgen_test::*;

    wasm_bindgen_test_configure!(run_in_browser);

    #[wasm_bindgen_test]
    fn the_checkout_round_trips_through_session_storage() {
        let checkout = Checkout::new(Seed { key: [3; 16] }, 1_000);
        assert!(write("test.checkout", &write_saved(&checkout)));
        assert_eq!(
            read("test.checkout").map(|text| read_saved(&text)),
            Some(Read::Current(checkout))
        );
        assert_eq!(read("test.absent"), None);
        assert!(keep_aside("{\"broken", 7));
        assert_eq!(
            read(&format!("{UNREADABLE}7")).as_deref(),
            Some("{\"broken")
        );
    }
}
