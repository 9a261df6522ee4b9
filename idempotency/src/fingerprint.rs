//! What makes two requests "the same request": SHA-256 over the method, the route and the
//! canonical JSON body.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 over the method, the route and the canonical JSON body: reordering JSON fields or
/// changing whitespace is the same request; changing a value or the route is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(method: &str, route: &str, body: &Value) -> Self {
        Fingerprint::of_canonical(method, route, &canonical_json(body))
    }

    /// The same, from a body already in canonical form.
    pub fn of_canonical(method: &str, route: &str, canonical_body: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update(b" ");
        hasher.update(route.as_bytes());
        hasher.update(b"\n");
        hasher.update(canonical_body.as_bytes());
        Fingerprint(format!("{:x}", hasher.finalize()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The top-level fields whose values differ between a first request's canonical body and
/// another request's body (present in one and not the other counts), sorted. Bodies that are
/// not objects have no fields to name.
pub fn differing_fields(first_canonical: &str, other: &Value) -> Vec<String> {
    let Ok(Value::Object(first)) = serde_json::from_str::<Value>(first_canonical) else {
        return Vec::new();
    };
    let Value::Object(other) = other else {
        return Vec::new();
    };
    let mut fields: Vec<String> = first
        .keys()
        .chain(other.keys())
        .filter(|name| first.get(*name) != other.get(*name))
        .cloned()
        .collect();
    fields.sort_unstable();
    fields.dedup();
    fields
}

/// JSON with object keys sorted and no insignificant whitespace. Sorted here rather than
/// trusting `serde_json::Map`'s order, which a `preserve_order` feature elsewhere could change.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// Writes into `out` directly: every key and scalar of every request's body passes here, and
/// a `String` made for each one was half of a fingerprint's time.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_serialized(serde_json::to_writer(&mut *out, key));
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_serialized(serde_json::to_writer(&mut *out, scalar)),
    }
}

fn write_serialized(written: serde_json::Result<()>) {
    // Writing to a Vec cannot fail, and a string, number, bool or null always serializes.
    written.expect("a JSON scalar serializes");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn field_order_and_whitespace_do_not_change_the_fingerprint() {
        let a: Value = serde_json::from_str(r#"{"order_id":"o-1","amount":300}"#).unwrap();
        let b: Value =
            serde_json::from_str("{ \"amount\" : 300,\n \"order_id\" : \"o-1\" }").unwrap();
        assert_eq!(
            Fingerprint::of("POST", "/api/payments", &a),
            Fingerprint::of("POST", "/api/payments", &b)
        );
        assert_eq!(canonical_json(&a), r#"{"amount":300,"order_id":"o-1"}"#);
    }

    #[test]
    fn differing_fields_are_named_never_their_values() {
        let first = canonical_json(&json!({"order_id": "o-1", "amount": 300, "currency": "RUB"}));
        assert_eq!(
            differing_fields(
                &first,
                &json!({"currency": "RUB", "order_id": "o-1", "amount": 5000})
            ),
            ["amount"]
        );
        assert_eq!(
            differing_fields(&first, &json!({"order_id": "o-2", "amount": 300})),
            ["currency", "order_id"]
        );
        assert!(
            differing_fields(
                &first,
                &json!({"order_id": "o-1", "amount": 300, "currency": "RUB"})
            )
            .is_empty()
        );
        assert!(differing_fields(&first, &json!([1])).is_empty());
    }

    #[test]
    fn values_routes_and_methods_do_change_it() {
        let body = json!({"amount": 300});
        let base = Fingerprint::of("POST", "/api/payments/p1/refunds", &body);
        assert_ne!(
            base,
            Fingerprint::of("POST", "/api/payments/p1/refunds", &json!({"amount": 301}))
        );
        assert_ne!(
            base,
            Fingerprint::of("POST", "/api/payments/p2/refunds", &body)
        );
        assert_ne!(
            base,
            Fingerprint::of("PUT", "/api/payments/p1/refunds", &body)
        );
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Serializes objects with their keys in reverse order: another spelling of the same JSON.
    fn reversed(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| b.0.cmp(a.0));
                let parts: Vec<String> = entries
                    .into_iter()
                    .map(|(k, v)| format!("{} : {}", Value::String(k.clone()), reversed(v)))
                    .collect();
                format!("{{ {} }}", parts.join(" , "))
            }
            Value::Array(items) => {
                format!(
                    "[ {} ]",
                    items.iter().map(reversed).collect::<Vec<_>>().join(" , ")
                )
            }
            scalar => scalar.to_string(),
        }
    }

    proptest! {
        #[test]
        fn canonical_form_is_the_same_however_the_json_is_spelled(value in json_value()) {
            let respelled: Value = serde_json::from_str(&reversed(&value)).unwrap();
            prop_assert_eq!(canonical_json(&respelled), canonical_json(&value));
            prop_assert_eq!(Fingerprint::of("POST", "/r", &respelled), Fingerprint::of("POST", "/r", &value));
        }

        #[test]
        fn canonical_form_parses_back_to_the_same_value(value in json_value()) {
            let reparsed: Value = serde_json::from_str(&canonical_json(&value)).unwrap();
            prop_assert_eq!(reparsed, value);
        }
    }
}
