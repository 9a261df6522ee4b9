//! The answers an operation stores under its key: a success, or a decline that is the key's
//! outcome. Stored as text, so that a replay is the first answer byte for byte.

use checkout_idempotency::StoredResponse;
use checkout_shared::Problem;
use serde::Serialize;

/// A success to store under the key.
pub fn created(value: &impl Serialize) -> StoredResponse {
    StoredResponse {
        status: 201,
        body: serde_json::to_string(value).expect("responses serialize"),
    }
}

/// A decline that is the outcome of the key (`402`, `409 order_already_paid`, …): stored and
/// replayed like a success, so that a retry gets the same answer.
pub fn declined(problem: &Problem) -> StoredResponse {
    StoredResponse {
        status: problem.status,
        body: serde_json::to_string(problem).expect("problems serialize"),
    }
}
