//! JSON text ⇄ Rust values. In the browser through the browser's own `JSON` (decoded by
//! [`crate::decode`], encoded by serde-wasm-bindgen), so that the widget does not carry
//! `serde_json`'s parser and printer; natively (the tests of the plain-Rust state) `serde_json`.

use serde::Serialize;
use serde::de::DeserializeOwned;

#[cfg(target_arch = "wasm32")]
pub fn from_str<T: DeserializeOwned>(text: &str) -> Option<T> {
    parse(text)?.decode()
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

/// A JSON value read without knowing its shape, which is what salvaging a state this release
/// cannot read needs. In the browser it is the browser's own parse (decoding into
/// `serde_json::Value` cost the widget about 10 KB gzipped); natively `serde_json::Value`.
pub trait Node: Sized + Clone {
    fn field(&self, name: &str) -> Option<Self>;
    fn as_text(&self) -> Option<String>;
    /// The values of an object, or the items of an array (nothing for anything else).
    fn children(&self) -> Vec<Self>;
    fn decode<T: DeserializeOwned>(&self) -> Option<T>;
}

#[cfg(target_arch = "wasm32")]
pub type Tree = wasm_bindgen::JsValue;

#[cfg(not(target_arch = "wasm32"))]
pub type Tree = serde_json::Value;

#[cfg(target_arch = "wasm32")]
pub fn parse(text: &str) -> Option<Tree> {
    js_sys::JSON::parse(text).ok()
}

#[cfg(not(target_arch = "wasm32"))]
pub fn parse(text: &str) -> Option<Tree> {
    serde_json::from_str(text).ok()
}

#[cfg(target_arch = "wasm32")]
impl Node for wasm_bindgen::JsValue {
    fn field(&self, name: &str) -> Option<Self> {
        if !self.is_object() || js_sys::Array::is_array(self) {
            return None;
        }
        let value = js_sys::Reflect::get(self, &wasm_bindgen::JsValue::from_str(name)).ok()?;
        (!value.is_undefined()).then_some(value)
    }

    fn as_text(&self) -> Option<String> {
        self.as_string()
    }

    fn children(&self) -> Vec<Self> {
        use wasm_bindgen::JsCast;
        if js_sys::Array::is_array(self) {
            js_sys::Array::from(self).iter().collect()
        } else if self.is_object() {
            js_sys::Object::values(self.unchecked_ref())
                .iter()
                .collect()
        } else {
            Vec::new()
        }
    }

    fn decode<T: DeserializeOwned>(&self) -> Option<T> {
        T::deserialize(crate::decode::Value(self.clone())).ok()
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Node for serde_json::Value {
    fn field(&self, name: &str) -> Option<Self> {
        self.as_object()?.get(name).cloned()
    }

    fn as_text(&self) -> Option<String> {
        self.as_str().map(str::to_owned)
    }

    fn children(&self) -> Vec<Self> {
        match self {
            serde_json::Value::Array(items) => items.clone(),
            serde_json::Value::Object(map) => map.values().cloned().collect(),
            _ => Vec::new(),
        }
    }

    fn decode<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.clone()).ok()
    }
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
