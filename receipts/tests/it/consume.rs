//! The shipped `receipts` on a real RabbitMQ node, the checkout's events published to its
//! exchange as the checkout publishes them (same exchange, routing key = type, message_id = the
//! event's id): a payment and a refund become «приход» and «возврат прихода» with their lines;
//! the same message again changes nothing; what cannot be a receipt goes to the dead-letter
//! queue with its reason and is never retried; `GET /receipts` answers bad queries with 400.

use std::time::Duration;

use checkout_testkit::rabbitmq::Broker;
use checkout_testkit::receipts::Consumer;
use checkout_testkit::{Backend, TestDb};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use serde_json::{Value, json};

const RECEIPTS: &str = env!("CARGO_BIN_EXE_receipts");

checkout_testkit::on_both_databases!(events_become_receipts_once_and_bad_ones_are_dead_lettered);

async fn publish(channel: &Channel, message_id: &str, event: &Value) {
    let properties = BasicProperties::default()
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let confirm = channel
        .basic_publish(
            "checkout.events".into(),
            event["type"].as_str().unwrap_or("payment.succeeded").into(),
            BasicPublishOptions::default(),
            event.to_string().as_bytes(),
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "the broker holds {message_id}");
}

fn payment(payment_id: &str, amount: i64, items: Value) -> Value {
    json!({"type": "payment.succeeded", "livemode": false, "timestamp": "2026-12-04T10:00:00.000Z",
           "data": {"payment_id": payment_id, "order_id": "A-1", "amount": amount,
                    "currency": "RUB", "status": "succeeded", "items": items,
                    "description": null}})
}

async fn events_become_receipts_once_and_bad_ones_are_dead_lettered(backend: Backend) {
    let broker = tokio::task::spawn_blocking(Broker::start).await.unwrap();
    let db = TestDb::new(backend).await;
    let consumer = Consumer::start(RECEIPTS, &broker.url(), &db.url, &[]).await;
    consumer
        .wait_for_log("consuming", Duration::from_secs(30))
        .await;

    let connection =
        lapin::Connection::connect(&broker.url(), lapin::ConnectionProperties::default())
            .await
            .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let paid = payment(
        "pay_1",
        25_000,
        json!([{"name": "Чай улун", "quantity": 2, "unit_price": 10_000},
               {"name": "Мёд", "quantity": 1, "unit_price": 5_000}]),
    );
    publish(&channel, "evt_1", &paid).await;
    let refund = json!({"type": "refund.succeeded", "livemode": false,
        "timestamp": "2026-12-04T11:00:00.000Z",
        "data": {"refund_id": "re_1", "payment_id": "pay_1", "order_id": "A-1",
                 "amount": 5_000, "refunded_total": 5_000, "currency": "RUB"}});
    publish(&channel, "evt_2", &refund).await;
    // The publisher's copy after a lost confirm: the same message_id, the same body.
    publish(&channel, "evt_1", &paid).await;
    // Not a receipt: sums that do not add up; not JSON at all; the same message_id with another
    // body; the same payment told by another event.
    publish(
        &channel,
        "evt_3",
        &payment(
            "pay_3",
            999,
            json!([{"name": "x", "quantity": 1, "unit_price": 1}]),
        ),
    )
    .await;
    let garbage = BasicProperties::default().with_message_id("evt_4".into());
    channel
        .basic_publish(
            "checkout.events".into(),
            "payment.succeeded".into(),
            BasicPublishOptions::default(),
            b"{not json",
            garbage,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    publish(&channel, "evt_1", &payment("pay_1", 1, json!([]))).await;
    publish(&channel, "evt_5", &paid).await;

    let listed = consumer.wait_for_receipts(2, Duration::from_secs(30)).await;
    // Every bad message reaches the dead-letter queue, each with its reason.
    let dead = channel
        .basic_consume(
            "receipts.dead".into(),
            "test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let reasons: Vec<(String, String)> = dead
        .take(4)
        .then(|delivery| async move {
            let delivery = delivery.unwrap();
            delivery.ack(BasicAckOptions::default()).await.unwrap();
            let headers = delivery.properties.headers().clone().unwrap_or_default();
            let reason = match headers.inner().get("x-receipts-reason") {
                Some(AMQPValue::LongString(reason)) => reason.to_string(),
                other => panic!("a dead letter carries its reason: {other:?}"),
            };
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string();
            (id, reason)
        })
        .collect()
        .await;
    let reason_of = |id: &str| {
        reasons
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("{id} was dead-lettered: {reasons:?}"))
    };
    assert!(reason_of("evt_3").contains("the lines add up to 1, not to the amount 999"));
    assert!(reason_of("evt_4").contains("not JSON"));
    assert!(
        reason_of("evt_1").contains("came before with another body"),
        "{reasons:?}"
    );
    assert!(
        reason_of("evt_5").contains("pay_1 has its receipt rcp_"),
        "{reasons:?}"
    );

    // Exactly the two receipts, as a person reading them would check.
    // Read again now that every message has been handled (the dead letters came last).
    drop(listed);
    let listed = consumer.listed().await;
    let receipts = listed["receipts"].as_array().unwrap();
    assert_eq!(receipts.len(), 2, "{listed}");
    let income = receipts.iter().find(|r| r["kind"] == "income").unwrap();
    assert_eq!(income["title"], "Кассовый чек. Приход");
    assert_eq!(income["payment_id"], "pay_1");
    assert_eq!(income["total"], 25_000);
    assert_eq!(
        income["lines"][0],
        json!({"name": "Чай улун", "quantity": 2, "unit_price": 10_000, "total": 20_000})
    );
    assert_eq!(income["operation_at"], "2026-12-04T10:00:00.000Z");
    let back = receipts
        .iter()
        .find(|r| r["kind"] == "income_return")
        .unwrap();
    assert_eq!(back["title"], "Кассовый чек. Возврат прихода");
    assert_eq!(back["refund_id"], "re_1");
    assert_eq!(back["lines"][0]["name"], "Возврат по заказу A-1");
    assert_eq!(
        listed["totals"],
        json!({"income": 1, "returns": 1, "net": 20_000})
    );
    assert_eq!(
        consumer
            .counter("receipts_messages_total{outcome=\"issued\"}")
            .await,
        2.0
    );
    assert_eq!(
        consumer
            .counter("receipts_messages_total{outcome=\"duplicate\"}")
            .await,
        1.0
    );
    assert_eq!(
        consumer
            .counter("receipts_messages_total{outcome=\"dead_lettered\"}")
            .await,
        4.0
    );

    let only = consumer
        .get("/receipts?payment_id=pay_1&limit=1")
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(only["receipts"].as_array().unwrap().len(), 1);
    // Page by page: one, then the one after it, then no more.
    let page = |query: String| {
        let consumer = &consumer;
        async move {
            consumer
                .get(&format!("/receipts?{query}"))
                .await
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let first = page("limit=1".into()).await;
    assert_eq!(first["has_more"], true);
    let next = first["next_page"].as_str().unwrap().to_owned();
    assert_eq!(first["receipts"][0]["receipt_id"], next.as_str());
    let second = page(format!("limit=1&starting_after={next}")).await;
    assert_eq!(second["has_more"], false);
    assert_eq!(second["next_page"], Value::Null);
    assert_ne!(
        second["receipts"][0]["receipt_id"],
        first["receipts"][0]["receipt_id"]
    );
    for bad in ["limit=0", "limit=10001", "limit=many"] {
        let answer = consumer.get(&format!("/receipts?{bad}")).await;
        assert_eq!(answer.status(), 400, "{bad}");
        assert_eq!(answer.headers()["content-type"], "application/problem+json");
    }
    // The receipts (names of goods, amounts) and the counters are for whoever holds the token.
    let http = reqwest::Client::new();
    for path in ["/receipts", "/metrics"] {
        let bare = reqwest::get(format!("{}{path}", consumer.base))
            .await
            .unwrap();
        assert_eq!(bare.status(), 401, "{path} without the token");
        let wrong = http
            .get(format!("{}{path}", consumer.base))
            .bearer_auth("rct_guess")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "{path} with another token");
    }
    let health = reqwest::get(format!("{}/health", consumer.base))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}
