//! Rust values from what the browser's `JSON.parse` gave, for serde's derived `Deserialize`.
//!
//! serde-wasm-bindgen does this too, but its errors say what went wrong ("invalid type:
//! floating point `1.5`, expected struct Payment"), and saying it links float printing and the
//! name of every type into the widget: about 8 KB gzipped of a 120 KB budget. The widget never
//! shows such a message (an answer it cannot read is an answer it cannot read), so this
//! decoder's one error says nothing, and the compiler drops the rest.
//! Serialization stays serde-wasm-bindgen's (`json::to_js`).

use std::fmt;

use serde::de::value::StringDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};
use wasm_bindgen::{JsCast, JsValue};

/// The value did not have the shape of the type asked for.
#[derive(Debug)]
pub struct Malformed;

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value of another shape")
    }
}

impl std::error::Error for Malformed {}

impl de::Error for Malformed {
    fn custom<T: fmt::Display>(_why: T) -> Self {
        Malformed
    }
}

/// The largest integer a JSON number (a double) holds exactly: money in kopecks stays below it.
const MAX_EXACT: f64 = 9_007_199_254_740_991.0;

/// A value as `JSON.parse` made it: null, a boolean, a number, a string, an array or an object.
pub struct Value(pub JsValue);

fn text(value: JsValue) -> StringDeserializer<Malformed> {
    value.as_string().unwrap_or_default().into_deserializer()
}

impl<'de> Deserializer<'de> for Value {
    type Error = Malformed;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Malformed> {
        let value = self.0;
        if value.is_null() || value.is_undefined() {
            return visitor.visit_unit();
        }
        if let Some(flag) = value.as_bool() {
            return visitor.visit_bool(flag);
        }
        if let Some(number) = value.as_f64() {
            if number.fract() == 0.0 && number.abs() <= MAX_EXACT {
                return if number < 0.0 {
                    visitor.visit_i64(number as i64)
                } else {
                    visitor.visit_u64(number as u64)
                };
            }
            return visitor.visit_f64(number);
        }
        if let Some(string) = value.as_string() {
            return visitor.visit_string(string);
        }
        if js_sys::Array::is_array(&value) {
            let items: js_sys::Array = value.unchecked_into();
            return visitor.visit_seq(Items { items, next: 0 });
        }
        if value.is_object() {
            let entries = js_sys::Object::entries(value.unchecked_ref());
            return visitor.visit_map(Fields {
                entries: Items {
                    items: entries,
                    next: 0,
                },
                value: None,
            });
        }
        Err(Malformed)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Malformed> {
        if self.0.is_null() || self.0.is_undefined() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Malformed> {
        visitor.visit_newtype_struct(self)
    }

    /// As serde writes enums: a unit variant is its name; any other, `{"name": content}`.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Malformed> {
        if self.0.as_string().is_some() {
            return visitor.visit_enum(text(self.0));
        }
        if !self.0.is_object() || js_sys::Array::is_array(&self.0) {
            return Err(Malformed);
        }
        let entries = js_sys::Object::entries(self.0.unchecked_ref());
        if entries.length() != 1 {
            return Err(Malformed);
        }
        let entry: js_sys::Array = entries.get(0).unchecked_into();
        visitor.visit_enum(Variant {
            name: entry.get(0),
            content: entry.get(1),
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// An array's items, in turn (an object's entries are `[name, value]` arrays of it).
struct Items {
    items: js_sys::Array,
    next: u32,
}

impl Iterator for Items {
    type Item = JsValue;

    fn next(&mut self) -> Option<JsValue> {
        (self.next < self.items.length()).then(|| {
            self.next += 1;
            self.items.get(self.next - 1)
        })
    }
}

impl<'de> SeqAccess<'de> for Items {
    type Error = Malformed;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Malformed> {
        self.next()
            .map(|item| seed.deserialize(Value(item)))
            .transpose()
    }
}

struct Fields {
    entries: Items,
    value: Option<JsValue>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = Malformed;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Malformed> {
        let Some(entry) = self.entries.next() else {
            return Ok(None);
        };
        let entry: js_sys::Array = entry.unchecked_into();
        self.value = Some(entry.get(1));
        seed.deserialize(text(entry.get(0))).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Malformed> {
        seed.deserialize(Value(self.value.take().ok_or(Malformed)?))
    }
}

struct Variant {
    name: JsValue,
    content: JsValue,
}

impl<'de> EnumAccess<'de> for Variant {
    type Error = Malformed;
    type Variant = Value;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Value), Malformed> {
        Ok((seed.deserialize(text(self.name))?, Value(self.content)))
    }
}

impl<'de> VariantAccess<'de> for Value {
    type Error = Malformed;

    fn unit_variant(self) -> Result<(), Malformed> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Malformed> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Malformed> {
        self.deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Malformed> {
        self.deserialize_any(visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::{Phase, RetryReason};
    use checkout_shared::{ErrorCode, Payment, PaymentStatus, Problem};
    use serde::de::DeserializeOwned;
    use wasm_bindgen_test::*;

    wasm_bindgen_test_configure!(run_in_browser);

    fn decode<T: DeserializeOwned>(text: &str) -> Option<T> {
        T::deserialize(Value(js_sys::JSON::parse(text).ok()?)).ok()
    }

    /// Whatever serde_json writes, this reads back the same (serde_json is the reference).
    fn same<T: serde::Serialize + DeserializeOwned + PartialEq + fmt::Debug>(value: T) {
        let text = serde_json::to_string(&value).unwrap();
        assert_eq!(decode::<T>(&text).as_ref(), Some(&value), "{text}");
    }

    #[wasm_bindgen_test]
    fn reads_back_what_serde_writes() {
        let mut problem = Problem::new(402, ErrorCode::InsufficientFunds, "short");
        problem.balance = Some(-5);
        same(problem);
        same(Payment {
            payment_id: "pay_1".into(),
            checkout_session_id: None,
            order_id: "ORD-1".into(),
            amount: 9_007_199_254_740_991,
            currency: "RUB".into(),
            status: PaymentStatus::Succeeded,
            balance: Some(0),
            created_at: "2026-12-03T10:00:00Z".into(),
            livemode: true,
        });
        same::<Phase<Payment>>(Phase::Created);
        same::<Phase<Payment>>(Phase::Retrying {
            attempt: 3,
            reason: RetryReason::ServerError,
        });
        same::<Phase<Payment>>(Phase::Failed {
            message: "«нет»".into(),
            retryable: true,
        });
        same(vec![Some(1_u32), None, Some(3)]);
    }

    #[wasm_bindgen_test]
    fn refuses_values_of_another_shape_and_reads_codes_it_does_not_know() {
        assert_eq!(decode::<i64>("1.5"), None);
        assert_eq!(decode::<u32>("-1"), None);
        assert_eq!(decode::<String>("7"), None);
        assert_eq!(
            decode::<Phase<Payment>>("{\"created\":{},\"failed\":{}}"),
            None
        );
        assert_eq!(decode::<Payment>("{\"payment_id\":\"pay_1\"}"), None);
        let problem: Problem = decode(
            "{\"type\":\"about:blank\",\"title\":\"t\",\"status\":409,\"detail\":\"d\",\"code\":\"brand_new\"}",
        )
        .unwrap();
        assert_eq!(problem.code, ErrorCode::Unknown);
    }
}
