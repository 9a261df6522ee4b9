//! The outbox published to RabbitMQ (`CHECKOUT_AMQP_URL`), beside the webhooks: every event,
//! in the outbox's order, to the durable topic exchange `checkout.events` with its type as the
//! routing key, persistent, `message_id` = the event's id. An event counts as published only
//! once the broker confirmed it into a queue (publisher confirms, `mandatory`); then
//! `published_at` is set. The broker confirms a message that no queue took too (it returns it
//! first): such an event is not published, and is offered again later (1 s, doubling, at most
//! 5 minutes), so that a consumer that binds its queue after it was written still gets it. A crash or a
//! lost confirm in between publishes it again: at least once, and the consumers' inboxes absorb
//! the copy (the same `message_id`). The money path never waits for it: events are read from
//! the outbox after their commit, and a broker that is down only grows the backlog
//! (`checkout_broker_backlog`).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};

use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use tokio::task::JoinHandle;

use crate::store::{BoxError, Store};

/// The exchange every event is published to.
pub const EXCHANGE: &str = checkout_shared::EVENTS_EXCHANGE;
/// Connecting and declaring, at most; a round's confirms, at most.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Events published per round (each confirmed before the round's rows are marked).
const BATCH: i64 = 100;
/// An event no queue took is offered again after this long, then twice as long each time…
const RETURNED_FIRST_WAIT_MS: i64 = 1_000;
/// …but never longer than this.
const RETURNED_LONGEST_WAIT_MS: i64 = 5 * 60 * 1_000;

#[derive(Clone)]
pub struct PublisherSettings {
    pub url: String,
    /// How often the outbox is looked at when it had nothing to publish.
    pub poll: Duration,
    /// A test's seam: called between the broker's confirm and the marking (see `Seams`).
    pub after_confirm: Option<Arc<dyn Fn() + Send + Sync>>,
}

pub fn spawn(store: Store, settings: PublisherSettings) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(100);
        let mut nodes = checkout_shared::broker::BrokerNodes::parse(&settings.url);
        loop {
            let started = std::time::Instant::now();
            let Some((node, url)) = nodes.next_node() else {
                tracing::error!("CHECKOUT_AMQP_URL names no broker node; not publishing");
                return;
            };
            match publish(&store, &settings, url, node).await {
                Ok(()) => {}
                Err(error) => {
                    tracing::warn!(%error, node, "publishing events to the broker failed; will retry with the next node");
                    if let Ok(depth) = store.broker_backlog().await {
                        crate::metrics::broker_backlog(depth);
                    }
                }
            }
            // A connection that served a while starts the pauses again from the shortest.
            if started.elapsed() > Duration::from_secs(10) {
                pause = Duration::from_millis(100);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    })
}

/// One connection's life: publishes until something fails.
async fn publish(
    store: &Store,
    settings: &PublisherSettings,
    url: &str,
    node: usize,
) -> Result<(), BoxError> {
    // A node still booting accepts the TCP connection and may answer nothing for a minute:
    // the setup is bounded, and tried again.
    let setup = async {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channel
            .exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok::<_, BoxError>((connection, channel))
    };
    let (_connection, channel) = tokio::time::timeout(SETUP_TIMEOUT, setup)
        .await
        .map_err(|_| format!("the broker did not answer within {SETUP_TIMEOUT:?}"))??;
    tracing::info!(node, "publishing the outbox's events to the broker");
    loop {
        let now_ms = checkout_idempotency::now_ms();
        let events = store.unpublished_events(BATCH, now_ms).await?;
        crate::metrics::broker_backlog(store.broker_backlog().await?);
        crate::metrics::broker_unrouted(store.broker_unrouted().await?);
        if events.is_empty() {
            tokio::time::sleep(settings.poll).await;
            continue;
        }
        let mut confirms = Vec::with_capacity(events.len());
        for event in &events {
            let properties = BasicProperties::default()
                .with_message_id(event.event_id.as_str().into())
                .with_type(event.event_type.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2); // persistent
            let confirm = channel
                .basic_publish(
                    EXCHANGE.into(),
                    event.event_type.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    event.body.as_bytes(),
                    properties,
                )
                .await?;
            confirms.push(confirm);
        }
        let mut confirmed = Vec::with_capacity(events.len());
        let mut returned = Vec::new();
        for (event, confirm) in events.iter().zip(confirms) {
            let confirm = tokio::time::timeout(SETUP_TIMEOUT, confirm)
                .await
                .map_err(|_| format!("no confirm within {SETUP_TIMEOUT:?}"))??;
            match confirm {
                Confirmation::Ack(None) => confirmed.push(event.event_id.clone()),
                Confirmation::Ack(Some(_)) => {
                    let wait = RETURNED_FIRST_WAIT_MS
                        .saturating_mul(1 << event.broker_returns.clamp(0, 20))
                        .min(RETURNED_LONGEST_WAIT_MS);
                    if event.broker_returns == 0 {
                        tracing::warn!(
                            event_id = %event.event_id, event_type = %event.event_type,
                            "no queue took the event (none is bound to its type yet): it is offered again later"
                        );
                    }
                    returned.push((event.event_id.clone(), now_ms + wait));
                }
                other => {
                    return Err(format!(
                        "the broker did not confirm {}: {other:?}",
                        event.event_id
                    )
                    .into());
                }
            }
        }
        if let Some(after_confirm) = &settings.after_confirm {
            after_confirm();
        }
        let count = confirmed.len();
        store
            .mark_published(confirmed, checkout_idempotency::now_ms())
            .await?;
        crate::metrics::published(count);
        if !returned.is_empty() {
            store.mark_returned(returned).await?;
        }
    }
}
