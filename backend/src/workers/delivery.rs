//! Delivery of the outbox: a worker in every server instance sends due events to their shops'
//! webhook URLs, per Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`:
//! HMAC-SHA256 with the shop's signing secret). At least once: an event is marked delivered only
//! after the shop's `2xx`, so a crash in between sends it again, with the same `webhook-id`.
//!
//! Instances share the work through the database: each claims due events under a lease
//! (`SKIP LOCKED` on PostgreSQL), so none is sent by two at once; leases and due times are
//! read on the database's clock, so instances whose clocks disagree cannot take each other's
//! events early. Events of one payment go out in order (the claim skips an event while an
//! earlier one of its subject is pending). Sends run side by side, each bounded by a timeout,
//! and each shop has at most [`DeliverySettings::per_shop`] in flight, so a slow or dead shop
//! only delays its own events; nothing here touches the money path, which only ever inserts a
//! row.

use crate::metrics::Delivery;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use checkout_idempotency::now_ms;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::mail::Mailer;
use crate::operations::endpoints::{self, By};
use crate::store::{
    AttemptSeen, EndedAttempt, EventRow, EventSettled, LeaseRequest, ShopRow, Store, Turn,
};

#[derive(Clone, Debug)]
pub struct DeliverySettings {
    /// One attempt's bound: no answer within it is a failed attempt.
    pub timeout: Duration,
    /// The pause after the first failed attempt; each next one is three times longer, capped
    /// at [`MAX_PAUSE`], with up to a quarter more at random.
    pub first_retry: Duration,
    /// Attempts in all before the event is marked dead (13 with a 5 s start: about 24 h).
    pub attempts: u32,
    /// How often to look for due events when nothing wakes the worker sooner.
    pub poll: Duration,
    /// Sends in flight at once, per instance.
    pub in_flight: usize,
    /// Sends in flight at once to any one shop (leases count across instances): the claim
    /// takes turns between shops, so one shop's hanging endpoint holds at most this many.
    pub per_shop: usize,
    /// An endpoint failing this long without one success is disabled.
    pub disable_after: Duration,
    /// Where the alert of a disabled endpoint is mailed from (its shop's owners); none: only the
    /// event in the shop's list, the log and the metric tell.
    pub alert: Option<Arc<Mailer>>,
}

pub const MAX_PAUSE: Duration = Duration::from_secs(4 * 3600);

impl Default for DeliverySettings {
    fn default() -> Self {
        DeliverySettings {
            timeout: Duration::from_secs(10),
            first_retry: Duration::from_secs(5),
            attempts: 13,
            poll: Duration::from_millis(500),
            in_flight: 32,
            per_shop: 8,
            disable_after: crate::operations::endpoints::DISABLE_AFTER,
            alert: None,
        }
    }
}

/// How one attempt ended.
enum Sent {
    Delivered,
    Failed(String),
}

/// The most of a shop's answer kept for its dashboard.
const EXCERPT_BYTES: usize = 200;

/// The least time between two turns of one worker.
const TURN_SPACING: Duration = Duration::from_millis(20);

/// Starts the worker; `wake` makes it look for due events at once (after a payment, a refund or
/// a redelivery request).
///
/// The worker works in turns: each turn records every attempt that ended since the last one
/// and leases as many due events as it has free send slots, in ONE short write transaction
/// (none when nothing ended and a read finds nothing due). Under a stream of events a turn
/// costs the database one commit for a whole batch, where an attempt of its own would cost two
/// per event; the spacing gathers the wakes of many payments into one turn.
pub fn spawn(store: Store, settings: DeliverySettings, wake: Arc<Notify>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let client = match reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
        {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "webhook delivery cannot start");
                return;
            }
        };
        let mut sending: JoinSet<EndedAttempt> = JoinSet::new();
        // Attempts that ended and are not yet recorded: they hold their send slots until they
        // are (a failed turn tries them again; their leases still hold).
        let mut ended: Vec<EndedAttempt> = Vec::new();
        let mut last_turn = tokio::time::Instant::now();
        // The last turn that committed: attempts left unrecorded longer than a lease are let go.
        let mut last_settled = tokio::time::Instant::now();
        let lease_ms = millis(settings.timeout) + 5_000;
        loop {
            tokio::time::sleep_until(last_turn + TURN_SPACING).await;
            last_turn = tokio::time::Instant::now();
            while let Some(done) = sending.try_join_next() {
                ended.extend(done.ok());
            }
            let free = settings
                .in_flight
                .saturating_sub(sending.len() + ended.len());
            let lease = (free > 0).then(|| LeaseRequest {
                // The lease outlasts one attempt, so no other instance takes the event while it
                // is sent.
                lease_ms,
                lease_id: uuid::Uuid::new_v4().simple().to_string(),
                per_shop: settings.per_shop as i64,
                limit: free as i64,
            });
            let lease_id = lease
                .as_ref()
                .map(|l| l.lease_id.clone())
                .unwrap_or_default();
            let mut full_batch = false;
            match store.settle_and_lease(ended.clone(), lease).await {
                Ok(Turn { events, failing }) => {
                    ended.clear();
                    last_settled = tokio::time::Instant::now();
                    disable_failing(&store, &settings, failing).await;
                    full_batch = free > 0 && events.len() == free;
                    // Each shop read once per turn, not once per event.
                    let mut shops: HashMap<String, Result<Option<ShopRow>, String>> =
                        HashMap::new();
                    for event in &events {
                        let id = &event.shop_account_id;
                        if !shops.contains_key(id) {
                            let shop = store.shop_of_account(id).await;
                            shops.insert(
                                id.clone(),
                                shop.map_err(|error| format!("reading the shop: {error}")),
                            );
                        }
                    }
                    for event in events {
                        let shop = shops[&event.shop_account_id].clone();
                        let (client, settings) = (client.clone(), settings.clone());
                        let lease_id = lease_id.clone();
                        sending.spawn(async move {
                            attempt(&client, &settings, shop, event, lease_id).await
                        });
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "a webhook delivery turn failed");
                    // Their leases have lapsed: their events are sent again whoever leases them
                    // (at least once). Held longer, an outcome no turn can record would keep
                    // its send slot, and in the end every slot, for ever.
                    if last_settled.elapsed() > Duration::from_millis(lease_ms.unsigned_abs()) {
                        tracing::warn!(
                            attempts = ended.len(),
                            "attempts not recorded within their lease are let go"
                        );
                        ended.clear();
                    }
                }
            }
            if full_batch {
                // More may be due: look again as soon as a slot frees.
                if let Some(done) = sending.join_next().await {
                    ended.extend(done.ok());
                }
                continue;
            }
            tokio::select! {
                Some(done) = sending.join_next(), if !sending.is_empty() => ended.extend(done.ok()),
                () = wake.notified() => {}
                () = tokio::time::sleep(settings.poll) => {}
            }
        }
    })
}

/// Disables each endpoint that has failed for longer than the settings allow, and tells its
/// shop's owners. A crash before it is decided again at the endpoint's next failed attempt.
async fn disable_failing(store: &Store, settings: &DeliverySettings, failing: Vec<(String, i64)>) {
    let now = now_ms();
    for (account_id, since) in failing {
        if now - since < millis(settings.disable_after) {
            continue;
        }
        let reason = format!(
            "no 2xx answer for {}",
            humantime::format_duration(Duration::from_millis(
                (now - since).max(0) as u64 / 1000 * 1000
            ))
        );
        match endpoints::disable(
            store,
            &account_id,
            &reason,
            Some(settings.disable_after),
            By::Checkout,
        )
        .await
        {
            Ok(Some(endpoint)) => {
                tracing::warn!(shop = %endpoint.shop_id, livemode = endpoint.livemode, %reason, "a failing webhook endpoint was disabled");
                crate::metrics::endpoint_disabled();
                if let Some(mailer) = &settings.alert {
                    endpoints::alert_owners(store, mailer, &endpoint).await;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "a failing endpoint could not be disabled"),
        }
    }
}

/// One attempt to send a leased event, and what is to be recorded of it: delivered, retried
/// later, or dead. A crash before the record is written lets the lease lapse: the event is
/// sent again (at least once, never lost).
async fn attempt(
    client: &reqwest::Client,
    settings: &DeliverySettings,
    shop: Result<Option<ShopRow>, String>,
    event: EventRow,
    lease_id: String,
) -> EndedAttempt {
    let (sent, seen) = match shop {
        Ok(Some(shop)) => send(client, &shop, &event).await,
        Ok(None) => (Sent::Failed("no such shop".into()), None),
        Err(error) => (Sent::Failed(error), None),
    };
    let settled = match sent {
        Sent::Delivered => {
            tracing::info!(event = %event.event_id, attempts = event.attempts, "webhook delivered");
            EventSettled::Delivered
        }
        Sent::Failed(error) if event.attempts >= i64::from(settings.attempts) => {
            tracing::warn!(event = %event.event_id, attempts = event.attempts, %error, "webhook event is dead");
            EventSettled::Dead { error }
        }
        Sent::Failed(error) => {
            let pause = pause_after(settings, event.attempts);
            tracing::info!(event = %event.event_id, attempts = event.attempts, %error, ?pause, "webhook attempt failed; will retry");
            EventSettled::RetryAfter {
                pause_ms: millis(pause),
                error,
            }
        }
    };
    crate::metrics::delivery(match settled {
        EventSettled::Delivered => Delivery::Delivered,
        EventSettled::Dead { .. } => Delivery::Dead,
        EventSettled::RetryAfter { .. } => Delivery::Retry,
    });
    EndedAttempt {
        event_id: event.event_id,
        lease_id,
        settled,
        seen,
    }
}

/// Sends the event once; how it went, and what the attempt saw (none if no request was made).
async fn send(
    client: &reqwest::Client,
    shop: &ShopRow,
    event: &EventRow,
) -> (Sent, Option<AttemptSeen>) {
    let Some(url) = &shop.webhook_url else {
        return (Sent::Failed("the shop has no webhook URL".into()), None);
    };
    let now = now_ms();
    let timestamp = now / 1000;
    // During a rolled secret's overlap, one signature by each (Standard Webhooks: space-separated):
    // the shop's endpoint verifies with whichever secret it holds.
    let old = shop
        .old_signing_secret
        .as_ref()
        .filter(|(_, until)| *until > now)
        .map(|(secret, _)| secret);
    let signature = match std::iter::once(&shop.signing_secret)
        .chain(old)
        .map(|secret| {
            standardwebhooks::Webhook::new(secret)
                .and_then(|hook| hook.sign(&event.event_id, timestamp, event.body.as_bytes()))
        })
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(signatures) => signatures.join(" "),
        Err(error) => return (Sent::Failed(format!("signing: {error}")), None),
    };
    let started = std::time::Instant::now();
    let answer = client
        .post(url)
        .header("webhook-id", &event.event_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
        .body(event.body.clone())
        .send()
        .await;
    let (sent, status, excerpt) = match answer {
        Ok(response) => {
            let status = response.status();
            let excerpt = excerpt(response).await;
            let sent = if status.is_success() {
                Sent::Delivered
            } else {
                Sent::Failed(format!("the shop answered {status}"))
            };
            (sent, Some(i64::from(status.as_u16())), excerpt)
        }
        Err(error) if error.is_timeout() => {
            let why = "no answer within the timeout".to_owned();
            (Sent::Failed(why.clone()), None, why)
        }
        Err(error) => {
            let why = format!("could not reach the shop: {error}");
            (Sent::Failed(why.clone()), None, why)
        }
    };
    let seen = AttemptSeen {
        shop_account_id: event.shop_account_id.clone(),
        url: url.clone(),
        attempt: event.attempts,
        at: now,
        status,
        latency_ms: millis(started.elapsed()),
        excerpt,
    };
    (sent, Some(seen))
}

/// The answer's first bytes as text (cut at a character's boundary), read no further: a shop
/// answering a long body does not hold the attempt.
async fn excerpt(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(EXCERPT_BYTES);
    let text = String::from_utf8_lossy(&bytes);
    text.trim_end_matches('\u{FFFD}').to_owned()
}

/// The pause after `attempts` failed attempts: capped exponential, with jitter.
pub fn pause_after(settings: &DeliverySettings, attempts: i64) -> Duration {
    let exponent = u32::try_from(attempts.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
    let base = settings
        .first_retry
        .saturating_mul(3u32.saturating_pow(exponent))
        .min(MAX_PAUSE);
    let random = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 4000.0;
    base + base.mul_f64(random)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_threefold_with_jitter_up_to_the_cap() {
        let settings = DeliverySettings::default();
        let first = pause_after(&settings, 1);
        assert!(first >= Duration::from_secs(5) && first <= Duration::from_millis(6_250));
        let third = pause_after(&settings, 3);
        assert!(third >= Duration::from_secs(45) && third <= Duration::from_millis(56_250));
        assert!(pause_after(&settings, 40) <= MAX_PAUSE.mul_f64(1.25));
        // The default schedule spans about a day before the event is dead.
        let total: Duration = (1..i64::from(settings.attempts))
            .map(|n| {
                settings
                    .first_retry
                    .saturating_mul(3u32.pow(n as u32 - 1))
                    .min(MAX_PAUSE)
            })
            .sum();
        assert!(
            total > Duration::from_secs(20 * 3600) && total < Duration::from_secs(30 * 3600),
            "{total:?}"
        );
    }
}
