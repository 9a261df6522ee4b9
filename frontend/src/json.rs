//! JSON text ⇄ Rust values. In the browser through the browser's own `JSON` (with
//! serde-wasm-bindgen between its values and Rust's types), so that the widget does not carry
//! `serde_json`'s parser and printer; natively (the tests of the plain-Rust state) `serde_json`.

use serde::Serialize;
use serde::de::DeserializeOwned;

#[cfg(target_arch = "wasm32")]
pub fn from_str<T: DeserializeOwned>(text: &str) -> Option<T> {
    let value = js_sys::JSON::parse(text).ok()?;
    serde_wasm_bindgen::from_value(value).ok()
}

#[cfg(target_arch = "wasm32")]
pub fn to_string<T: Serialize>(value: &T) -> Option<String> {
    js_sys::JSON::stringify(&to_js(value)?).ok()?.as_string()
}

/// As the browser's `JSON.parse` would give it (objects, not `Map`s).
#[cfg(target_arch = "wasm32")]
pub fn to_js<T: Serialize>(value: &T) -> Option<wasm_bindgen::JsValue> {
    value
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .ok()
}

#[cfg(not(target_arch = "wasm32"))]
pub fn from_str<T: DeserializeOwned>(text: &str) -> Option<T> {
    serde_json::from_str(text).ok()
}

#[cfg(not(target_arch = "wasm32"))]
pub fn to_string<T: Serialize>(value: &T) -> Option<String> {
    serde_json::to_string(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkout_shared::{ErrorCode, Problem};

    #[test]
    fn round_trips_and_refuses_what_is_not_json() {
        let problem = Problem::new(402, ErrorCode::InsufficientFunds, "short");
        let text = to_string(&problem).unwrap();
        assert_eq!(from_str::<Problem>(&text), Some(problem));
        assert_eq!(from_str::<Problem>("{\"status\":"), None);
    }
}
