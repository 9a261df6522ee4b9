//! Keyed requests over HTTP: a handler hands its validated operation to the protocol
//! (`checkout-idempotency`) and gets back the HTTP answer of its outcome. And how the API's
//! document describes every keyed POST alike: its `Idempotency-Key` header and the problems
//! any of them may answer.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use checkout_idempotency::{KeyedRequest, Operation, Outcome, StoredResponse};
use checkout_shared::{
    IDEMPOTENCY_KEY_EXPIRES_HEADER, IDEMPOTENT_REPLAYED_HEADER, IdempotencyKey,
    PROBLEM_CONTENT_TYPE, Problem,
};
use serde_json::Value;
use tracing::Span;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::response::{Response as DocResponse, ResponseBuilder};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required};
use utoipa::{IntoParams, IntoResponses};

use crate::api::AppState;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::store::Tx;

/// How a keyed request was answered. Recorded on the request's trace span and set as a
/// response extension, for whatever wraps the router (logs, a test's fault injection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    /// Executed now.
    First,
    /// The stored answer of an earlier execution.
    Replay,
    /// The key's first request is still executing (`409`).
    Conflict,
    /// The key was first used for another request (`422`).
    Mismatch,
}

impl KeyOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyOutcome::First => "first",
            KeyOutcome::Replay => "replay",
            KeyOutcome::Conflict => "conflict",
            KeyOutcome::Mismatch => "mismatch",
        }
    }
}

/// What a keyed POST asks: its route (as the client sent it) and its request in canonical
/// form (typed, defaults applied: the fingerprint's input); and, for a request that creates
/// something readable, where it can be read (`Location` of a `201`, from the stored body).
pub struct Asked<'a> {
    pub route: &'a str,
    pub body: &'a Value,
    pub location: Option<fn(&Value) -> Option<String>>,
}

/// Runs `operation` once per (principal, key) and answers every copy of the request. Every
/// answer about a key the server keeps says when it will be forgotten
/// (`Idempotency-Key-Expires`).
pub async fn execute<O>(
    app: &AppState,
    principal: &Principal,
    key: &IdempotencyKey,
    asked: Asked<'_>,
    operation: O,
) -> Result<Response, OperationError>
where
    O: Operation<Tx, Error = OperationError>,
{
    // A bound on what one principal may have executing (a flood of fresh keys queues nowhere).
    let _in_progress = app.limits.key_in_progress(&principal.account_id)?;
    let request = KeyedRequest {
        scope: &principal.account_id,
        key: key.as_str(),
        method: "POST",
        route: asked.route,
        body: asked.body,
    };
    let outcome = app.protocol.execute(&app.store, request, operation).await?;
    Ok(match outcome {
        Outcome::Executed {
            response,
            expires_at_ms,
        } => {
            if response.status >= 400
                && let Ok(problem) = serde_json::from_str::<Problem>(&response.body)
            {
                crate::metrics::decline(problem.code.as_str());
            } else {
                // A payment or a refund wrote its event with the money: send it now, not at
                // the delivery worker's next look.
                app.deliveries.notify_one();
            }
            let response = located(
                answer(response.clone(), KeyOutcome::First),
                &response,
                &asked,
            );
            expiring(response, expires_at_ms)
        }
        Outcome::Replayed {
            response,
            expires_at_ms,
        } => {
            let response = located(
                answer(response.clone(), KeyOutcome::Replay),
                &response,
                &asked,
            );
            expiring(response, expires_at_ms)
        }
        Outcome::KeyReused {
            fields,
            expires_at_ms,
        } => expiring(
            with_outcome(
                OperationError::KeyReused(fields).into_response(),
                KeyOutcome::Mismatch,
            ),
            expires_at_ms,
        ),
        Outcome::InUse => with_outcome(
            OperationError::KeyInUse.into_response(),
            KeyOutcome::Conflict,
        ),
        Outcome::TryAgain => OperationError::Contended.into_response(),
    })
}

/// `Location` of what a `201` created, read from its stored body.
fn located(mut response: Response, stored: &StoredResponse, asked: &Asked<'_>) -> Response {
    if stored.status != StatusCode::CREATED.as_u16() {
        return response;
    }
    let location = asked.location.and_then(|locate| {
        let body: Value = serde_json::from_str(&stored.body).ok()?;
        locate(&body)
    });
    if let Some(value) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// `Idempotency-Key-Expires`, as an IMF-fixdate (HTTP's date format).
fn expiring(mut response: Response, expires_at_ms: i64) -> Response {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(expires_at_ms).unwrap_or(0));
    if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
        response
            .headers_mut()
            .insert(IDEMPOTENCY_KEY_EXPIRES_HEADER, value);
    }
    response
}

/// A stored answer as HTTP: its status and body byte for byte, and on a replay the header that
/// says so.
fn answer(stored: StoredResponse, outcome: KeyOutcome) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_CONTENT_TYPE
    };
    let mut response =
        (status, [(header::CONTENT_TYPE, content_type)], stored.body).into_response();
    if outcome == KeyOutcome::Replay {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    with_outcome(response, outcome)
}

fn with_outcome(mut response: Response, outcome: KeyOutcome) -> Response {
    Span::current().record("idempotency", outcome.as_str());
    response.extensions_mut().insert(outcome);
    response
}

/// The answers every keyed POST may give besides its own: a bad request, no credential, the
/// key in flight, the key reused for another request, the database away. Declared once; each
/// keyed operation lists this, then what is particular to it (a later entry of the same status
/// wins, so an operation's own `409` is what its document says).
pub struct KeyedProblems;

impl IntoResponses for KeyedProblems {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        [
            ("400", "`invalid_request`: a malformed body, header or key"),
            ("401", "`unauthorized`: no valid bearer credential"),
            ("409", "`idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`)"),
            ("422", "`idempotency_key_reused`: this key was first used with another request"),
            ("503", "`service_unavailable`: the database is unavailable; nothing was done, retry with the same key"),
        ]
        .into_iter()
        .map(|(status, description)| (status.to_owned(), RefOr::T(problem(description))))
        .collect()
    }
}

/// A problem+json answer with this description.
pub fn problem(description: &str) -> DocResponse {
    ResponseBuilder::new()
        .description(description)
        .content(
            checkout_shared::PROBLEM_CONTENT_TYPE,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

/// The `Idempotency-Key` header every keyed POST takes.
pub struct IdempotencyKeyParam;

impl IntoParams for IdempotencyKeyParam {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            ParameterBuilder::new()
                .name(checkout_shared::IDEMPOTENCY_KEY_HEADER)
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(
                    "Names one intent: 1–255 visible ASCII characters (a UUID v4 is usual). Resend the same key with the same body on every retry; a new intent gets a new key.",
                ))
                .schema(Some(
                    utoipa::openapi::ObjectBuilder::new()
                        .schema_type(utoipa::openapi::schema::Type::String),
                ))
                .build(),
        ]
    }
}
