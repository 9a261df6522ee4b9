//! The outbox published to a real RabbitMQ node (`CHECKOUT_AMQP_URL`), on both databases: every
//! event reaches a queue bound to `checkout.events`, persistent, its `message_id` the event's
//! id and its routing key its type, and is marked published only once the broker confirmed it;
//! a broker that is down never delays a payment, only grows the backlog, and everything kept
//! meanwhile is published once it is back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use checkout_testkit as support;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use reqwest::StatusCode;
use support::rabbitmq::Broker;
use support::{Backend, Server, TestDb, new_key, pay_session};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

checkout_testkit::on_both_databases!(the_outbox_reaches_the_broker_once_confirmed);

/// A message as the consumer saw it: routing key, body, delivery mode.
type Seen = BTreeMap<String, (String, String, Option<u8>)>;

/// A durable queue bound to every event (`Broker::bound_queue`); consumes until `seen` holds
/// `n` messages (acking each).
async fn consume(broker: &Broker, seen: &mut Seen, n: usize) {
    let (connection, channel) = broker.bound_queue("all-events", "#").await;
    if seen.len() >= n {
        return;
    }
    let mut consumer = channel
        .basic_consume(
            "all-events".into(),
            "test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < n {
        let next = tokio::time::timeout_at(deadline.into(), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("{n} messages within 60 s, got {}", seen.len()));
        let delivery = next.expect("the consumer runs").expect("a delivery");
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .expect("every message has its event's id")
            .to_string();
        seen.insert(
            id,
            (
                delivery.routing_key.to_string(),
                String::from_utf8(delivery.data.clone()).unwrap(),
                *delivery.properties.delivery_mode(),
            ),
        );
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    let _ = connection.close(200, "done".into()).await;
}

/// The outbox as the database holds it: id → (type, body).
async fn outbox(db: &TestDb) -> BTreeMap<String, (String, String)> {
    let ids = db
        .texts("SELECT event_id FROM webhook_events ORDER BY seq")
        .await;
    let mut events = BTreeMap::new();
    for id in ids {
        let kind = db
            .scalar_text(&format!(
                "SELECT type FROM webhook_events WHERE event_id = '{id}'"
            ))
            .await;
        let body = db
            .scalar_text(&format!(
                "SELECT body FROM webhook_events WHERE event_id = '{id}'"
            ))
            .await;
        events.insert(id, (kind, body));
    }
    events
}

async fn unpublished(db: &TestDb) -> i64 {
    db.scalar("SELECT COUNT(*) FROM webhook_events WHERE published_at IS NULL")
        .await
}

async fn the_outbox_reaches_the_broker_once_confirmed(backend: Backend) {
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let mut seen = Seen::new();
    consume(&broker, &mut seen, 0).await; // the queue exists before anything is sent
    let db = TestDb::new(backend).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_AMQP_URL", &broker.url()),
            ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
        ],
    )
    .await;
    let shop = server.add_shop("Лавка с брокером").await;
    let shopper = server.api().shopper().await;
    let pay = async |order: &str| {
        let session = shop.session(order, 10_000).await;
        let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
        assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
        paid.json()["payment_id"].as_str().unwrap().to_owned()
    };
    let first = pay("B-1").await;
    pay("B-2").await;
    pay("B-3").await;
    assert_eq!(
        shop.refund(&first, &new_key(), 2_500).await.status,
        StatusCode::CREATED
    );

    consume(&broker, &mut seen, 4).await;
    let events = outbox(&db).await;
    assert_eq!(events.len(), 4);
    for (id, (kind, body)) in &events {
        let (routing_key, data, mode) = seen.get(id).expect("every event reached the queue");
        assert_eq!((routing_key, data), (kind, body), "{id}");
        assert_eq!(*mode, Some(2), "persistent");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while unpublished(&db).await > 0 {
        assert!(
            Instant::now() < deadline,
            "every confirmed event is marked published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The broker dies: payments go on, answered as before; their events wait.
    tokio::task::block_in_place(|| broker.kill());
    let started = Instant::now();
    pay("B-4").await;
    pay("B-5").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a broker that is down never holds a payment ({:?})",
        started.elapsed()
    );
    assert_eq!(
        unpublished(&db).await,
        2,
        "the backlog holds the two new events"
    );

    // Back: what was kept is published; nothing is lost, the queue kept its messages.
    tokio::task::block_in_place(|| broker.restart());
    consume(&broker, &mut seen, 6).await;
    let events = outbox(&db).await;
    assert_eq!(events.len(), 6);
    assert!(
        events.keys().all(|id| seen.contains_key(id)),
        "every event reached the queue"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while unpublished(&db).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the backlog drains once the broker is back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    db.assert_invariants().await;
}
