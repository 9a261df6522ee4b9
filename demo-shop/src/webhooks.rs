//! The shop's webhook endpoint, `POST /webhooks/checkout`: the receiver that makes the
//! checkout's at-least-once delivery exactly-once in effect. It checks the signature and the
//! timestamp (Standard Webhooks: a replay older than five minutes is refused), then runs the
//! event through the same idempotency protocol as the checkout's keyed requests, with the
//! `webhook-id` as the key: claim it in the inbox → apply the effect (order paid or partly
//! refunded, the bonus written as a state) → record → commit, in one transaction of the shop's
//! database. Only then `2xx`. The same event again, or two copies racing, change nothing.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use checkout_idempotency::{Claim, Decision, KeyedRequest, Operation, Outcome, StoredResponse};
use checkout_shared::EventBody;
use serde_json::Value;

use crate::store::{InboxError, InboxTx};
use crate::{Shop, now_ms};

/// Deliveries that reached the inbox, by outcome; `duplicate`: absorbed, nothing changed.
pub const DELIVERIES_METRIC: &str = "shop_inbox_deliveries_total";

/// Who sends: the inbox's scope.
pub const SENDER: &str = "checkout";
pub const ROUTE: &str = "/webhooks/checkout";
/// One bonus point per this many roubles paid and kept.
pub const ROUBLES_PER_POINT: i64 = 10;

/// `POST /webhooks/checkout`.
pub async fn receive(
    State(shop): State<Shop>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    if let Err(why) = verify(&shop, &headers, &body) {
        tracing::warn!(%why, "webhook refused");
        return (StatusCode::UNAUTHORIZED, why);
    }
    let webhook_id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if !is_event_id(&webhook_id) {
        return (StatusCode::BAD_REQUEST, "not a checkout event id".into());
    }
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not JSON".into());
    };
    let Ok(event) = serde_json::from_value::<EventBody>(value.clone()) else {
        return (StatusCode::BAD_REQUEST, "the body is not an event".into());
    };
    // In a task of its own: a sender that gives up drops this request, never the transaction
    // midway (a dropped `BEGIN` could leave a pooled connection inside an open transaction).
    let (protocol, inbox, key) = (
        shop.inbox_protocol.clone(),
        shop.store.inbox(),
        webhook_id.clone(),
    );
    let applied = tokio::spawn(async move {
        let request = KeyedRequest {
            scope: SENDER,
            key: &key,
            method: "POST",
            route: ROUTE,
            body: &value,
        };
        protocol.execute(&inbox, request, ApplyEvent(event)).await
    })
    .await;
    let Ok(applied) = applied else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "try again".into());
    };
    let outcome = match &applied {
        Ok(Outcome::Executed { .. }) => "applied",
        Ok(Outcome::Replayed { .. }) => "duplicate",
        Ok(Outcome::InUse) => "in_use",
        _ => "refused",
    };
    metrics::counter!(DELIVERIES_METRIC, "outcome" => outcome).increment(1);
    match applied {
        Ok(Outcome::Executed { response, .. }) => {
            tracing::info!(webhook_id, "webhook applied");
            (status(&response), response.body)
        }
        Ok(Outcome::Replayed { response, .. }) => {
            tracing::info!(webhook_id, "webhook already applied: nothing changed");
            (status(&response), response.body)
        }
        Ok(Outcome::KeyReused { .. }) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "this webhook-id came with another body".into(),
        ),
        // Another copy is being applied right now: the sender tries again later.
        Ok(Outcome::InUse) => (StatusCode::CONFLICT, "being applied".into()),
        Ok(Outcome::TryAgain) => (StatusCode::SERVICE_UNAVAILABLE, "try again".into()),
        Err(error) => {
            tracing::error!(%error, webhook_id, "applying a webhook failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "try again".into())
        }
    }
}

fn status(response: &StoredResponse) -> StatusCode {
    StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK)
}

/// The signature over `id.timestamp.body` with the shop's signing secret, and a timestamp
/// within five minutes. The credentials are read again once if it does not match (the operator
/// may have replaced them).
fn verify(shop: &Shop, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let check = |secret: &str| {
        standardwebhooks::Webhook::new(secret)
            .map_err(|e| e.to_string())?
            .verify(body, headers)
            .map_err(|e| e.to_string())
    };
    let known = shop.checkout.credentials().map(|c| c.signing_secret);
    match known
        .as_deref()
        .map_or_else(|| Err("no credentials yet".to_owned()), check)
    {
        Ok(()) => Ok(()),
        Err(why) => match shop.checkout.reread_credentials() {
            Some(fresh) => check(&fresh.signing_secret),
            None => Err(why),
        },
    }
}

/// `evt_` and 32 hex digits: what the checkout's events are called.
fn is_event_id(id: &str) -> bool {
    id.strip_prefix("evt_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The effect of one event, inside the inbox's transaction.
struct ApplyEvent(EventBody);

impl Operation<InboxTx> for ApplyEvent {
    type Error = InboxError;

    async fn apply(&self, tx: &mut InboxTx, _claim: &Claim) -> Result<Decision, InboxError> {
        let data = &self.0.data;
        let text = |field: &str| data[field].as_str().unwrap_or_default().to_owned();
        let order_id = text("order_id");
        let now = now_ms();
        let effect = match self.0.event_type.as_str() {
            "payment.succeeded" => {
                let amount = data["amount"].as_i64().unwrap_or(-1);
                let newly = tx
                    .order_paid(&order_id, &text("payment_id"), amount, now)
                    .await?;
                tx.payment_sequence_seen(&order_id, self.0.sequence).await?;
                tx.set_bonus(&order_id, ROUBLES_PER_POINT, now).await?;
                if newly {
                    "order paid"
                } else {
                    "order already paid"
                }
            }
            "refund.succeeded" => {
                let refunded = data["refunded_total"].as_i64().unwrap_or(0);
                // Its refund is a fact however late it comes; the totals in it only if nothing
                // newer of the payment was applied (a redelivered older event says less).
                let newest = tx
                    .order_refunded(&order_id, refunded, self.0.sequence)
                    .await?;
                tx.set_bonus(&order_id, ROUBLES_PER_POINT, now).await?;
                let amount = data["amount"].as_i64().unwrap_or(-1);
                let settled = tx
                    .settle_pending_refund(&order_id, amount, &text("refund_id"))
                    .await?;
                match (newest, settled) {
                    (true, true) => "refund recorded; the refund waiting for its answer settled",
                    (true, false) => "refund recorded",
                    (false, true) => {
                        "refund recorded, older than an event applied: totals kept; the refund waiting for its answer settled"
                    }
                    (false, false) => "refund recorded, older than an event applied: totals kept",
                }
            }
            // The order can no longer be paid; the shopper orders again (a new order, a new
            // session).
            "checkout_session.expired" => {
                if tx.order_session_expired(&order_id, now).await? {
                    "order expired"
                } else {
                    "order already settled"
                }
            }
            // Recorded, so that it is never applied later by surprise; no effect today.
            _ => "ignored",
        };
        Ok(Decision::Respond(StoredResponse {
            status: 200,
            body: serde_json::json!({ "received": true, "effect": effect }).to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_checkout_event_ids_are_keys() {
        assert!(is_event_id("evt_0123456789abcdef0123456789abcdef"));
        for bad in [
            "",
            "evt_",
            "pay_0123456789abcdef0123456789abcdef",
            "evt_xyz",
            "evt_0123456789abcdef0123456789abcdef0",
        ] {
            assert!(!is_event_id(bad), "{bad}");
        }
    }
}
