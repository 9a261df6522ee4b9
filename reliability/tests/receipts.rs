//! The receipts consumer under the broker's at-least-once delivery, on both checkout databases
//! (the receipts on the same kind: SQLite beside SQLite, PostgreSQL beside PostgreSQL), every
//! process real: the checkout publishing its outbox, RabbitMQ, one or two consumers.
//!
//! - ack lost: the consumer is SIGKILLed after its commit, before its ack; the message comes
//!   again to the consumer started next, which finds it in its inbox: no second receipt;
//! - rebalance: a consumer (prefetch 50) is killed holding 50 unacknowledged messages, every
//!   one of them with its receipt committed; the broker hands them to the other consumer,
//!   which absorbs them all;
//! - the broker is restarted mid-load: nothing is lost, nothing doubled.
//!
//! Each ends with the receipts matching the books: one per payment and per refund, for its
//! amount, summing to the payments minus the refunds.

use std::time::Duration;

use checkout_testkit::rabbitmq::Broker;
use checkout_testkit::receipts::{Consumer, assert_match_the_books};
use checkout_testkit::{Api, Backend, Server, Shop, TestDb, new_key, pay_session};
use reqwest::StatusCode;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");
const RECEIPTS: &str = env!("CARGO_BIN_EXE_receipts-chaos");
const WITHIN: Duration = Duration::from_secs(60);

checkout_testkit::on_both_databases!(
    an_ack_lost_after_the_commit_issues_no_second_receipt,
    a_consumer_killed_holding_messages_hands_them_to_the_other,
    a_broker_restarted_mid_load_loses_nothing,
    an_event_no_queue_took_waits_for_the_consumer_that_starts_later,
);

/// The checkout publishing to `broker`, with a shop and a test shopper.
async fn checkout(db: &TestDb, broker: &Broker) -> (Server, Shop, Api) {
    let url = broker.url();
    let server = Server::start_with(
        SERVER,
        db,
        &[
            ("CHECKOUT_AMQP_URL", &url),
            ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
        ],
    )
    .await;
    let shop = server.add_shop("Лавка с чеками").await;
    let shopper = server.api().shopper().await;
    (server, shop, shopper)
}

/// `count` sessions paid, and every `refund_every`-th payment partly refunded; how many
/// receipts that calls for.
async fn trade(
    shop: &Shop,
    shopper: &Api,
    prefix: &str,
    count: usize,
    refund_every: usize,
) -> usize {
    let mut receipts = 0;
    for i in 0..count {
        let session = shop.session(&format!("{prefix}-{i}"), 500 + i as i64).await;
        let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
        assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
        receipts += 1;
        if refund_every > 0 && i % refund_every == 0 {
            let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
            let refund = shop.refund(&payment_id, &new_key(), 100).await;
            assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
            receipts += 1;
        }
    }
    receipts
}

/// The receipts' own database, of the checkout's kind.
async fn receipts_db(backend: Backend) -> TestDb {
    TestDb::new(backend).await
}

async fn an_ack_lost_after_the_commit_issues_no_second_receipt(backend: Backend) {
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let (db, receipts) = (TestDb::new(backend).await, receipts_db(backend).await);
    let mut first = Consumer::start(
        RECEIPTS,
        &broker.url(),
        &receipts.url,
        &[("RECEIPTS_FAULTS", "hold_after_commit=1")],
    )
    .await;
    first.wait_for_log("consuming", WITHIN).await;
    let (_server, shop, shopper) = checkout(&db, &broker).await;
    let expected = trade(&shop, &shopper, "ACK", 1, 0).await;

    // Committed, never acknowledged; then the process is gone.
    first.wait_for_log("FAULT: holding", WITHIN).await;
    assert_eq!(
        first.listed().await["receipts"].as_array().unwrap().len(),
        1
    );
    first.kill();

    let second = Consumer::start(RECEIPTS, &broker.url(), &receipts.url, &[]).await;
    let duplicate = "receipts_messages_total{outcome=\"duplicate\"}";
    let deadline = std::time::Instant::now() + WITHIN;
    while second.counter(duplicate).await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "redelivered:\n{}",
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(second.counter("receipts_redelivered_total").await, 1.0);
    assert_eq!(
        second
            .counter("receipts_messages_total{outcome=\"issued\"}")
            .await,
        0.0
    );
    let listed = second.listed().await;
    assert_eq!(listed["receipts"].as_array().unwrap().len(), expected);
    assert_match_the_books(&db, &listed).await;
    db.assert_invariants().await;
}

async fn a_consumer_killed_holding_messages_hands_them_to_the_other(backend: Backend) {
    const PREFETCH: usize = 50;
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let (db, receipts) = (TestDb::new(backend).await, receipts_db(backend).await);
    // Acknowledges its first 9, then holds every message it commits.
    let mut holder = Consumer::start(
        RECEIPTS,
        &broker.url(),
        &receipts.url,
        &[
            ("RECEIPTS_FAULTS", "hold_after_commit=10"),
            ("RECEIPTS_PREFETCH", "50"),
        ],
    )
    .await;
    holder.wait_for_log("consuming", WITHIN).await;
    let (_server, shop, shopper) = checkout(&db, &broker).await;
    let expected = trade(&shop, &shopper, "RB", 80, 4).await;
    assert_eq!(expected, 100);

    // Its window is full: 50 messages committed and unacknowledged.
    let deadline = std::time::Instant::now() + WITHIN;
    while holder.log().matches("FAULT: holding").count() < PREFETCH {
        assert!(std::time::Instant::now() < deadline, "{}", holder.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = Consumer::start(
        RECEIPTS,
        &broker.url(),
        &receipts.url,
        &[("RECEIPTS_PREFETCH", "50")],
    )
    .await;
    holder.kill();

    let listed = other.wait_for_receipts(expected, WITHIN).await;
    let deadline = std::time::Instant::now() + WITHIN;
    while other
        .counter("receipts_messages_total{outcome=\"duplicate\"}")
        .await
        < PREFETCH as f64
    {
        assert!(std::time::Instant::now() < deadline, "{}", other.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        other
            .counter("receipts_messages_total{outcome=\"duplicate\"}")
            .await,
        PREFETCH as f64,
        "every message the killed consumer held came to the other, and was absorbed"
    );
    assert!(other.counter("receipts_redelivered_total").await >= PREFETCH as f64);
    assert_eq!(
        other
            .counter("receipts_messages_total{outcome=\"issued\"}")
            .await,
        (expected - 9 - PREFETCH) as f64
    );
    assert_eq!(listed["receipts"].as_array().unwrap().len(), expected);
    assert_match_the_books(&db, &listed).await;
}

async fn a_broker_restarted_mid_load_loses_nothing(backend: Backend) {
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let (db, receipts) = (TestDb::new(backend).await, receipts_db(backend).await);
    let consumer = Consumer::start(RECEIPTS, &broker.url(), &receipts.url, &[]).await;
    consumer.wait_for_log("consuming", WITHIN).await;
    let (_server, shop, shopper) = checkout(&db, &broker).await;
    let mut expected = trade(&shop, &shopper, "BR1", 20, 3).await;
    // Mid-load the node is restarted (`rabbitmqctl stop`, as for an upgrade): connections
    // drop with publishes unconfirmed and deliveries unacknowledged, and payments go on
    // meanwhile; then it comes back on its data. (Not SIGKILL: RabbitMQ 3.10's single node,
    // killed so, came back without its quorum queue's Ra member and never elected a leader
    // for it again: see README, "Events to a broker".)
    let broker = std::sync::Arc::new(broker);
    let stopped = broker.clone();
    tokio::task::spawn_blocking(move || stopped.stop())
        .await
        .unwrap();
    expected += trade(&shop, &shopper, "BR2", 10, 3).await;
    let restarted = broker.clone();
    tokio::task::spawn_blocking(move || restarted.start_again())
        .await
        .unwrap();
    expected += trade(&shop, &shopper, "BR3", 20, 3).await;

    let listed = consumer
        .wait_for_receipts(expected, Duration::from_secs(120))
        .await;
    assert_eq!(listed["receipts"].as_array().unwrap().len(), expected);
    assert_match_the_books(&db, &listed).await;
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events WHERE published_at IS NULL")
            .await,
        0,
        "every event published and confirmed"
    );
    db.assert_invariants().await;
}

/// A fresh deployment: the checkout and the broker are up, the receipts consumer is not (so no
/// queue is bound yet). A payment's event reaches the broker, which routes it nowhere: it is
/// not "published" (the broker confirms a message no queue took), and is offered again until
/// a queue takes it. The consumer starts later, and the receipt is issued.
async fn an_event_no_queue_took_waits_for_the_consumer_that_starts_later(backend: Backend) {
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let (db, receipts) = (TestDb::new(backend).await, receipts_db(backend).await);
    let (server, shop, shopper) = checkout(&db, &broker).await;
    let expected = trade(&shop, &shopper, "EARLY", 1, 0).await;
    // The broker has had the event (and answered): it took it nowhere.
    let offered = || async {
        server.log().contains("no queue took")
            || db
                .scalar("SELECT COUNT(*) FROM webhook_events WHERE published_at IS NOT NULL")
                .await
                > 0
    };
    checkout_testkit::wait_until("the event never reached the broker", WITHIN, offered).await;
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM webhook_events \
              WHERE type = 'payment.succeeded' AND published_at IS NOT NULL"
        )
        .await,
        0,
        "an event no queue took is not published"
    );
    let consumer = Consumer::start(RECEIPTS, &broker.url(), &receipts.url, &[]).await;
    let listed = consumer.wait_for_receipts(expected, WITHIN).await;
    assert_eq!(listed["receipts"].as_array().unwrap().len(), expected);
    assert_match_the_books(&db, &listed).await;
    db.assert_invariants().await;
}

mod campaign {
    use std::time::Duration;

    use checkout_reliability::receipts::{ReceiptsPlan, run};
    use checkout_testkit::Backend;

    /// The receipts campaign, bounded: a few seconds of load, consumers killed every second,
    /// the broker restarted once (one node), or a node of a three-node cluster SIGKILLed.
    async fn bounded(backend: Backend, broker_nodes: usize) {
        let plan = ReceiptsPlan {
            backend,
            clients: 4,
            load: Duration::from_secs(8),
            chaos_every: Duration::from_secs(1),
            broker_every: 4,
            broker_nodes,
        };
        let report = run(&plan, super::SERVER, super::RECEIPTS).await;
        eprintln!("{}", report.summary());
        assert!(
            report.consumer_kills >= 3 && report.broker_restarts >= 1,
            "{}",
            report.summary()
        );
        assert!(
            report.payments > 0 && report.refunds > 0,
            "{}",
            report.summary()
        );
        assert!(
            report.redelivered > 0,
            "the kills left messages to redeliver: {}",
            report.summary()
        );
        assert!(report.violations.is_empty(), "{:#?}", report.violations);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        bounded(Backend::Sqlite, 1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        bounded(Backend::Postgres, 1).await;
    }

    /// Three RabbitMQ nodes, one SIGKILLed mid-load (a lone node cannot survive that; a
    /// quorum queue on three can): still exactly one receipt per payment and refund.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_on_a_three_node_broker() {
        bounded(Backend::Postgres, 3).await;
    }
}
