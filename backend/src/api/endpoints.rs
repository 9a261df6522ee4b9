//! The shop's webhook endpoint in its key's mode: `GET /api/webhook-endpoint`,
//! `POST /api/webhook-endpoint` (URL, event types, enabled), `POST
//! /api/webhook-endpoint/signing-secret` (rolled, with an overlap), `POST
//! /api/webhook-endpoint/test-event`, and an event's delivery attempts
//! (`GET /api/events/{event_id}/attempts`). What the dashboard's «Вебхуки» does, for a shop's
//! own tools.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use checkout_shared::{
    DeliveryAttempt, DeliveryAttempts, RollSigningSecret, SigningSecretRolled, TestEventSent,
    UpdateWebhookEndpoint, WebhookEndpoint,
};

use crate::api::AppState;
use crate::api::extract::{EventIdPath, JsonBody};
use crate::clock;
use crate::operations::authentication::Principal;
use crate::operations::endpoints::{self, By};
use crate::operations::error::OperationError;
use crate::operations::shops::ShopError;
use crate::store::ShopRow;
use crate::store::endpoints::EndpointRow;

/// The longest overlap of a rolled signing secret: a week.
const MAX_OVERLAP_SECS: u64 = 7 * 24 * 3600;

/// The shop (of the key's mode) whose secret key made the request.
pub(crate) async fn shop_of(
    app: &AppState,
    principal: &Principal,
) -> Result<ShopRow, OperationError> {
    let shop = principal.as_shop()?;
    app.store
        .shop_of_account(&shop.account_id)
        .await?
        .ok_or_else(|| OperationError::NotFound("no such shop".into()))
}

fn shop_error(error: ShopError) -> OperationError {
    match error {
        ShopError::Store(error) => error.into(),
        other => OperationError::InvalidRequest(other.to_string()),
    }
}

fn view(endpoint: EndpointRow) -> WebhookEndpoint {
    let now = clock::now_ms();
    WebhookEndpoint {
        url: endpoint.url,
        event_types: endpoint.event_types,
        enabled: endpoint.disabled.is_none(),
        disabled_at: endpoint
            .disabled
            .as_ref()
            .map(|(at, _)| clock::rfc3339(*at)),
        disabled_reason: endpoint.disabled.map(|(_, reason)| reason),
        failing_since: endpoint.failing_since.map(clock::rfc3339),
        old_signing_secret_expires_at: endpoint
            .old_secret_until
            .filter(|until| *until > now)
            .map(clock::rfc3339),
        livemode: endpoint.livemode,
    }
}

/// `GET /api/webhook-endpoint`
#[utoipa::path(
    get, path = "/api/webhook-endpoint", operation_id = "get_webhook_endpoint", tag = "events",
    summary = "The shop's webhook endpoint in this key's mode",
    responses(
        (status = 200, description = "The endpoint", body = checkout_shared::WebhookEndpoint),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn get(
    State(app): State<AppState>,
    principal: Principal,
) -> Result<Json<WebhookEndpoint>, OperationError> {
    let shop = shop_of(&app, &principal).await?;
    let endpoint = endpoints::get(&app.store, &shop.shop_id, shop.livemode).await?;
    Ok(Json(view(endpoint)))
}

/// `POST /api/webhook-endpoint`
#[utoipa::path(
    post, path = "/api/webhook-endpoint", operation_id = "update_webhook_endpoint", tag = "events",
    summary = "Change the endpoint: its URL, the event types it takes, disabled or enabled",
    description = "Each field given is set; the others stay. A request with one bad field changes nothing. Setting the same values again changes nothing, so a retry is safe. Enabling a disabled endpoint sends it what it missed. Every change is in the shop's audit log (by \"API-ключ\"), written with it.",
    request_body = UpdateWebhookEndpoint,
    responses(
        (status = 200, description = "The endpoint now", body = checkout_shared::WebhookEndpoint),
        (status = 400, description = "`invalid_request`: a URL that is not https (http only to loopback), an unknown event type, an unknown field", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn update(
    State(app): State<AppState>,
    principal: Principal,
    body: JsonBody<UpdateWebhookEndpoint>,
) -> Result<Json<WebhookEndpoint>, OperationError> {
    let shop = shop_of(&app, &principal).await?;
    let asked = body.value;
    let change = endpoints::Change {
        url: asked
            .url
            .as_deref()
            .map(|url| Some(url.trim()).filter(|u| !u.is_empty())),
        event_types: asked.event_types.as_deref(),
        enabled: asked.enabled,
    };
    endpoints::change(&app.store, &shop, change, By::ApiKey)
        .await
        .map_err(shop_error)?;
    app.deliveries.notify_one();
    let endpoint = endpoints::get(&app.store, &shop.shop_id, shop.livemode).await?;
    Ok(Json(view(endpoint)))
}

/// `POST /api/webhook-endpoint/signing-secret`
#[utoipa::path(
    post, path = "/api/webhook-endpoint/signing-secret", operation_id = "roll_signing_secret", tag = "events",
    summary = "A new signing secret, the old one signing beside it for an overlap",
    description = "Not keyed: each call makes a new secret (the one before it then signs for the overlap). Keep the answer: the secret is also shown on the owner's dashboard.",
    request_body = RollSigningSecret,
    responses(
        (status = 200, description = "The new secret", body = checkout_shared::SigningSecretRolled),
        (status = 400, description = "`invalid_request`: an overlap above 7 days", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn roll_secret(
    State(app): State<AppState>,
    principal: Principal,
    body: JsonBody<RollSigningSecret>,
) -> Result<Json<SigningSecretRolled>, OperationError> {
    let shop = shop_of(&app, &principal).await?;
    let overlap = body.value.overlap_secs;
    if overlap > MAX_OVERLAP_SECS {
        return Err(OperationError::InvalidRequest(format!(
            "overlap_secs must be at most {MAX_OVERLAP_SECS} (7 days)"
        )));
    }
    let (secret, until) = endpoints::roll_signing_secret(
        &app.store,
        &shop.shop_id,
        shop.livemode,
        Duration::from_secs(overlap),
        By::ApiKey,
    )
    .await
    .map_err(shop_error)?;
    Ok(Json(SigningSecretRolled {
        signing_secret: secret,
        old_signing_secret_expires_at: until.map(clock::rfc3339),
    }))
}

/// `POST /api/webhook-endpoint/test-event`
#[utoipa::path(
    post, path = "/api/webhook-endpoint/test-event", operation_id = "send_test_event", tag = "events",
    summary = "Send a `webhook.test` event to the endpoint",
    description = "Written to the outbox and sent as any event (signed, retried, its attempts listed), whatever event types the endpoint takes; a receiver answers it 2xx and does nothing else.",
    responses(
        (status = 202, description = "On its way", body = checkout_shared::TestEventSent),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn test_event(
    State(app): State<AppState>,
    principal: Principal,
) -> Result<(StatusCode, Json<TestEventSent>), OperationError> {
    let shop = shop_of(&app, &principal).await?;
    let event_id = endpoints::send_test(&app.store, &shop, By::ApiKey).await?;
    app.deliveries.notify_one();
    Ok((StatusCode::ACCEPTED, Json(TestEventSent { event_id })))
}

/// `GET /api/events/{event_id}/attempts`
#[utoipa::path(
    get, path = "/api/events/{event_id}/attempts", operation_id = "list_delivery_attempts", tag = "events",
    summary = "Every attempt to deliver one of the shop's events",
    params(("event_id" = String, Path, description = "`evt_…`")),
    responses(
        (status = 200, description = "The attempts, oldest first", body = checkout_shared::DeliveryAttempts),
        (status = 401, description = "`unauthorized`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a shopper's token", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such event of this shop", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
    security(("shop_secret_key" = []))
)]
pub async fn attempts(
    State(app): State<AppState>,
    principal: Principal,
    EventIdPath(event_id): EventIdPath,
) -> Result<Json<DeliveryAttempts>, OperationError> {
    let shop = principal.as_shop()?;
    app.store
        .shop_event(&shop.account_id, &event_id)
        .await?
        .ok_or_else(|| OperationError::NotFound(format!("no event {event_id}")))?;
    let attempts = app.store.event_attempts(&event_id).await?;
    Ok(Json(DeliveryAttempts {
        attempts: attempts
            .into_iter()
            .map(|a| DeliveryAttempt {
                attempt: a.attempt,
                url: a.url,
                at: clock::rfc3339(a.at),
                status: a.status,
                latency_ms: a.latency_ms,
                excerpt: a.excerpt,
            })
            .collect(),
    }))
}
