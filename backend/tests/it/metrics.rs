//! `GET /metrics` on its own address, scraped after a scripted sequence of requests against a
//! real server over real SQLite and real PostgreSQL: every counter has the exact value the
//! sequence implies.

use std::time::Duration;

use checkout_testkit as support;
use reqwest::StatusCode;
use support::receiver::Receiver;
use support::{Backend, Server, TestDb, metric as value, new_key, pay_session, session_request};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

checkout_testkit::on_both_databases!(a_scripted_sequence_scrapes_as_exact_counts);

async fn scrape(url: &str) -> String {
    let response = reqwest::get(url)
        .await
        .expect("the metrics address answers");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    response.text().await.unwrap()
}

async fn a_scripted_sequence_scrapes_as_exact_counts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let port = support::postgres::free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_METRICS_ADDR", &metrics_addr),
            ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
        ],
    )
    .await;
    let url = format!("http://{metrics_addr}/metrics");
    let receiver = Receiver::start().await;
    let shop = server
        .add_shop_with_webhook("Лавка с приборами", &receiver.url)
        .await;
    let shopper = server.api().shopper().await;

    // Sessions: a first execution, its replay, the key reused for another order.
    let key = new_key();
    let first = shop
        .try_session(&key, &session_request("M-1", 30_000))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        shop.try_session(&key, &session_request("M-1", 30_000))
            .await
            .replayed()
    );
    shop.try_session(&key, &session_request("M-2", 30_000))
        .await
        .assert_problem(422, "idempotency_key_reused");
    let session = first.json()["session_id"].as_str().unwrap().to_owned();

    // Payments: one paid and replayed, one declined for want of money.
    let key = new_key();
    let paid = shopper.pay(&key, &pay_session(&session)).await;
    assert_eq!(paid.status, StatusCode::CREATED);
    assert!(shopper.pay(&key, &pay_session(&session)).await.replayed());
    let too_dear = shop.session("M-3", 5_000_000).await;
    shopper
        .pay(&new_key(), &pay_session(&too_dear))
        .await
        .assert_problem(402, "insufficient_funds");

    // Refunds: one made, one over what is left.
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    assert_eq!(
        shop.refund(&payment_id, &new_key(), 10_000).await.status,
        StatusCode::CREATED
    );
    shop.refund(&payment_id, &new_key(), 25_000)
        .await
        .assert_problem(409, "refund_exceeds_payment");

    // The payment's and the refund's events reach the shop.
    receiver.wait_for(2, Duration::from_secs(20)).await;
    let delivered = || async {
        let text = scrape(&url).await;
        value(
            &text,
            "checkout_webhook_deliveries_total",
            &[("result", "delivered")],
        ) == Some(2.0)
            && value(&text, "checkout_outbox_depth", &[]) == Some(0.0)
    };
    support::wait_until("both events delivered", Duration::from_secs(20), delivered).await;

    let text = scrape(&url).await;
    let keyed = |route: &str, outcome: &str| {
        value(
            &text,
            "checkout_keyed_requests_total",
            &[("route", route), ("outcome", outcome)],
        )
    };
    assert_eq!(
        keyed("/api/checkout-sessions", "first"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(keyed("/api/checkout-sessions", "replay"), Some(1.0));
    assert_eq!(keyed("/api/checkout-sessions", "mismatch"), Some(1.0));
    assert_eq!(keyed("/api/checkout-sessions", "conflict"), None);
    assert_eq!(keyed("/api/payments", "first"), Some(2.0));
    assert_eq!(keyed("/api/payments", "replay"), Some(1.0));
    assert_eq!(
        keyed("/api/payments/{payment_id}/refunds", "first"),
        Some(2.0)
    );
    let declines = |code: &str| value(&text, "checkout_declines_total", &[("code", code)]);
    assert_eq!(declines("insufficient_funds"), Some(1.0));
    assert_eq!(declines("refund_exceeds_payment"), Some(1.0));
    let answered = |route: &str, outcome: &str, status: &str| {
        value(
            &text,
            "checkout_request_duration_seconds_count",
            &[("route", route), ("outcome", outcome), ("status", status)],
        )
    };
    assert_eq!(answered("/api/payments", "first", "2xx"), Some(1.0));
    assert_eq!(answered("/api/payments", "first", "4xx"), Some(1.0));
    assert_eq!(answered("/api/payments", "replay", "2xx"), Some(1.0));
    assert_eq!(answered("/api/test/shoppers", "unkeyed", "2xx"), Some(1.0));
    assert_eq!(
        value(
            &text,
            "checkout_webhook_deliveries_total",
            &[("result", "retry")]
        ),
        None
    );
    assert_eq!(
        value(&text, "checkout_outbox_oldest_age_seconds", &[]),
        Some(0.0)
    );
    // Reported; their values are the instant's: the delivery worker's own short writes (a claim
    // every 50 ms here) may be running or queued at the moment of the scrape.
    assert!(value(&text, "checkout_db_connections_in_use", &[]).is_some());
    assert!(value(&text, "checkout_db_waiting", &[]).is_some_and(|n| n >= 0.0));
    if backend == Backend::Sqlite {
        let commits = value(&text, "checkout_sqlite_group_commit_units_count", &[]);
        assert!(commits.is_some_and(|n| n >= 6.0), "{commits:?}");
    }
    assert!(text.contains("# HELP checkout_keyed_requests_total"));

    // Never on the public address.
    let public = server.api().get("/metrics").await;
    assert_eq!(public.status, StatusCode::NOT_FOUND);
    db.assert_invariants().await;
}
