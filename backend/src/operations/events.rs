//! Events to the shops, the outbox side: each is written in the transaction of the change it
//! tells of (a payment, a refund), so there is no event without its change and no change without
//! its event; [`crate::workers::delivery`] sends them. A shop lists its events and asks for one again.

use checkout_shared::{EventBody, EventView, Payment, Refund};
use serde_json::json;

use crate::operations::error::OperationError;
use crate::store::endpoints::EndpointRow;
use crate::store::{EventRow, NewEvent, Store, StoreError, Tx};
use crate::{clock, ids};

pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";
pub const REFUND_SUCCEEDED: &str = "refund.succeeded";
pub const SESSION_EXPIRED: &str = "checkout_session.expired";
/// Live money deposited to a shopper: kept in the outbox under the funding account (no shop
/// hears it; it is the operator's record and a broker's, later).
pub const DEPOSIT_SUCCEEDED: &str = "deposit.succeeded";
/// A test its endpoint's owner sent (a receiver answers it `2xx` and does nothing else).
pub const WEBHOOK_TEST: &str = "webhook.test";
/// The checkout disabled the shop's endpoint (it failed for days) or its owner did: in the
/// shop's list of events (never sent to the endpoint it tells of), and mailed to its owners.
pub const ENDPOINT_DISABLED: &str = "webhook_endpoint.disabled";
/// The types a shop's endpoint may choose among (the endpoint's own two always reach it).
pub const SHOP_EVENT_TYPES: [&str; 3] = [PAYMENT_SUCCEEDED, REFUND_SUCCEEDED, SESSION_EXPIRED];

/// What was bought, as the session's shop set it: the payment's event carries it, so that
/// whoever issues the fiscal receipt (54-ФЗ lists every line) needs nothing but the event.
pub struct Lines<'a> {
    /// The session's items as stored (a JSON array; empty when the shop gave none).
    pub items: &'a str,
    pub description: Option<&'a str>,
}

/// Records `payment.succeeded` for the shop paid, in the payment's transaction: the payment,
/// with the session's `items` and `description`.
pub async fn payment_succeeded(
    tx: &mut Tx,
    shop_account_id: &str,
    payment: &Payment,
    lines: Lines<'_>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let event = PaymentSucceeded::of(payment, lines, now_ms);
    tx.insert_event(&event.for_shop(shop_account_id)).await
}

/// `payment.succeeded` as written, for a change that writes it itself (a payment at once).
pub struct PaymentSucceeded {
    event_id: String,
    subject_id: String,
    body: String,
    created_at: i64,
}

impl PaymentSucceeded {
    pub fn of(payment: &Payment, lines: Lines<'_>, now_ms: i64) -> PaymentSucceeded {
        let mut data = serde_json::to_value(payment).expect("a payment serializes");
        data["items"] = serde_json::from_str(lines.items).unwrap_or_else(|_| json!([]));
        data["description"] = json!(lines.description);
        PaymentSucceeded {
            event_id: ids::new_id("evt_"),
            subject_id: payment.payment_id.clone(),
            body: body_of(
                (PAYMENT_SUCCEEDED, FIRST_VERSION),
                (data, payment.livemode),
                now_ms,
            ),
            created_at: now_ms,
        }
    }

    pub fn for_shop<'a>(&'a self, shop_account_id: &'a str) -> NewEvent<'a> {
        NewEvent {
            about_endpoint: false,
            event_id: &self.event_id,
            shop_account_id,
            event_type: PAYMENT_SUCCEEDED,
            subject_id: &self.subject_id,
            body: &self.body,
            created_at: self.created_at,
        }
    }
}

/// An object's version when it is made: the `sequence` of its first event.
const FIRST_VERSION: i64 = 1;

/// What a refund's event tells of its payment besides the refund.
pub struct OfPayment<'a> {
    pub order_id: &'a str,
    pub currency: &'a str,
    /// The payment's version after the refund: the event's `sequence`.
    pub version: i64,
}

/// Records `refund.succeeded` for the refunding shop, in the refund's transaction. Its subject
/// is the payment, so that it is never delivered before the payment's own event.
pub async fn refund_succeeded(
    tx: &mut Tx,
    shop_account_id: &str,
    refund: &Refund,
    payment: OfPayment<'_>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut data = serde_json::to_value(refund).expect("a refund serializes");
    data["order_id"] = json!(payment.order_id);
    data["currency"] = json!(payment.currency);
    record(
        tx,
        shop_account_id,
        (REFUND_SUCCEEDED, &refund.payment_id, payment.version),
        (data, refund.livemode),
        now_ms,
    )
    .await
}

/// Records `deposit.succeeded` (`data`: the deposit as its answer says it), in the deposit's
/// transaction.
pub async fn deposit_succeeded(
    tx: &mut Tx,
    deposit_id: &str,
    data: serde_json::Value,
    now_ms: i64,
) -> Result<(), StoreError> {
    record(
        tx,
        crate::store::accounts::FUNDING_ACCOUNT,
        (DEPOSIT_SUCCEEDED, deposit_id, FIRST_VERSION),
        (data, true),
        now_ms,
    )
    .await
}

/// Marks lapsed sessions expired and records `checkout_session.expired` for each, in one
/// transaction per batch; returns how many.
pub async fn expire_sessions(store: &Store, now_ms: i64, batch: i64) -> Result<usize, StoreError> {
    store
        .write(move |tx| {
            Box::pin(async move {
                let expired = tx.expire_sessions(now_ms, batch).await?;
                for session in &expired {
                    let data = json!({
                        "session_id": session.session_id,
                        "order_id": session.order_id,
                        "amount": session.amount,
                        "currency": session.currency,
                        "status": "expired",
                        "expires_at": clock::rfc3339(session.expires_at),
                        "livemode": session.livemode,
                    });
                    record(
                        tx,
                        &session.shop_account_id,
                        (SESSION_EXPIRED, &session.session_id, FIRST_VERSION),
                        (data, session.livemode),
                        now_ms,
                    )
                    .await?;
                }
                Ok(expired.len())
            })
        })
        .await
}

/// Records a test event for the shop account's endpoint; its id.
pub async fn webhook_test(
    tx: &mut Tx,
    shop_account_id: &str,
    livemode: bool,
    now_ms: i64,
) -> Result<String, StoreError> {
    let data = json!({ "message": "Проверка конечной точки: ответьте 2xx и ничего не делайте" });
    let event_id = ids::new_id("evt_");
    write(
        tx,
        (&event_id, shop_account_id, true),
        (WEBHOOK_TEST, &event_id, FIRST_VERSION),
        (data, livemode),
        now_ms,
    )
    .await?;
    Ok(event_id)
}

/// Records that the endpoint was disabled: its URL, why, since when it had failed.
pub async fn endpoint_disabled(
    tx: &mut Tx,
    endpoint: &EndpointRow,
    now_ms: i64,
) -> Result<(), StoreError> {
    let (at, reason) = endpoint.disabled.clone().unwrap_or((now_ms, String::new()));
    let data = json!({
        "url": endpoint.url,
        "reason": reason,
        "disabled_at": clock::rfc3339(at),
        "failing_since": endpoint.failing_since.map(clock::rfc3339),
    });
    write(
        tx,
        (&ids::new_id("evt_"), &endpoint.account_id, true),
        (ENDPOINT_DISABLED, &endpoint.account_id, FIRST_VERSION),
        (data, endpoint.livemode),
        now_ms,
    )
    .await
}

/// Writes the event of type `event_type` about `subject_id`, which the change left at
/// `version` (the event's `sequence`).
async fn record(
    tx: &mut Tx,
    shop_account_id: &str,
    what: (&str, &str, i64),
    body: (serde_json::Value, bool),
    now_ms: i64,
) -> Result<(), StoreError> {
    let event_id = ids::new_id("evt_");
    write(tx, (&event_id, shop_account_id, false), what, body, now_ms).await
}

/// Writes an event with this id for this account, about the endpoint itself or not.
async fn write(
    tx: &mut Tx,
    (event_id, shop_account_id, about_endpoint): (&str, &str, bool),
    (event_type, subject_id, version): (&str, &str, i64),
    (data, livemode): (serde_json::Value, bool),
    now_ms: i64,
) -> Result<(), StoreError> {
    let body = body_of((event_type, version), (data, livemode), now_ms);
    tx.insert_event(&NewEvent {
        about_endpoint,
        event_id,
        shop_account_id,
        event_type,
        subject_id,
        body: &body,
        created_at: now_ms,
    })
    .await
}

/// An event's body as the shop receives it.
fn body_of(
    (event_type, version): (&str, i64),
    (data, livemode): (serde_json::Value, bool),
    now_ms: i64,
) -> String {
    let body = checkout_shared::EventBody {
        event_type: event_type.to_owned(),
        sequence: version,
        livemode,
        timestamp: clock::rfc3339(now_ms),
        data,
    };
    serde_json::to_string(&body).expect("an event serializes")
}

pub fn view(row: &EventRow) -> Result<EventView, OperationError> {
    let body: EventBody = serde_json::from_str(&row.body)
        .map_err(|e| StoreError::Other(format!("event {}: {e}", row.event_id).into()))?;
    Ok(EventView {
        event_id: row.event_id.clone(),
        event_type: row.event_type.clone(),
        created_at: clock::rfc3339(row.created_at),
        status: row.status.clone(),
        attempts: row.attempts,
        next_attempt_at: (row.status == "pending").then(|| clock::rfc3339(row.next_attempt_at)),
        last_error: row.last_error.clone(),
        delivered_at: row.delivered_at.map(clock::rfc3339),
        body,
    })
}
