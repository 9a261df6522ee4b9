//! `sessionStorage`: the intent and its key outlive refreshes of this tab, and nothing else.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The demo shopper's session (token and account id).
pub const SESSION: &str = "checkout.session";
/// The widget's state: the cart, the payment intent with its key, the refunds.
pub const STATE: &str = "checkout.state";

fn session_storage() -> Option<web_sys::Storage> {
    web_sys::window()?.session_storage().ok()?
}

pub fn load<T: DeserializeOwned>(name: &str) -> Option<T> {
    let text = session_storage()?.get_item(name).ok()??;
    serde_json::from_str(&text).ok()
}

/// Written synchronously, before any request that depends on it leaves the page.
pub fn save<T: Serialize>(name: &str, value: &T) {
    if let (Some(storage), Ok(text)) = (session_storage(), serde_json::to_string(value)) {
        let _ = storage.set_item(name, &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkout::{Checkout, Seed};
    use wasm_bindgen_test::*;

    wasm_bindgen_test_configure!(run_in_browser);

    #[wasm_bindgen_test]
    fn the_checkout_round_trips_through_session_storage() {
        let checkout = Checkout::new(
            2,
            Seed {
                key: [3; 16],
                order: [4; 4],
            },
        );
        save("test.checkout", &checkout);
        assert_eq!(load::<Checkout>("test.checkout"), Some(checkout));
        assert_eq!(load::<Checkout>("test.absent"), None);
    }
}
