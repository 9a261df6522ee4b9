//! The consumer: the lesson's second half on a real broker. RabbitMQ delivers at least once —
//! again when an ack is lost, again to another consumer when one dies holding unacknowledged
//! messages — so each message runs through the same protocol as the checkout's keyed requests,
//! with its `message_id` (the checkout's event id) as the key, in ONE transaction of the
//! receipts' database: claim the id in the inbox → write the receipt → store the outcome →
//! commit; **then** ack. Dying before the commit leaves no trace (the message comes again and
//! runs afresh); dying after it, the message comes again and finds its outcome: nothing
//! changes. A message that cannot become a receipt goes to the dead-letter queue with the
//! reason in a header, then is acked: never dropped, never retried forever.
//!
//! Messages are taken in batches — whatever deliveries are here when the last batch is handed
//! on, up to the prefetch — and a batch is one transaction (`Protocol::execute_many`), so that
//! a commit is paid per batch rather than per message: the receipts are written, each holding
//! its message's id and fingerprint (the late claim, see [`crate::store::Inbox`]). The acks
//! still follow the commit that holds their messages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkout_idempotency::{
    Claim, Decision, KeyedRequest, Operation, Outcome, Protocol, StoredResponse,
};
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use serde_json::Value;

use crate::receipt::{self, NewReceipt, PAYMENT_SUCCEEDED, REFUND_SUCCEEDED};
use crate::store::{self, InboxTx, Issued, Store, StoreError};

/// The checkout's exchange (declared here too, as the checkout declares it: either may start
/// first).
pub const EXCHANGE: &str = checkout_shared::EVENTS_EXCHANGE;
/// What a receipt is issued for: the queue's bindings.
pub const ROUTING_KEYS: [&str; 2] = [PAYMENT_SUCCEEDED, REFUND_SUCCEEDED];
/// The header a dead-lettered message carries its reason in.
pub const REASON_HEADER: &str = "x-receipts-reason";
/// A message handed out this many times without an ack (consumers dying on it, say) is
/// dead-lettered by the broker itself.
const DELIVERY_LIMIT: i32 = 50;
/// How long the inbox remembers a message: far longer than the broker keeps one. Past it, the
/// receipts' unique indexes still refuse a second receipt for a payment.
/// Connecting, declaring and starting to consume, at most.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
pub const INBOX_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

pub const MESSAGES_METRIC: &str = "receipts_messages_total";
pub const REDELIVERED_METRIC: &str = "receipts_redelivered_total";
pub const LAG_METRIC: &str = "receipts_lag_seconds";
pub const CONSUMING_METRIC: &str = "receipts_consuming";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Debug)]
pub struct ConsumerSettings {
    pub amqp_url: String,
    /// The quorum queue this consumer (and any other with the same name) takes from; also its
    /// inbox's scope.
    pub queue: String,
    /// How many unacknowledged messages the broker hands this consumer at once.
    pub prefetch: u16,
}

impl ConsumerSettings {
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead", self.queue)
    }
}

/// Test seams; the shipped binary has none. Each can delay the consumer, never make it do what
/// it would not do on its own.
#[derive(Clone, Default)]
pub struct Seams {
    /// Awaited after a receipt's commit, before its ack (a fault may never return: the test
    /// then kills the process holding the message unacknowledged).
    pub after_commit: Option<AfterCommit>,
}

/// Given the message id; what it returns is awaited before the ack.
pub type AfterCommit = Arc<dyn Fn(&str) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Consumes until the process ends: a lost connection, a broker restarting or a queue not yet
/// ready is retried with growing pauses (100 ms to 5 s).
pub async fn run(store: Store, settings: ConsumerSettings, seams: Seams) {
    let protocol = Protocol::new(INBOX_TTL);
    let mut pause = Duration::from_millis(100);
    let mut nodes = checkout_shared::broker::BrokerNodes::parse(&settings.amqp_url);
    loop {
        let started = Instant::now();
        let Some((node, url)) = nodes.next_node() else {
            tracing::error!("RECEIPTS_AMQP_URL names no broker node; not consuming");
            return;
        };
        match consume(&store, &protocol, &settings, &seams, url).await {
            Ok(()) => tracing::warn!(node, "the broker ended the consumer; consuming again"),
            Err(error) => tracing::warn!(
                %error, node, "consuming from the broker failed; will retry with the next node"
            ),
        }
        metrics::gauge!(CONSUMING_METRIC).set(0.0);
        if started.elapsed() > Duration::from_secs(10) {
            pause = Duration::from_millis(100);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// The exchange, the queue (quorum: replicated, and it counts deliveries), its bindings and
/// its dead-letter queue (quorum too); declaring what exists already changes nothing.
pub async fn declare(channel: &Channel, settings: &ConsumerSettings) -> Result<(), BoxError> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
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
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let dead = settings.dead_letter_queue();
    let mut arguments = quorum.clone();
    // A message handed out DELIVERY_LIMIT times unacknowledged is the broker's to dead-letter.
    arguments.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongInt(DELIVERY_LIMIT),
    );
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    channel
        .queue_declare(settings.queue.as_str().into(), durable, arguments)
        .await?;
    channel
        .queue_declare(dead.as_str().into(), durable, quorum)
        .await?;
    for key in ROUTING_KEYS {
        channel
            .queue_bind(
                settings.queue.as_str().into(),
                EXCHANGE.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok(())
}

/// One connection's life.
async fn consume(
    store: &Store,
    protocol: &Protocol,
    settings: &ConsumerSettings,
    seams: &Seams,
    url: &str,
) -> Result<(), BoxError> {
    // A node still booting accepts the TCP connection and may answer nothing for a minute:
    // the whole setup is bounded, and tried again.
    let setup = async {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        declare(&channel, settings).await?;
        channel
            .basic_qos(settings.prefetch, BasicQosOptions::default())
            .await?;
        // Dead letters are published with confirms, on their own channel: the original is
        // acked only once the broker holds its dead letter.
        let dead_letters = connection.create_channel().await?;
        dead_letters
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let deliveries = channel
            .basic_consume(
                settings.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok::<_, BoxError>((connection, dead_letters, deliveries))
    };
    let (_connection, dead_letters, mut deliveries) = tokio::time::timeout(SETUP_TIMEOUT, setup)
        .await
        .map_err(|_| format!("the broker did not answer within {SETUP_TIMEOUT:?}"))??;
    metrics::gauge!(CONSUMING_METRIC).set(1.0);
    tracing::info!(
        queue = settings.queue,
        prefetch = settings.prefetch,
        "consuming"
    );
    let handler = Arc::new(Handler {
        store: store.clone(),
        protocol: protocol.clone(),
        settings: settings.clone(),
        seams: seams.clone(),
        dead_letters,
    });
    // Batches in tasks of their own (a transaction is never dropped midway), a few at once: one
    // committing while the next is written.
    let turns = Arc::new(tokio::sync::Semaphore::new(BATCHES_AT_ONCE));
    loop {
        let turn = turns.clone().acquire_owned().await?;
        let batch = next_batch(&mut deliveries, usize::from(settings.prefetch)).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let handler = handler.clone();
        tokio::spawn(async move { handler.handle(batch, turn).await });
    }
}

/// Batches being written at once.
pub const BATCHES_AT_ONCE: usize = 2;
/// Unacknowledged messages the broker hands a consumer at once, unless told otherwise: also the
/// most a batch holds. A hundred lets batches of a few dozen form under load (each commit and
/// the protocol's two statements shared by as many receipts) at a few kilobytes held.
pub const DEFAULT_PREFETCH: u16 = 100;

/// The next delivery, waited for, and every other one already here, up to `max`: a batch never
/// waits to fill, it is whatever came while the batches before it were written (group commit).
/// Empty once the broker ends the consumer.
pub async fn next_batch(
    deliveries: &mut lapin::Consumer,
    max: usize,
) -> Result<Vec<Delivery>, lapin::Error> {
    let mut batch = Vec::new();
    let Some(first) = deliveries.next().await else {
        return Ok(batch);
    };
    batch.push(first?);
    while batch.len() < max {
        match deliveries.next().now_or_never() {
            Some(Some(delivery)) => batch.push(delivery?),
            _ => break,
        }
    }
    Ok(batch)
}

struct Handler {
    store: Store,
    protocol: Protocol,
    settings: ConsumerSettings,
    seams: Seams,
    dead_letters: Channel,
}

impl Handler {
    /// A batch of deliveries: the readable ones through the protocol in one transaction, then
    /// each settled with the broker: acked after the commit, dead-lettered, or requeued. The
    /// turn is given back once the transaction is over: settling waits on the broker only.
    async fn handle(&self, deliveries: Vec<Delivery>, turn: tokio::sync::OwnedSemaphorePermit) {
        let mut readable = Vec::with_capacity(deliveries.len());
        let mut settled = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            if delivery.redelivered {
                metrics::counter!(REDELIVERED_METRIC).increment(1);
            }
            let message_id = message_id(&delivery);
            match read(&message_id, &delivery.data) {
                Ok((body, receipt)) => readable.push((delivery, message_id, body, receipt)),
                Err(reason) => settled.push((delivery, message_id, Handled::Refused(reason))),
            }
        }
        let outcomes = issue_receipts(
            &self.store,
            &self.protocol,
            &self.settings.queue,
            readable
                .iter()
                .map(|(_, id, body, receipt)| (id.as_str(), body, receipt.clone()))
                .collect(),
        )
        .await;
        drop(turn);
        for ((delivery, message_id, _, receipt), outcome) in readable.into_iter().zip(outcomes) {
            let handled = handled(&message_id, delivery.redelivered, &receipt, outcome);
            settled.push((delivery, message_id, handled));
        }
        futures::future::join_all(
            settled
                .into_iter()
                .map(|(delivery, message_id, handled)| self.settle(delivery, message_id, handled)),
        )
        .await;
    }

    async fn settle(&self, delivery: Delivery, message_id: String, outcome: Handled) {
        let ended = match &outcome {
            Handled::Issued | Handled::Duplicate => {
                if let Some(after_commit) = &self.seams.after_commit {
                    after_commit(&message_id).await;
                }
                delivery.ack(BasicAckOptions::default()).await.map(|_| ())
            }
            Handled::Refused(reason) => self.dead_letter(&delivery, &message_id, reason).await,
            Handled::Later => {
                // Another consumer holds this message right now, or the database is away: the
                // broker hands it out again (after a pause, so as not to spin on it).
                tokio::time::sleep(Duration::from_millis(200)).await;
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await
                    .map(|_| ())
            }
        };
        let outcome = match &outcome {
            Handled::Issued => "issued",
            Handled::Duplicate => "duplicate",
            Handled::Refused(_) => "dead_lettered",
            Handled::Later => "requeued",
        };
        metrics::counter!(MESSAGES_METRIC, "outcome" => outcome).increment(1);
        // The channel is gone (a broker restart): the message comes again, and the inbox
        // knows it.
        if let Err(error) = ended {
            tracing::warn!(%error, message_id, "could not settle a message with the broker");
        }
    }

    /// Publishes the message to the dead-letter queue with its reason, confirmed; then acks it.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        message_id: &str,
        reason: &str,
    ) -> Result<(), lapin::Error> {
        tracing::error!(
            message_id,
            reason,
            "message dead-lettered: no receipt issued"
        );
        let mut headers = delivery.properties.headers().clone().unwrap_or_default();
        headers.insert(REASON_HEADER.into(), AMQPValue::LongString(reason.into()));
        headers.insert(
            "x-original-routing-key".into(),
            AMQPValue::LongString(delivery.routing_key.as_str().into()),
        );
        let properties = delivery.properties.clone().with_headers(headers);
        let confirm = self
            .dead_letters
            .basic_publish(
                "".into(),
                self.settings.dead_letter_queue().as_str().into(),
                BasicPublishOptions::default(),
                &delivery.data,
                properties,
            )
            .await?
            .await?;
        if !matches!(confirm, Confirmation::Ack(_)) {
            // Not held by the broker: the original stays unacknowledged and comes again.
            return delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
                .map(|_| ());
        }
        delivery.ack(BasicAckOptions::default()).await.map(|_| ())
    }
}

/// What became of one message.
enum Handled {
    /// Its receipt was written now.
    Issued,
    /// Seen before (a redelivery, or the publisher's copy): its receipt exists; nothing changed.
    Duplicate,
    /// It cannot be a receipt: to the dead-letter queue, with why.
    Refused(String),
    /// Not now: back to the queue.
    Later,
}

/// The message's id (the checkout's event id), or empty when it has none.
pub fn message_id(delivery: &Delivery) -> String {
    delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string())
        .unwrap_or_default()
}

/// The event a message carries, and the receipt it asks for; or why it cannot be one.
pub fn read(message_id: &str, data: &[u8]) -> Result<(Value, NewReceipt), String> {
    if message_id.is_empty() {
        return Err("the message has no message_id".into());
    }
    let body: Value =
        serde_json::from_slice(data).map_err(|e| format!("the message is not JSON: {e}"))?;
    let receipt = receipt::from_event(message_id, &body)?;
    Ok((body, receipt))
}

/// What the protocol's outcome means for the message.
fn handled(
    message_id: &str,
    redelivered: bool,
    receipt: &NewReceipt,
    executed: Result<Outcome, StoreError>,
) -> Handled {
    match executed {
        Ok(Outcome::Executed { response, .. }) if response.status == 201 => {
            if let Some(lag) = lag_seconds(&receipt.operation_at) {
                metrics::histogram!(LAG_METRIC).record(lag);
            }
            tracing::info!(
                message_id,
                redelivered,
                receipt = response.body,
                "receipt issued"
            );
            Handled::Issued
        }
        Ok(Outcome::Replayed { response, .. }) if response.status == 201 => {
            tracing::info!(
                message_id,
                redelivered,
                "a message seen before: its receipt exists, nothing changed"
            );
            Handled::Duplicate
        }
        // A refusal stored under the key (its payment has a receipt by another event): the
        // same refusal each time it comes.
        Ok(Outcome::Executed { response, .. } | Outcome::Replayed { response, .. }) => {
            Handled::Refused(response.body)
        }
        Ok(Outcome::KeyReused { fields, .. }) => Handled::Refused(format!(
            "message_id {message_id} came before with another body (differing: {})",
            fields.join(", ")
        )),
        Ok(Outcome::InUse | Outcome::TryAgain) => Handled::Later,
        Err(error) => {
            tracing::error!(%error, message_id, "issuing a receipt failed; the message comes again");
            Handled::Later
        }
    }
}

/// The protocol's step for a batch of messages (`message_id`, event, receipt): every
/// `message_id` claimed in the inbox of `queue`, every receipt written, every outcome stored,
/// one commit. (Public for the benchmark, which measures it against the same receipts written
/// with no inbox.)
pub async fn issue_receipts(
    store: &Store,
    protocol: &Protocol,
    queue: &str,
    messages: Vec<(&str, &Value, NewReceipt)>,
) -> Vec<Result<Outcome, StoreError>> {
    let batch = messages
        .into_iter()
        .map(|(message_id, body, receipt)| {
            let request = KeyedRequest {
                scope: queue,
                key: message_id,
                method: "CONSUME",
                route: EXCHANGE,
                body,
            };
            (request, Issue(receipt))
        })
        .collect();
    protocol.execute_many(&store.inbox(), batch).await
}

/// The receipt written inside the inbox's transaction.
struct Issue(NewReceipt);

impl Operation<InboxTx> for Issue {
    type Error = StoreError;

    async fn apply(&self, tx: &mut InboxTx, claim: &Claim) -> Result<Decision, StoreError> {
        let response = match tx.issue(&self.0, claim).await? {
            Issued::Receipt(receipt_id) => store::issued_answer(&receipt_id),
            Issued::Refused => {
                let existing = tx.existing(&self.0).await?.unwrap_or_default();
                let subject = self.0.refund_id.as_deref().unwrap_or(&self.0.payment_id);
                StoredResponse {
                    status: 409,
                    body: format!(
                        "{subject} has its receipt {existing} already, issued from another event"
                    ),
                }
            }
            // Another consumer's copy of this message wrote its receipt after this claim: the
            // next attempt's claim finds it, and replays its answer.
            Issued::ClaimedMeanwhile => return Ok(Decision::Restart),
        };
        Ok(Decision::Respond(response))
    }
}

/// Seconds from when the money moved (the event's time) to now.
fn lag_seconds(operation_at: &str) -> Option<f64> {
    let at =
        time::OffsetDateTime::parse(operation_at, &time::format_description::well_known::Rfc3339)
            .ok()?;
    let lag = time::OffsetDateTime::now_utc() - at;
    Some(lag.as_seconds_f64().max(0.0))
}
