//! Checkout sessions: a shop fixes what is paid for (order, amount, items) with its secret key
//! and an idempotency key of its own; the shopper's browser renders the session and pays it,
//! never naming an amount. One session per (shop, order); a session is paid at most once and
//! cannot be paid after it expires.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{
    CheckoutSession, CheckoutSessionStatus, CreateCheckoutSession, ErrorCode, LineItem, Problem,
    ShopView, validate_amount, validate_currency, validate_order_id,
};

use crate::accounts::Principal;
use crate::error::ApiError;
use crate::extract::{IdempotencyKeyHeader, JsonBody, SessionIdPath, not_a_session};
use crate::keyed::{self, Asked};
use crate::store::{NewSession, SessionRow, Tx};
use crate::{AppState, clock, ids};

pub const ROUTE: &str = "/api/checkout-sessions";
const MAX_ITEMS: usize = 100;
const MAX_TEXT: usize = 500;

/// A validated session request, made by a shop.
#[derive(Clone, Debug)]
pub struct NewCheckoutSession {
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    pub items: Vec<LineItem>,
    pub ttl: Duration,
}

impl NewCheckoutSession {
    pub fn validate(
        shop: &Principal,
        request: CreateCheckoutSession,
        ttl: Duration,
    ) -> Result<NewCheckoutSession, ApiError> {
        let invalid = ApiError::InvalidRequest;
        validate_order_id(&request.order_id).map_err(invalid)?;
        validate_amount(request.amount).map_err(invalid)?;
        let currency = request.currency.unwrap_or_else(|| shop.currency.clone());
        validate_currency(&currency).map_err(invalid)?;
        if currency != shop.currency {
            return Err(invalid(format!(
                "this shop is paid in {}, not {currency}",
                shop.currency
            )));
        }
        if let Some(description) = &request.description {
            text(description, "description")?;
        }
        let items = request.items.unwrap_or_default();
        if items.len() > MAX_ITEMS {
            return Err(invalid(format!("at most {MAX_ITEMS} items")));
        }
        let mut sum: i64 = 0;
        for item in &items {
            text(&item.name, "an item's name")?;
            if item.quantity == 0 || item.quantity > 1_000_000 {
                return Err(invalid("an item's quantity must be 1 to 1 000 000".into()));
            }
            validate_amount(item.unit_price).map_err(invalid)?;
            sum = item
                .total()
                .and_then(|total| sum.checked_add(total))
                .ok_or_else(|| invalid("the items add up to more than any amount".into()))?;
        }
        if !items.is_empty() && sum != request.amount {
            return Err(invalid(format!(
                "the items add up to {sum}, not to the amount {}",
                request.amount
            )));
        }
        Ok(NewCheckoutSession {
            order_id: request.order_id,
            amount: request.amount,
            currency,
            description: request.description,
            items,
            ttl,
        })
    }
}

impl NewCheckoutSession {
    /// The request as it is understood, defaults applied: what the key's fingerprint is taken
    /// over, so that an omitted currency and the shop's own, or no items and `[]`, are one
    /// request, and a `422` names only fields whose meaning differs.
    pub fn canonical(&self) -> serde_json::Value {
        serde_json::to_value(CreateCheckoutSession {
            order_id: self.order_id.clone(),
            amount: self.amount,
            currency: Some(self.currency.clone()),
            description: self.description.clone(),
            items: Some(self.items.clone()),
        })
        .expect("a request serializes")
    }
}

fn text(value: &str, what: &str) -> Result<(), ApiError> {
    let length = value.chars().count();
    if (1..=MAX_TEXT).contains(&length) && !value.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(ApiError::InvalidRequest(format!(
            "{what} must be 1 to {MAX_TEXT} characters, without control characters"
        )))
    }
}

/// `POST /api/checkout-sessions`
#[utoipa::path(
    post, path = "/api/checkout-sessions", operation_id = "create_checkout_session", tag = "checkout sessions",
    summary = "Create a checkout session (a shop, with its secret key)",
    description = "What the shop asks to be paid: an order id (one session per order), the amount in kopecks and its items. Keyed: a retry with the same key and body returns the same session.",
    params(("Idempotency-Key" = String, Header, description = "Names one intent: 1–255 visible ASCII characters (a UUID v4 is usual). Resend the same key with the same body on every retry; a new intent gets a new key.")),
    request_body = CreateCheckoutSession,
    responses(
        (status = 201, description = "The session; `Location` names it", body = checkout_shared::CheckoutSession, headers(
                ("Idempotency-Key-Expires" = String, description = "When the server forgets this key (IMF-fixdate); after it, the same key would run again"),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with this key")
            )),
        (status = 400, description = "`invalid_request`: a malformed body, header or key", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 401, description = "`unauthorized`: no valid bearer credential", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 409, description = "`idempotency_key_in_use`: this key's first request is still executing; retry with the same key (see `Retry-After`)", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 422, description = "`idempotency_key_reused`: this key was first used with another request", body = checkout_shared::Problem, content_type = "application/problem+json"), (status = 503, description = "`service_unavailable`: the database is unavailable; nothing was done, retry with the same key", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token, not a shop's secret key", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`order_session_exists`: this order has a session already (`checkout_session_id` names it)", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn create(
    State(app): State<AppState>,
    principal: Principal,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    body: JsonBody<CreateCheckoutSession>,
) -> Result<Response, ApiError> {
    let shop = principal.as_shop()?;
    let session = NewCheckoutSession::validate(shop, body.value, app.session_ttl)?;
    let asked = Asked {
        route: ROUTE,
        body: &session.canonical(),
        location: Some(location),
    };
    keyed::execute(&app, shop, &key, asked, session).await
}

/// Where a new session is read.
pub fn location(session: &serde_json::Value) -> Option<String> {
    Some(format!("{ROUTE}/{}", session["session_id"].as_str()?))
}

/// The business step of a session, inside the protocol's transaction: the session row, or the
/// order's existing session (another key for the same order gets it, as a stored `409`).
impl Operation<Tx> for NewCheckoutSession {
    type Error = ApiError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, ApiError> {
        let session_id = ids::new_secret_id("cs_");
        let items = serde_json::to_string(&self.items).expect("items serialize");
        let expires_at = claim
            .now_ms
            .saturating_add(i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX));
        let inserted = tx
            .insert_session(&NewSession {
                session_id: &session_id,
                shop_account_id: &claim.scope,
                order_id: &self.order_id,
                amount: self.amount,
                currency: &self.currency,
                description: self.description.as_deref(),
                items: &items,
                expires_at,
                created_at: claim.now_ms,
            })
            .await?;
        if !inserted {
            let existing = tx
                .session_of_order(&claim.scope, &self.order_id)
                .await?
                .ok_or(ApiError::Contended)?;
            let mut problem = Problem::new(
                409,
                ErrorCode::OrderSessionExists,
                format!(
                    "order {} already has the checkout session {existing}",
                    self.order_id
                ),
            );
            problem.checkout_session_id = Some(existing);
            return Ok(Decision::Respond(keyed::declined(&problem)));
        }
        Ok(Decision::Respond(keyed::created(&CheckoutSession {
            session_id,
            shop: None,
            order_id: self.order_id.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
            description: self.description.clone(),
            items: self.items.clone(),
            status: CheckoutSessionStatus::Open,
            expires_at: clock::rfc3339(expires_at),
            payment_id: None,
        })))
    }
}

/// `GET /api/checkout-sessions/{session_id}`: for anyone holding the id (128 random bits): what
/// the widget renders. No secrets in it.
#[utoipa::path(
    get, path = "/api/checkout-sessions/{session_id}", operation_id = "get_checkout_session", tag = "checkout sessions",
    summary = "Read a checkout session (anyone holding its id)",
    params(("session_id" = String, Path, description = "`cs_…`")),
    responses(
        (status = 200, description = "The session", body = checkout_shared::CheckoutSession),
        (status = 404, description = "`not_found`: no such session", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    SessionIdPath(session_id): SessionIdPath,
) -> Result<Json<CheckoutSession>, ApiError> {
    let row = app
        .store
        .session(&session_id)
        .await?
        .ok_or_else(not_a_session)?;
    Ok(Json(public_view(row, clock::now_ms())))
}

/// A session as a widget shows it: an open session past its expiry is expired.
pub fn public_view(row: SessionRow, now_ms: i64) -> CheckoutSession {
    let status = match row.status.as_str() {
        "paid" => CheckoutSessionStatus::Paid,
        "open" if row.expires_at > now_ms => CheckoutSessionStatus::Open,
        _ => CheckoutSessionStatus::Expired,
    };
    CheckoutSession {
        session_id: row.session_id,
        shop: Some(ShopView {
            name: row.shop_name,
        }),
        order_id: row.order_id,
        amount: row.amount,
        currency: row.currency,
        description: row.description,
        items: serde_json::from_str(&row.items).unwrap_or_default(),
        status,
        expires_at: clock::rfc3339(row.expires_at),
        payment_id: row.payment_id,
    }
}
