//! The shop's events: `GET /api/events`, `GET /api/events/{event_id}`,
//! `POST /api/events/{event_id}/redelivery`, and `POST /api/events/recovery` (everything missed
//! since a time).

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use checkout_shared::{EventList, EventRecovery, EventView, EventsRecovered};
use serde::Deserialize;

use crate::api::AppState;
use crate::api::endpoints::shop_of;
use crate::api::extract::{EventIdPath, JsonBody};
use crate::operations::authentication::Principal;
use crate::operations::endpoints::{self, By};
use crate::operations::error::OperationError;
use crate::operations::events::view;

/// A page of `GET /api/events` holds at most this many.
const MAX_PAGE: i64 = 100;

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
) -> Result<Json<EventList>, OperationError> {
    let shop = principal.as_shop()?;
    let limit = page.limit.unwrap_or(20);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(OperationError::InvalidRequest(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    let before_seq = match &page.starting_after {
        None => i64::MAX,
        // Checked before the database sees it: PostgreSQL refuses text holding NUL outright
        // (found by the schema-driven fuzz as a 500).
        Some(event_id) if !crate::ids::is_id("evt_", event_id) => {
            return Err(OperationError::InvalidRequest(format!(
                "starting_after: {event_id:?} is not an event id"
            )));
        }
        Some(event_id) => {
            app.store
                .shop_event(&shop.account_id, event_id)
                .await?
                .ok_or_else(|| {
                    OperationError::InvalidRequest(format!(
                        "starting_after: no such event {event_id}"
                    ))
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
) -> Result<Json<EventView>, OperationError> {
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
) -> Result<(StatusCode, Json<EventView>), OperationError> {
    let shop = shop_of(&app, &principal).await?;
    let row = endpoints::redeliver(&app.store, &shop, &event_id, By::ApiKey)
        .await?
        .ok_or_else(not_found)?;
    app.deliveries.notify_one();
    Ok((StatusCode::ACCEPTED, Json(view(&row)?)))
}

/// `POST /api/events/recovery`: every event since `since` that the shop never received (`dead`;
/// with `include_delivered`, the delivered ones too: a shop that lost its own records) is sent
/// again, now and on a fresh schedule, each with its `webhook-id` (an inbox absorbs what it
/// already has) and in its object's order. Safe to repeat.
#[utoipa::path(
    post, path = "/api/events/recovery", operation_id = "recover_events", tag = "events",
    summary = "Send again every event missed since a time",
    request_body = checkout_shared::EventRecovery,
    responses(
        (status = 202, description = "Queued for delivery: how many", body = checkout_shared::EventsRecovered),
        (status = 400, description = "`invalid_request`: `since` is not an RFC 3339 time", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn recover(
    State(app): State<AppState>,
    principal: Principal,
    body: JsonBody<EventRecovery>,
) -> Result<(StatusCode, Json<EventsRecovered>), OperationError> {
    let shop = shop_of(&app, &principal).await?;
    let request = body.value;
    let since_ms = crate::clock::parse_rfc3339(&request.since).ok_or_else(|| {
        OperationError::InvalidRequest(format!(
            "since: {:?} is not an RFC 3339 time (2026-12-05T10:00:00Z)",
            request.since
        ))
    })?;
    let recovered = endpoints::recover(
        &app.store,
        &shop,
        since_ms,
        request.include_delivered,
        By::ApiKey,
    )
    .await?;
    app.deliveries.notify_one();
    Ok((
        StatusCode::ACCEPTED,
        Json(EventsRecovered {
            recovered: recovered as i64,
            since: crate::clock::rfc3339(since_ms),
        }),
    ))
}

fn not_found() -> OperationError {
    OperationError::NotFound("there is no such event for this shop".into())
}
