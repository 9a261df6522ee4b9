//! Checkout sessions: a shop fixes what is paid for (order, amount, items) with its secret key
//! and an idempotency key of its own; the shopper's browser renders the session and pays it,
//! never naming an amount. One session per (shop, order); a session is paid at most once and
//! cannot be paid after it expires.

use std::time::Duration;

use checkout_idempotency::{Claim, Decision, Operation};
use checkout_shared::{
    CheckoutSession, CheckoutSessionStatus, CreateCheckoutSession, ErrorCode, LineItem, Problem,
    ShopView, validate_amount, validate_currency, validate_order_id,
};

use crate::operations::answers;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::urls;
use crate::store::{NewSession, SessionRow, Tx};
use crate::{clock, ids};

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
    pub return_url: Option<String>,
    pub ttl: Duration,
    /// The mode of the shop's key that asks: the session's.
    pub livemode: bool,
}

impl NewCheckoutSession {
    pub fn validate(
        shop: &Principal,
        request: CreateCheckoutSession,
        ttl: Duration,
    ) -> Result<NewCheckoutSession, OperationError> {
        let invalid = OperationError::InvalidRequest;
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
        if let Some(url) = &request.return_url {
            let parsed =
                urls::secure_url(url).map_err(|why| invalid(format!("return_url: {why}")))?;
            // The checkout's page sends the shopper there: only to the shop's own pages.
            let origin = parsed.origin().ascii_serialization();
            if !shop.origins.contains(&origin) {
                return Err(invalid(format!(
                    "return_url: its origin {origin} is not one of this shop's registered origins \
                     (`checkout-server shop set-origins`)"
                )));
            }
        }
        Ok(NewCheckoutSession {
            return_url: request.return_url,
            order_id: request.order_id,
            amount: request.amount,
            currency,
            description: request.description,
            items,
            ttl,
            livemode: shop.livemode,
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
            return_url: self.return_url.clone(),
        })
        .expect("a request serializes")
    }
}

fn text(value: &str, what: &str) -> Result<(), OperationError> {
    let length = value.chars().count();
    if (1..=MAX_TEXT).contains(&length) && !value.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(OperationError::InvalidRequest(format!(
            "{what} must be 1 to {MAX_TEXT} characters, without control characters"
        )))
    }
}

/// The business step of a session, inside the protocol's transaction: the session row, or the
/// order's existing session (another key for the same order gets it, as a stored `409`).
impl Operation<Tx> for NewCheckoutSession {
    type Error = OperationError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, OperationError> {
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
                return_url: self.return_url.as_deref(),
            })
            .await?;
        if !inserted {
            let existing = tx
                .session_of_order(&claim.scope, &self.order_id)
                .await?
                .ok_or(OperationError::Contended)?;
            let mut problem = Problem::new(
                409,
                ErrorCode::OrderSessionExists,
                format!(
                    "order {} already has the checkout session {existing}",
                    self.order_id
                ),
            );
            problem.checkout_session_id = Some(existing);
            return Ok(Decision::Respond(answers::declined(&problem)));
        }
        Ok(Decision::Respond(answers::created(&CheckoutSession {
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
            return_url: self.return_url.clone(),
            livemode: self.livemode,
        })))
    }
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
        return_url: row.return_url,
        livemode: row.livemode,
    }
}
