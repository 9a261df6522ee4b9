//! The checkout dies between the broker's confirm and marking its events published (the
//! `crash_after_broker_confirm` fault aborts the process right there), on both databases: the
//! event stays unmarked, the server started again publishes it a second time with the same
//! `message_id`, and then marks it. At least once, never lost; the receipts consumer's inbox,
//! keyed by `message_id`, absorbs the copy: one receipt.

use std::time::{Duration, Instant};

use checkout_testkit::rabbitmq::Broker;
use checkout_testkit::receipts::{Consumer, assert_match_the_books};
use checkout_testkit::{Backend, Server, TestDb, new_key, pay_session};
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use reqwest::StatusCode;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");
const RECEIPTS: &str = env!("CARGO_BIN_EXE_receipts-chaos");

checkout_testkit::on_both_databases!(a_crash_between_confirm_and_mark_publishes_the_event_again);

async fn a_crash_between_confirm_and_mark_publishes_the_event_again(backend: Backend) {
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let (_connection, channel) = broker.bound_queue("payments", "payment.succeeded").await;
    let mut messages = channel
        .basic_consume(
            "payments".into(),
            "test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut next_message_id = async || {
        let delivery = tokio::time::timeout(Duration::from_secs(60), messages.next())
            .await
            .expect("a message within 60 s")
            .expect("the consumer runs")
            .expect("a delivery");
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string()
    };

    let db = TestDb::new(backend).await;
    let receipts_db = TestDb::new(backend).await;
    let url = broker.url();
    let receipts = Consumer::start(RECEIPTS, &url, &receipts_db.url, &[]).await;
    receipts
        .wait_for_log("consuming", Duration::from_secs(60))
        .await;
    let mut server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_AMQP_URL", &url),
            ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
            ("CHECKOUT_FAULTS", "crash_after_broker_confirm=1"),
        ],
    )
    .await;
    let shop = server.add_shop("Лавка, что падает").await;
    let shopper = server.api().shopper().await;
    let session = shop.session("C-1", 10_000).await;
    let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
    assert_eq!(paid.status, StatusCode::CREATED);
    let event_id = db
        .scalar_text("SELECT event_id FROM webhook_events WHERE type = 'payment.succeeded'")
        .await;

    // Published and confirmed; the process died before marking it.
    assert_eq!(next_message_id().await, event_id);
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.exited().is_none() {
        assert!(Instant::now() < deadline, "the fault ends the process");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The log is read by a thread of its own: its last lines may come a moment after the exit.
    let said = || async {
        server
            .log()
            .contains("FAULT: crashing after the broker's confirm")
    };
    checkout_testkit::wait_until(
        "the fault never said it crashed",
        Duration::from_secs(10),
        said,
    )
    .await;
    let unmarked = "SELECT COUNT(*) FROM webhook_events WHERE published_at IS NULL";
    assert_eq!(
        db.scalar(unmarked).await,
        1,
        "the confirm was never recorded"
    );

    // Started again: the same event, the same message_id, a second time; then marked.
    let _server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_AMQP_URL", &url),
            ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
        ],
    )
    .await;
    assert_eq!(
        next_message_id().await,
        event_id,
        "published again, same id"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.scalar(unmarked).await > 0 {
        assert!(Instant::now() < deadline, "marked once confirmed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events").await,
        1,
        "one event in the outbox; two copies on the broker"
    );
    db.assert_invariants().await;

    // The consumer took both copies: one receipt, the second copy absorbed by its inbox.
    let duplicate = "receipts_messages_total{outcome=\"duplicate\"}";
    let deadline = Instant::now() + Duration::from_secs(30);
    while receipts.counter(duplicate).await < 1.0 {
        assert!(Instant::now() < deadline, "the copy reaches the consumer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = receipts.listed().await;
    assert_eq!(listed["receipts"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["receipts"][0]["event_id"], event_id.as_str());
    assert_match_the_books(&db, &listed).await;
}
