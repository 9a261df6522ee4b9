//! Events to the shops, the outbox side: each is written in the transaction of the change it
//! tells of (a payment, a refund), so there is no event without its change and no change without
//! its event; [`crate::delivery`] sends them. A shop lists its events and asks for one again.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use checkout_shared::{EventBody, EventList, EventView, Payment, Refund};
use serde::Deserialize;
use serde_json::json;

use crate::accounts::Principal;
use crate::error::ApiError;
use crate::extract::EventIdPath;
use crate::store::{EventRow, NewEvent, Store, StoreError, Tx};
use crate::{AppState, clock, ids};

pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";
pub const REFUND_SUCCEEDED: &str = "refund.succeeded";
pub const SESSION_EXPIRED: &str = "checkout_session.expired";

/// A page of `GET /api/events` holds at most this many.
const MAX_PAGE: i64 = 100;

/// Records `payment.succeeded` for the shop paid, in the payment's transaction.
pub async fn payment_succeeded(
    tx: &mut Tx,
    shop_account_id: &str,
    payment: &Payment,
    now_ms: i64,
) -> Result<(), StoreError> {
    let data = serde_json::to_value(payment).expect("a payment serializes");
    record(
        tx,
        shop_account_id,
        PAYMENT_SUCCEEDED,
        &payment.payment_id,
        data,
        now_ms,
    )
    .await
}

/// Records `refund.succeeded` for the refunding shop, in the refund's transaction. Its subject
/// is the payment, so that it is never delivered before the payment's own event.
pub async fn refund_succeeded(
    tx: &mut Tx,
    shop_account_id: &str,
    refund: &Refund,
    order_id: &str,
    currency: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut data = serde_json::to_value(refund).expect("a refund serializes");
    data["order_id"] = json!(order_id);
    data["currency"] = json!(currency);
    record(
        tx,
        shop_account_id,
        REFUND_SUCCEEDED,
        &refund.payment_id,
        data,
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
                    });
                    record(
                        tx,
                        &session.shop_account_id,
                        SESSION_EXPIRED,
                        &session.session_id,
                        data,
                        now_ms,
                    )
                    .await?;
                }
                Ok(expired.len())
            })
        })
        .await
}

async fn record(
    tx: &mut Tx,
    shop_account_id: &str,
    event_type: &str,
    subject_id: &str,
    data: serde_json::Value,
    now_ms: i64,
) -> Result<(), StoreError> {
    let body = checkout_shared::EventBody {
        event_type: event_type.to_owned(),
        timestamp: clock::rfc3339(now_ms),
        data,
    };
    let body = serde_json::to_string(&body).expect("an event serializes");
    tx.insert_event(&NewEvent {
        event_id: &ids::new_id("evt_"),
        shop_account_id,
        event_type,
        subject_id,
        body: &body,
        created_at: now_ms,
    })
    .await
}

#[derive(Debug, Deserialize)]
pub struct Page {
    #[serde(default)]
    limit: Option<i64>,
    /// The last event of the previous page.
    #[serde(default)]
    starting_after: Option<String>,
}

/// `GET /api/events?limit=&starting_after=`: the shop's events, newest first.
#[utoipa::path(
    get, path = "/api/events", operation_id = "list_events", tag = "events",
    summary = "The shop's events and their delivery state, newest first",
    params(
        ("limit" = Option<u32>, Query, description = "1..=100, default 20"),
        ("starting_after" = Option<String>, Query, description = "An event id: the page after it (`next_page`)")
    ),
    responses(
        (status = 200, description = "One page of events", body = checkout_shared::EventList),
        (status = 400, description = "`invalid_request`: a bad `limit` or an unknown `starting_after`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn list(
    State(app): State<AppState>,
    principal: Principal,
    Query(page): Query<Page>,
) -> Result<Json<EventList>, ApiError> {
    let shop = principal.as_shop()?;
    let limit = page.limit.unwrap_or(20);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    let before_seq = match &page.starting_after {
        None => i64::MAX,
        // Checked before the database sees it: PostgreSQL refuses text holding NUL outright
        // (found by the schema-driven fuzz as a 500).
        Some(event_id) if !crate::ids::is_id("evt_", event_id) => {
            return Err(ApiError::InvalidRequest(format!(
                "starting_after: {event_id:?} is not an event id"
            )));
        }
        Some(event_id) => {
            app.store
                .shop_event(&shop.account_id, event_id)
                .await?
                .ok_or_else(|| {
                    ApiError::InvalidRequest(format!("starting_after: no such event {event_id}"))
                })?
                .seq
        }
    };
    let mut rows = app
        .store
        .shop_events(&shop.account_id, before_seq, limit + 1)
        .await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_page = has_more
        .then(|| rows.last().map(|e| e.event_id.clone()))
        .flatten();
    Ok(Json(EventList {
        events: rows.iter().map(view).collect::<Result<_, _>>()?,
        has_more,
        next_page,
    }))
}

/// `GET /api/events/{event_id}`.
#[utoipa::path(
    get, path = "/api/events/{event_id}", operation_id = "get_event", tag = "events",
    summary = "One event and its delivery state",
    params(("event_id" = String, Path, description = "`evt_…`, the `webhook-id`")),
    responses(
        (status = 200, description = "The event", body = checkout_shared::EventView),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such event for this shop", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn get(
    State(app): State<AppState>,
    principal: Principal,
    EventIdPath(event_id): EventIdPath,
) -> Result<Json<EventView>, ApiError> {
    let shop = principal.as_shop()?;
    let row = app
        .store
        .shop_event(&shop.account_id, &event_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(view(&row)?))
}

/// `POST /api/events/{event_id}/redelivery`: the event is sent again, now and on a fresh
/// schedule, whatever became of it (dead, or delivered and lost on the shop's side). Safe to
/// repeat: it only ever queues the same event, with the same `webhook-id`.
#[utoipa::path(
    post, path = "/api/events/{event_id}/redelivery", operation_id = "redeliver_event", tag = "events",
    summary = "Send an event again (a dead one included), now and on a fresh schedule",
    params(("event_id" = String, Path, description = "`evt_…`")),
    responses(
        (status = 202, description = "Queued for delivery", body = checkout_shared::EventView),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such event for this shop", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn redeliver(
    State(app): State<AppState>,
    principal: Principal,
    EventIdPath(event_id): EventIdPath,
) -> Result<(StatusCode, Json<EventView>), ApiError> {
    let shop = principal.as_shop()?;
    let row = app
        .store
        .redeliver_event(&shop.account_id, &event_id)
        .await?
        .ok_or_else(not_found)?;
    app.deliveries.notify_one();
    Ok((StatusCode::ACCEPTED, Json(view(&row)?)))
}

fn not_found() -> ApiError {
    ApiError::NotFound("there is no such event for this shop".into())
}

fn view(row: &EventRow) -> Result<EventView, ApiError> {
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
