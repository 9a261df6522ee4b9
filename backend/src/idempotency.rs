//! The idempotency protocol, shared by payments and refunds.
//!
//! Exactly-once = at-least-once delivery (the client retries with the same key) + this
//! receiver. In ONE transaction of the database that holds the money:
//!
//! 1. claim the key (`INSERT … ON CONFLICT`): the primary key, not an `if`, settles races;
//! 2. make the business change with a guarded `UPDATE` whose affected rows are checked;
//! 3. write the ledger row, which carries the key;
//! 4. store the response under the key and mark it done;
//! 5. `COMMIT`.
//!
//! A crash before 5 leaves no trace, so a retry runs afresh; after it, a retry replays the
//! stored response byte for byte. A key that is already taken answers from storage: the same
//! request replays, another request under that key is `422`, one still executing is `409`.

use axum::extract::FromRequestParts;
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use checkout_shared::{
    IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER, IdempotencyKey, Problem,
};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tracing::Span;

use crate::AppState;
use crate::accounts::Principal;
use crate::error::ApiError;
use crate::store::{Claim, StoreError, StoredKey, Tx};
use crate::{clock, faults, payments, refunds};

/// A transaction that lost a race it can simply run again (a concurrent payment of the same
/// order, a serialization failure) is retried this many times in all before `503`.
const MAX_ATTEMPTS: usize = 3;

/// What a keyed request asks for, run inside the protocol's transaction.
#[derive(Debug)]
pub enum Operation {
    Charge(payments::Charge),
    Refund(refunds::RefundOrder),
}

/// What the business step decided.
pub enum Decision {
    /// Store this answer under the key and commit.
    Respond(StoredResponse),
    /// Roll back and run the whole transaction again: a race was lost that the next attempt
    /// will see the outcome of (e.g. the order was paid by a concurrent request meanwhile).
    Restart,
}

/// A status and body exactly as first sent, so that a replay is byte-identical.
#[derive(Clone, Debug)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub body: String,
}

impl StoredResponse {
    pub fn json(status: StatusCode, value: &impl Serialize) -> Self {
        StoredResponse {
            status,
            body: serde_json::to_string(value).expect("responses serialize"),
        }
    }

    /// A decline that is part of the outcome (`402`, `409 order_already_paid`, …): stored and
    /// replayed like a success, so a retry gets the same answer.
    pub fn problem(problem: &Problem) -> Self {
        StoredResponse {
            status: StatusCode::from_u16(problem.status).expect("problem status is valid"),
            body: serde_json::to_string(problem).expect("problems serialize"),
        }
    }

    fn into_response(self, replayed: bool) -> Response {
        let content_type = if self.status.is_success() {
            "application/json"
        } else {
            checkout_shared::PROBLEM_CONTENT_TYPE
        };
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, content_type)],
            self.body,
        )
            .into_response();
        if replayed {
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED_HEADER, HeaderValue::from_static("true"));
        }
        response
    }
}

/// Runs `operation` at most once per (account, key) and answers every copy of the request.
pub async fn execute(
    app: &AppState,
    principal: &Principal,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    operation: &Operation,
) -> Result<Response, ApiError> {
    let account_id = principal.account_id.as_str();
    let ttl_ms = i64::try_from(app.key_ttl.as_millis()).unwrap_or(i64::MAX);

    // A completed key is answered from a plain read: replays take no write lock at all.
    if let Some(stored) = app.store.stored_key(account_id, key.as_str()).await?
        && stored.created_at >= clock::now_ms().saturating_sub(ttl_ms)
    {
        return answer_from_storage(stored, fingerprint);
    }

    for _attempt in 0..MAX_ATTEMPTS {
        if faults::claim_finds_key_in_flight(account_id, key.as_str()) {
            record_outcome("conflict");
            return Err(ApiError::KeyInUse);
        }
        let mut tx = app.store.begin_keyed().await?;
        let now_ms = clock::now_ms();
        let claim = Claim {
            account_id,
            key: key.as_str(),
            claim_id: uuid::Uuid::new_v4().simple().to_string(),
            request_hash: fingerprint.as_str(),
            now_ms,
        };

        // 1. Claim the key, or learn who has it.
        match tx.claim_key(&claim, now_ms.saturating_sub(ttl_ms)).await {
            Ok(true) => {}
            Ok(false) => {
                let stored = tx.stored_key(account_id, key.as_str()).await?;
                tx.rollback().await;
                match stored {
                    Some(stored) => return answer_from_storage(stored, fingerprint),
                    None => continue, // swept between the claim and the read: claim again
                }
            }
            Err(StoreError::Busy(_)) => {
                record_outcome("conflict");
                return Err(ApiError::KeyInUse);
            }
            Err(StoreError::Retry(_)) => continue,
            Err(error) => return Err(error.into()),
        }

        // 2–3. The guarded business change and its ledger row.
        let decision = match operation.apply(&mut tx, &claim).await {
            Err(ApiError::Store(StoreError::Retry(_))) => continue,
            other => other?,
        };
        let response = match decision {
            Decision::Respond(response) => response,
            Decision::Restart => {
                tx.rollback().await;
                continue;
            }
        };

        // 4–5. The response is stored with the key, and all of it commits at once.
        tx.complete_key(&claim, response.status.as_u16(), &response.body)
            .await?;
        faults::before_commit().await?;
        match tx.commit().await {
            Err(StoreError::Retry(_)) => continue,
            other => other?,
        }
        record_outcome("first");
        return Ok(faults::after_commit(response.into_response(false)).await);
    }
    Err(ApiError::Contended)
}

impl Operation {
    async fn apply(&self, tx: &mut Tx, claim: &Claim<'_>) -> Result<Decision, ApiError> {
        match self {
            Operation::Charge(charge) => payments::charge(tx, claim, charge).await,
            Operation::Refund(refund) => refunds::refund(tx, claim, refund).await,
        }
    }
}

fn answer_from_storage(stored: StoredKey, fingerprint: &Fingerprint) -> Result<Response, ApiError> {
    if stored.request_hash != fingerprint.as_str() {
        record_outcome("mismatch");
        return Err(ApiError::KeyReused);
    }
    match (
        stored.status.as_str(),
        stored.response_status,
        stored.response_body,
    ) {
        ("done", Some(status), Some(body)) => {
            record_outcome("replay");
            let status = u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Ok(StoredResponse { status, body }.into_response(true))
        }
        _ => {
            record_outcome("conflict");
            Err(ApiError::KeyInUse)
        }
    }
}

/// Notes on the request's trace span whether this was a `first` execution, a `replay`, a
/// `conflict` (in use) or a `mismatch` (key reused for another request).
fn record_outcome(outcome: &'static str) {
    Span::current().record("idempotency", outcome);
}

/// SHA-256 over the method, the route and the canonical JSON body: reordering JSON fields or
/// changing whitespace is the same request; changing a value or the route is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(method: &str, route: &str, body: &Value) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update(b" ");
        hasher.update(route.as_bytes());
        hasher.update(b"\n");
        hasher.update(canonical_json(body).as_bytes());
        Fingerprint(format!("{:x}", hasher.finalize()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// JSON with object keys sorted and no insignificant whitespace. Sorted here rather than
/// trusting `serde_json::Map`'s order, which a `preserve_order` feature elsewhere could change.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The `Idempotency-Key` header, required on every POST that moves money.
pub struct RequiredKey(pub IdempotencyKey);

impl<S: Send + Sync> FromRequestParts<S> for RequiredKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let mut values = parts.headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(ApiError::InvalidRequest(
                "send exactly one Idempotency-Key header: a key you made for this payment intent (a UUID v4 is ideal), the same on every retry".into(),
            ));
        };
        let text = value.to_str().map_err(|_| {
            ApiError::InvalidRequest(checkout_shared::KeyError::InvalidCharacter.to_string())
        })?;
        IdempotencyKey::parse(text)
            .map(RequiredKey)
            .map_err(|error| ApiError::InvalidRequest(error.to_string()))
    }
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
