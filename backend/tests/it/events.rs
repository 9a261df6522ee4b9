//! Events to the shops, against a real server over real SQLite and real PostgreSQL and a real
//! webhook endpoint on loopback: every payment and refund writes its event with the money, and
//! the shop receives it signed (Standard Webhooks), in order, at least once, retried with
//! growing pauses, marked dead after its schedule, redelivered on request.

use std::time::Duration;

use checkout_testkit as support;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use axum::http::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;
use support::receiver::{Answer, Delivery, Receiver};
use support::{Api, Backend, Server, Shop, TestDb, new_key};

checkout_testkit::on_both_databases!(
    payment_and_refund_reach_the_shop_signed_and_in_order,
    a_failing_endpoint_is_retried_with_growing_pauses,
    an_endpoint_that_never_answers_is_dead_then_redelivered_by_hand,
    a_server_killed_mid_delivery_sends_the_event_again_after_restart,
    a_dead_shop_endpoint_delays_only_its_own_events,
    a_hanging_shop_holds_at_most_its_share_of_the_senders,
    a_redelivery_asked_during_an_attempt_waits_for_it_and_is_not_undone,
    a_payment_and_a_refund_wake_the_delivery_at_once,
    a_shop_given_its_webhook_url_later_receives_what_it_missed,
    events_are_listed_newest_first_in_pages,
    a_session_that_lapses_unpaid_is_told_to_its_shop,
    a_rolled_signing_secret_signs_beside_the_old_one_until_the_overlap_ends,
    a_payments_events_carry_its_versions_in_order,
    a_shop_recovers_every_event_it_missed_since_a_time,
    an_endpoint_takes_only_its_types_and_a_test_event_always,
    an_endpoint_failing_too_long_is_disabled_told_and_enabled_again,
    the_signing_secret_is_rolled_through_the_api_with_an_overlap,
    an_attempt_at_an_event_that_is_gone_does_not_stop_the_sender,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_deliver_a_backlog_of_a_thousand_events_once_each() {
    use futures::StreamExt;
    let db = TestDb::new(Backend::Postgres).await;
    // The backlog builds up while the shop has no endpoint (its events are kept).
    let mut builder = Server::start_with(SERVER, &db, &FAST).await;
    let receiver = Receiver::start().await;
    let shop = builder.add_shop("Лавка с очередью").await;
    let shoppers: Vec<Api> =
        futures::future::join_all((0..10).map(|_| async { builder.api().shopper().await })).await;
    let paid = futures::stream::iter(0..1_000)
        .map(|n| {
            let (shop, shopper) = (shop.clone(), shoppers[n % 10].clone());
            async move {
                let body = shop.checkout(&format!("Q-{n}"), 100).await;
                shopper.pay(&new_key(), &body).await.status
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert!(paid.iter().all(|s| *s == StatusCode::CREATED));
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events WHERE status = 'no_endpoint'")
            .await,
        1_000
    );

    // The shop gets its endpoint once that instance is gone; two instances that deliver take
    // over the backlog.
    // One shop's share (8 in flight) is a bound one instance fills alone, its turns settling
    // and leasing at once; with a share larger than both instances' senders, both take part.
    builder.kill();
    let shared = [FAST.as_slice(), &[("CHECKOUT_WEBHOOK_PER_SHOP", "64")]].concat();
    let first = Server::start_with(SERVER, &db, &shared).await;
    let second = Server::start_with(SERVER, &db, &shared).await;
    let (ok, _, err) = set_webhook(&first, &shop, &["--url", &receiver.url]).await;
    assert!(ok, "{err}");
    support::wait_until(
        "the backlog was never delivered",
        Duration::from_secs(120),
        || async {
            db.scalar("SELECT COUNT(*) FROM webhook_events WHERE status = 'delivered'")
                .await
                == 1_000
        },
    )
    .await;
    let got = receiver.deliveries();
    let distinct: std::collections::HashSet<&str> =
        got.iter().map(|d| d.webhook_id.as_str()).collect();
    assert_eq!(distinct.len(), 1_000, "every event reached the shop");
    assert_eq!(got.len(), 1_000, "none was sent twice (no attempt failed)");
    for delivery in got.iter().step_by(97) {
        verify(&shop, delivery);
    }
    let sent_by = |server: &Server| server.log().matches("webhook delivered").count();
    assert_eq!(sent_by(&first) + sent_by(&second), 1_000);
    assert!(
        sent_by(&first) > 0 && sent_by(&second) > 0,
        "both instances took part: {} and {}",
        sent_by(&first),
        sent_by(&second)
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events WHERE attempts <> 1")
            .await,
        0
    );
    db.assert_invariants().await;
}

const WITHIN: Duration = Duration::from_secs(30);

/// Quick schedules, so that a test sees a whole one.
const FAST: [(&str, &str); 4] = [
    ("CHECKOUT_WEBHOOK_POLL_MS", "10"),
    ("CHECKOUT_WEBHOOK_FIRST_RETRY_MS", "40"),
    ("CHECKOUT_WEBHOOK_ATTEMPTS", "6"),
    ("CHECKOUT_WEBHOOK_TIMEOUT_MS", "300"),
];

struct World {
    db: TestDb,
    server: Server,
    shopper: Api,
    shop: Shop,
    receiver: Receiver,
}

async fn world(backend: Backend) -> World {
    world_with(backend, &[]).await
}

/// A world whose server has these settings besides [`FAST`].
async fn world_with(backend: Backend, settings: &[(&str, &str)]) -> World {
    let db = TestDb::new(backend).await;
    let mut env = FAST.to_vec();
    env.retain(|(name, _)| !settings.iter().any(|(n, _)| n == name));
    env.extend_from_slice(settings);
    let server = Server::start_with(SERVER, &db, &env).await;
    let receiver = Receiver::start().await;
    let shopper = server.api().shopper().await;
    let shop = server
        .add_shop_with_webhook("Лавка событий", &receiver.url)
        .await;
    World {
        db,
        server,
        shopper,
        shop,
        receiver,
    }
}

/// `checkout-server shop set-webhook --shop <shop> ARGS…`, as an operator runs it.
async fn set_webhook(server: &Server, shop: &Shop, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["shop", "set-webhook", "--shop", shop.shop_id.as_str()];
    all.extend_from_slice(args);
    server.operator(&all).await
}

/// Pays a new session of `amount` for `order`: the payment's id.
async fn pay(w: &World, order: &str, amount: i64) -> String {
    let body = w.shop.checkout(order, amount).await;
    let paid = w.shopper.pay(&new_key(), &body).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    paid.json()["payment_id"].as_str().unwrap().to_owned()
}

fn verify(shop: &Shop, delivery: &Delivery) {
    let hook = standardwebhooks::Webhook::new(&shop.signing_secret).unwrap();
    hook.verify(delivery.body.as_bytes(), &delivery.headers)
        .unwrap_or_else(|e| panic!("{e}: {delivery:?}"));
    let mut forged = HeaderMap::new();
    for (name, value) in &delivery.headers {
        forged.insert(name, value.clone());
    }
    forged.insert("webhook-id", "evt_someone_else".parse().unwrap());
    assert!(hook.verify(delivery.body.as_bytes(), &forged).is_err());
}

fn body(delivery: &Delivery) -> Value {
    serde_json::from_str(&delivery.body).unwrap()
}

async fn events(shop: &Shop, query: &str) -> Value {
    let answer = shop.api.get(&format!("/api/events{query}")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.json()
}

/// Waits until the event's delivery state is `status`.
async fn wait_for_status(shop: &Shop, event_id: &str, status: &str) -> Value {
    support::wait_until(
        &format!("{event_id} never became {status}"),
        WITHIN,
        || async {
            shop.api
                .get(&format!("/api/events/{event_id}"))
                .await
                .json()["status"]
                == status
        },
    )
    .await;
    shop.api
        .get(&format!("/api/events/{event_id}"))
        .await
        .json()
}

async fn payment_and_refund_reach_the_shop_signed_and_in_order(backend: Backend) {
    let w = world(backend).await;
    let payment = pay(&w, "ORD-1", 30_000).await;
    let refunded = w.shop.refund(&payment, &new_key(), 10_000).await;
    assert_eq!(refunded.status, StatusCode::CREATED);

    let got = w.receiver.wait_for(2, WITHIN).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let (first, second) = (body(&got[0]), body(&got[1]));
    assert_eq!(first["type"], "payment.succeeded");
    assert_eq!(first["data"]["payment_id"], payment.as_str());
    assert_eq!(first["data"]["order_id"], "ORD-1");
    assert_eq!(first["data"]["amount"], 30_000);
    assert!(
        first["data"].get("balance").is_none(),
        "the shopper's balance is not the shop's business"
    );
    assert_eq!(second["type"], "refund.succeeded");
    assert_eq!(second["data"]["payment_id"], payment.as_str());
    assert_eq!(second["data"]["order_id"], "ORD-1");
    assert_eq!(second["data"]["amount"], 10_000);
    for delivery in &got {
        verify(&w.shop, delivery);
        assert!(delivery.webhook_id.starts_with("evt_"));
    }

    // The shop's list says the same: delivered, once each, newest first.
    let listed = events(&w.shop, "").await;
    let listed = listed["events"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["event_id"], got[1].webhook_id.as_str());
    assert_eq!(listed[1]["event_id"], got[0].webhook_id.as_str());
    for event in &listed {
        let event =
            wait_for_status(&w.shop, event["event_id"].as_str().unwrap(), "delivered").await;
        assert_eq!(event["attempts"], 1);
    }
    // Another shop sees none of them; a shopper may not ask.
    let other = w.server.add_shop("Чужая лавка").await;
    assert_eq!(events(&other, "").await["events"], serde_json::json!([]));
    w.shopper
        .get("/api/events")
        .await
        .assert_problem(403, "forbidden");
    w.db.assert_invariants().await;
}

async fn a_failing_endpoint_is_retried_with_growing_pauses(backend: Backend) {
    let w = world(backend).await;
    w.receiver
        .answer(vec![Answer::Status(500); 5], Answer::Status(200));
    pay(&w, "ORD-2", 5_000).await;
    let got = w.receiver.wait_for(6, WITHIN).await;
    assert_eq!(got.len(), 6, "delivered on the sixth attempt");
    assert!(
        got.iter().all(|d| d.webhook_id == got[0].webhook_id),
        "one webhook-id throughout"
    );
    let pauses: Vec<Duration> = got.windows(2).map(|w| w[1].at - w[0].at).collect();
    for pair in pauses.windows(2) {
        assert!(pair[1] > pair[0], "the pauses grow: {pauses:?}");
    }
    let event = wait_for_status(&w.shop, &got[0].webhook_id, "delivered").await;
    assert_eq!(event["attempts"], 6);
    w.db.assert_invariants().await;
}

async fn an_endpoint_that_never_answers_is_dead_then_redelivered_by_hand(backend: Backend) {
    let w = world(backend).await;
    w.receiver.answer(vec![], Answer::Never);
    pay(&w, "ORD-3", 5_000).await;
    let got = w.receiver.wait_for(6, WITHIN).await;
    let event_id = got[0].webhook_id.clone();
    let dead = wait_for_status(&w.shop, &event_id, "dead").await;
    assert_eq!(dead["attempts"], 6);
    assert_eq!(dead["last_error"], "no answer within the timeout");
    assert_eq!(
        w.receiver.deliveries().len(),
        6,
        "nothing after the schedule"
    );

    // The shop fixes its endpoint and asks for the event again.
    w.receiver.answer(vec![], Answer::Status(200));
    let again = w
        .shop
        .api
        .send(w.shop.api.post(
            &format!("/api/events/{event_id}/redelivery"),
            None,
            &serde_json::json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    let delivered = wait_for_status(&w.shop, &event_id, "delivered").await;
    assert_eq!(delivered["attempts"], 1, "a fresh schedule");
    let last = w.receiver.deliveries().last().cloned().unwrap();
    assert_eq!(
        last.webhook_id, event_id,
        "the same event, the same webhook-id"
    );
    verify(&w.shop, &last);
    // Someone else's event, or none: not found.
    let other = w.server.add_shop("Чужая лавка").await;
    let refused = other
        .api
        .send(other.api.post(
            &format!("/api/events/{event_id}/redelivery"),
            None,
            &serde_json::json!({}),
        ))
        .await
        .unwrap();
    refused.assert_problem(404, "not_found");
}

async fn a_server_killed_mid_delivery_sends_the_event_again_after_restart(backend: Backend) {
    let mut w = world(backend).await;
    // The first attempt reaches the shop, which holds it: the server dies before any answer.
    w.receiver.answer(vec![Answer::Never], Answer::Status(200));
    pay(&w, "ORD-4", 5_000).await;
    let first = w.receiver.wait_for(1, WITHIN).await[0].clone();
    w.server.kill();
    w.server = Server::start_with(SERVER, &w.db, &FAST).await;
    let got = w.receiver.wait_for(2, WITHIN).await;
    assert_eq!(
        got[1].webhook_id, first.webhook_id,
        "sent again, same webhook-id"
    );
    let shop = Shop {
        api: w.shop.api.on(&w.server),
        ..w.shop.clone()
    };
    wait_for_status(&shop, &first.webhook_id, "delivered").await;
    w.db.assert_invariants().await;
}

async fn a_dead_shop_endpoint_delays_only_its_own_events(backend: Backend) {
    let w = world(backend).await;
    w.receiver.answer(vec![], Answer::Never);
    let healthy = Receiver::start().await;
    let other = w
        .server
        .add_shop_with_webhook("Быстрая лавка", &healthy.url)
        .await;
    for n in 0..5 {
        pay(&w, &format!("SLOW-{n}"), 1_000).await;
    }
    let body = other.checkout("FAST-1", 2_000).await;
    assert_eq!(
        w.shopper.pay(&new_key(), &body).await.status,
        StatusCode::CREATED
    );
    let got = healthy.wait_for(1, WITHIN).await;
    assert_eq!(body_of(&got[0])["data"]["order_id"], "FAST-1");
    verify(&other, &got[0]);
}

fn body_of(delivery: &Delivery) -> Value {
    body(delivery)
}

async fn events_are_listed_newest_first_in_pages(backend: Backend) {
    let w = world(backend).await;
    for n in 1..=3 {
        pay(&w, &format!("ORD-P{n}"), 1_000 * n).await;
    }
    let first = events(&w.shop, "?limit=2").await;
    assert_eq!(first["has_more"], true);
    let page: Vec<&Value> = first["events"].as_array().unwrap().iter().collect();
    assert_eq!(page.len(), 2);
    assert_eq!(page[0]["body"]["data"]["order_id"], "ORD-P3");
    assert_eq!(page[1]["body"]["data"]["order_id"], "ORD-P2");
    let next = first["next_page"].as_str().unwrap();
    let second = events(&w.shop, &format!("?limit=2&starting_after={next}")).await;
    assert_eq!(second["has_more"], false);
    assert_eq!(second["events"][0]["body"]["data"]["order_id"], "ORD-P1");
    w.shop
        .api
        .get("/api/events?limit=0")
        .await
        .assert_problem(400, "invalid_request");
    w.shop
        .api
        .get("/api/events?starting_after=evt_nope")
        .await
        .assert_problem(400, "invalid_request");
    // A NUL byte (which PostgreSQL refuses outright) is a bad request, not a 500.
    w.shop
        .api
        .get("/api/events?limit=1&starting_after=%C2%B3+%00T%E5%B0%9F")
        .await
        .assert_problem(400, "invalid_request");
}

async fn a_session_that_lapses_unpaid_is_told_to_its_shop(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut env = FAST.to_vec();
    env.extend([
        ("CHECKOUT_SESSION_TTL_SECS", "1"),
        ("CHECKOUT_SWEEP_SECS", "1"),
    ]);
    let server = Server::start_with(SERVER, &db, &env).await;
    let receiver = Receiver::start().await;
    let shop = server
        .add_shop_with_webhook("Лавка ожидания", &receiver.url)
        .await;
    let session = shop.session("ORD-LATE", 7_000).await;
    let got = receiver.wait_for(1, WITHIN).await;
    let event = body(&got[0]);
    assert_eq!(event["type"], "checkout_session.expired");
    assert_eq!(event["data"]["session_id"], session.as_str());
    assert_eq!(event["data"]["order_id"], "ORD-LATE");
    verify(&shop, &got[0]);
    // Paying it now is refused, and nothing more is told.
    let shopper = server.api().shopper().await;
    let late = shopper
        .pay(&new_key(), &support::pay_session(&session))
        .await;
    late.assert_problem(410, "session_expired");
    let view = server
        .api()
        .get(&format!("/api/checkout-sessions/{session}"))
        .await;
    assert_eq!(view.json()["status"], "expired");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events").await,
        1,
        "one event for the session"
    );
    db.assert_invariants().await;
}

/// A shop whose endpoint hangs (each attempt held until the sender's timeout) with a hundred
/// events due holds only its share of an instance's senders: another shop's ten events are all
/// delivered while the first attempts still hang. Before the fix the hanging shop's events
/// filled every slot, and the other shop waited for the timeout.
async fn a_hanging_shop_holds_at_most_its_share_of_the_senders(backend: Backend) {
    let timeout = Duration::from_secs(30);
    let w = world_with(
        backend,
        &[(
            "CHECKOUT_WEBHOOK_TIMEOUT_MS",
            &timeout.as_millis().to_string(),
        )],
    )
    .await;
    w.receiver.answer(vec![], Answer::Never);
    for n in 0..100 {
        pay(&w, &format!("HANG-{n}"), 100).await;
    }
    let healthy = Receiver::start().await;
    let other = w
        .server
        .add_shop_with_webhook("Быстрая лавка", &healthy.url)
        .await;
    let started = std::time::Instant::now();
    for n in 0..10 {
        let body = other.checkout(&format!("FAST-{n}"), 2_000).await;
        assert_eq!(
            w.shopper.pay(&new_key(), &body).await.status,
            StatusCode::CREATED
        );
    }
    let got = healthy.wait_for(10, timeout / 2).await;
    assert!(
        started.elapsed() < timeout / 2,
        "delivered while the hanging attempts were still held"
    );
    assert_eq!(got.len(), 10);
    assert_eq!(
        w.receiver.deliveries().len(),
        8,
        "the hanging shop holds 8 senders (its share), not all 32"
    );
}

/// The shop asks for an event again while an attempt of it is in flight: the attempt keeps its
/// lease (no second copy is sent beside it), and its failure does not undo the request: the
/// event goes again after it, on a fresh schedule. Before the fix the request cleared the
/// lease, so a second sender sent the same event at once.
async fn a_redelivery_asked_during_an_attempt_waits_for_it_and_is_not_undone(backend: Backend) {
    let w = world(backend).await;
    w.receiver.answer(vec![Answer::Never], Answer::Status(200));
    pay(&w, "ORD-LEASE", 5_000).await;
    let first = w.receiver.wait_for(1, WITHIN).await[0].clone();
    let asked = w
        .shop
        .api
        .send(w.shop.api.post(
            &format!("/api/events/{}/redelivery", first.webhook_id),
            None,
            &serde_json::json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
    assert_eq!(asked.json()["status"], "pending");
    assert_eq!(asked.json()["attempts"], 0, "a fresh schedule");
    let delivered = wait_for_status(&w.shop, &first.webhook_id, "delivered").await;
    let got = w.receiver.deliveries();
    assert_eq!(got.len(), 2, "{got:?}");
    let timeout = Duration::from_millis(300);
    assert!(
        got[1].at >= got[0].at + timeout,
        "the second attempt waited for the first to end: {:?} after it",
        got[1].at - got[0].at
    );
    assert_eq!(
        delivered["attempts"], 1,
        "the failed attempt in flight did not count against the redelivery"
    );
    w.db.assert_invariants().await;
}

/// The delivery worker looks for due events rarely here (every ten minutes), yet a payment's
/// and a refund's events reach the shop at once: the change wakes it. Before the fix they
/// waited for the next look.
async fn a_payment_and_a_refund_wake_the_delivery_at_once(backend: Backend) {
    let w = world_with(backend, &[("CHECKOUT_WEBHOOK_POLL_MS", "600000")]).await;
    let payment = pay(&w, "ORD-WAKE", 9_000).await;
    w.receiver.wait_for(1, WITHIN).await;
    let refunded = w.shop.refund(&payment, &new_key(), 1_000).await;
    assert_eq!(refunded.status, StatusCode::CREATED);
    let got = w.receiver.wait_for(2, WITHIN).await;
    assert_eq!(body(&got[1])["type"], "refund.succeeded");
}

/// A shop added without a webhook URL keeps its events (`no_endpoint`); once its operator
/// sets one (`shop set-webhook`), they are all sent there. Cleared, new events wait again.
/// Clear-text http goes only to loopback; a redirect from the endpoint is not followed.
async fn a_shop_given_its_webhook_url_later_receives_what_it_missed(backend: Backend) {
    let w = world(backend).await;
    let late = w.server.add_shop("Лавка без адреса").await;
    let mut payments = Vec::new();
    for n in 0..3 {
        let body = late.checkout(&format!("LATE-{n}"), 1_000).await;
        let paid = w.shopper.pay(&new_key(), &body).await;
        assert_eq!(paid.status, StatusCode::CREATED);
        payments.push(paid.json()["payment_id"].as_str().unwrap().to_owned());
    }
    let kept = events(&late, "").await;
    assert!(
        kept["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["status"] == "no_endpoint"),
        "{kept}"
    );

    let receiver = Receiver::start().await;
    let (ok, out, err) = set_webhook(&w.server, &late, &["--url", &receiver.url]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&receiver.url), "{out}");
    let got = receiver.wait_for(3, WITHIN).await;
    let mut orders: Vec<String> = got
        .iter()
        .map(|d| body(d)["data"]["order_id"].as_str().unwrap().to_owned())
        .collect();
    orders.sort();
    assert_eq!(orders, ["LATE-0", "LATE-1", "LATE-2"]);
    for delivery in &got {
        verify(&late, delivery);
    }

    // Cleared: a new event is kept again.
    let (ok, _, err) = set_webhook(&w.server, &late, &["--clear"]).await;
    assert!(ok, "{err}");
    let body_of_new = late.checkout("LATE-3", 1_000).await;
    assert_eq!(
        w.shopper.pay(&new_key(), &body_of_new).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        events(&late, "?limit=1").await["events"][0]["status"],
        "no_endpoint"
    );

    // Only https, or http to loopback; an unknown shop is named.
    for bad in [
        "http://shop.example/hooks",
        "ftp://127.0.0.1/x",
        "not a url",
    ] {
        let (ok, _, err) = set_webhook(&w.server, &late, &["--url", bad]).await;
        assert!(!ok, "{bad} was accepted");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let (ok, _, err) = w
        .server
        .operator(&[
            "shop",
            "set-webhook",
            "--shop",
            "shop_nope",
            "--url",
            &receiver.url,
        ])
        .await;
    assert!(!ok && err.contains("shop_nope"), "{err}");

    // An endpoint that redirects elsewhere: the redirect is not followed (the event is not
    // delivered there, and the attempt failed).
    let elsewhere = Receiver::start().await;
    receiver.answer(vec![], Answer::Redirect(elsewhere.url.clone()));
    let (ok, _, err) = set_webhook(&w.server, &late, &["--url", &receiver.url]).await;
    assert!(ok, "{err}");
    let event_id = events(&late, "?limit=1").await["events"][0]["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    support::wait_until(
        "the redirected attempt was never recorded",
        WITHIN,
        || async {
            late.api
                .get(&format!("/api/events/{event_id}"))
                .await
                .json()["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("307"))
        },
    )
    .await;
    assert!(
        elsewhere.deliveries().is_empty(),
        "a redirect is never followed"
    );
    w.db.assert_invariants().await;
}

/// `shop roll-webhook-secret --overlap 24h`: until the overlap ends, each event carries two
/// signatures (Standard Webhooks: space-separated `v1,…`), one by each secret, so the shop's
/// endpoint verifies it with the old secret or the new, whichever it holds now. Then only the
/// new one signs. Without `--overlap`, the old secret stops signing at once.
async fn a_rolled_signing_secret_signs_beside_the_old_one_until_the_overlap_ends(backend: Backend) {
    let w = world(backend).await;
    let verifies = |secret: &str, delivery: &Delivery| {
        standardwebhooks::Webhook::new(secret)
            .unwrap()
            .verify(delivery.body.as_bytes(), &delivery.headers)
            .is_ok()
    };
    let roll = |overlap: Option<&'static str>| {
        let mut args = vec![
            "shop",
            "roll-webhook-secret",
            "--shop",
            w.shop.shop_id.as_str(),
            "--mode",
            "test",
        ];
        args.extend(overlap.map(|o| ["--overlap", o]).into_iter().flatten());
        let server = &w.server;
        async move {
            let (ok, out, err) = server.operator(&args).await;
            assert!(ok, "roll-webhook-secret: {out} {err}");
            serde_json::from_str::<Value>(&out).unwrap()
        }
    };
    let first = w.shop.signing_secret.clone();
    pay(&w, "ORD-ROLL-1", 100).await;
    let before = w.receiver.wait_for(1, WITHIN).await;
    assert_eq!(before[0].signature.split(' ').count(), 1, "{:?}", before[0]);
    assert!(verifies(&first, &before[0]));

    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let rolled = roll(Some("24h")).await;
    let second = rolled["signing_secret"].as_str().unwrap().to_owned();
    assert!(second.starts_with("whsec_") && second != first, "{rolled}");
    let until = time::OffsetDateTime::parse(
        rolled["old_signing_secret_expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
    .unix_timestamp();
    assert!(
        (asked_at + 86_400..asked_at + 86_460).contains(&until),
        "{rolled}"
    );
    pay(&w, "ORD-ROLL-2", 100).await;
    let during = w.receiver.wait_for(2, WITHIN).await[1].clone();
    assert_eq!(during.signature.split(' ').count(), 2, "{during:?}");
    assert!(during.signature.split(' ').all(|s| s.starts_with("v1,")));
    assert!(verifies(&first, &during), "the old secret: {during:?}");
    assert!(verifies(&second, &during), "the new secret: {during:?}");

    // The overlap ends (moved to the past behind the server's back): the new secret alone.
    w.db.execute(
        "UPDATE shops SET old_signing_secret_until = 0 WHERE old_signing_secret IS NOT NULL",
    )
    .await;
    pay(&w, "ORD-ROLL-3", 100).await;
    let after = w.receiver.wait_for(3, WITHIN).await[2].clone();
    assert_eq!(after.signature.split(' ').count(), 1, "{after:?}");
    assert!(!verifies(&first, &after));
    assert!(verifies(&second, &after));

    // No overlap asked: the old secret stops at once.
    let rolled = roll(None).await;
    let third = rolled["signing_secret"].as_str().unwrap().to_owned();
    assert!(
        rolled["old_signing_secret_expires_at"].is_null(),
        "{rolled}"
    );
    pay(&w, "ORD-ROLL-4", 100).await;
    let now = w.receiver.wait_for(4, WITHIN).await[3].clone();
    assert_eq!(now.signature.split(' ').count(), 1, "{now:?}");
    assert!(!verifies(&second, &now));
    assert!(verifies(&third, &now));
    // Only its own mode's secret was rolled: the live one is as it was.
    let live = w
        .db
        .scalar(&format!(
            "SELECT COUNT(*) FROM shops WHERE shop_id = '{}' AND livemode = 1 AND signing_secret = '{}'",
            w.shop.shop_id, w.shop.live_signing_secret
        ))
        .await;
    assert_eq!(live, 1);
    w.db.assert_invariants().await;
}

/// Every event carries the version its object is left at (`sequence`): a payment's event 1,
/// each refund's one more, and a refund refused for the shop's balance takes no number. A
/// receiver that applied sequence 3 can tell that a redelivered 2 is older.
async fn a_payments_events_carry_its_versions_in_order(backend: Backend) {
    let w = world(backend).await;
    let payment = pay(&w, "ORD-SEQ", 30_000).await;
    let other = pay(&w, "ORD-SEQ-2", 1_000).await;
    // (The last refund folds the second payment's credit into the shop's balance.)
    for amount in [10_000, 5_000, 100] {
        let refunded = w.shop.refund(&payment, &new_key(), amount).await;
        assert_eq!(refunded.status, StatusCode::CREATED, "{}", refunded.body);
    }
    // A shop that holds nothing (its balance emptied behind the server's back, restored
    // after): the refund is refused, and the payment's version goes back with it.
    let balance =
        w.db.scalar(&format!(
            "SELECT a.balance FROM accounts a JOIN shops s ON s.account_id = a.account_id \
              WHERE s.shop_id = '{}' AND s.livemode = 0",
            w.shop.shop_id
        ))
        .await;
    w.db.execute(&format!(
        "UPDATE accounts SET balance = 0 WHERE account_id = \
           (SELECT account_id FROM shops WHERE shop_id = '{}' AND livemode = 0)",
        w.shop.shop_id
    ))
    .await;
    let refused = w.shop.refund(&other, &new_key(), 500).await;
    assert_eq!(
        refused.status,
        StatusCode::PAYMENT_REQUIRED,
        "{}",
        refused.body
    );
    w.db.execute(&format!(
        "UPDATE accounts SET balance = {balance} WHERE account_id = \
           (SELECT account_id FROM shops WHERE shop_id = '{}' AND livemode = 0)",
        w.shop.shop_id
    ))
    .await;
    let refunded = w.shop.refund(&other, &new_key(), 500).await;
    assert_eq!(refunded.status, StatusCode::CREATED, "{}", refunded.body);

    let got = w.receiver.wait_for(6, WITHIN).await;
    let sequences = |payment: &str| -> Vec<(String, i64)> {
        got.iter()
            .map(body)
            .filter(|b| b["data"]["payment_id"] == payment)
            .map(|b| {
                (
                    b["type"].as_str().unwrap().to_owned(),
                    b["sequence"].as_i64().expect("a sequence"),
                )
            })
            .collect()
    };
    assert_eq!(
        sequences(&payment),
        [
            ("payment.succeeded".to_owned(), 1),
            ("refund.succeeded".to_owned(), 2),
            ("refund.succeeded".to_owned(), 3),
            ("refund.succeeded".to_owned(), 4),
        ]
    );
    assert_eq!(
        sequences(&other),
        [
            ("payment.succeeded".to_owned(), 1),
            ("refund.succeeded".to_owned(), 2),
        ]
    );
    w.db.assert_invariants().await;
}

/// Sends `POST /api/events/recovery` as `api`: the raw answer.
async fn recover(api: &Api, body: Value) -> support::Answer {
    api.send(api.post("/api/events/recovery", None, &body))
        .await
        .unwrap()
}

/// An endpoint that failed long enough for its events to die is mended; the shop asks for
/// everything since a time: the dead events come again (with their ids, a payment's before its
/// refund), nothing else; asked again, nothing; with `include_delivered`, the delivered too.
async fn a_shop_recovers_every_event_it_missed_since_a_time(backend: Backend) {
    let w = world(backend).await;
    let since = checkout_backend::clock::rfc3339(checkout_backend::clock::now_ms() - 1_000);
    w.receiver.answer(vec![], Answer::Status(500));
    let payment = pay(&w, "ORD-REC-1", 8_000).await;
    let refunded = w.shop.refund(&payment, &new_key(), 3_000).await;
    assert_eq!(refunded.status, StatusCode::CREATED, "{}", refunded.body);
    let listed = events(&w.shop, "").await;
    let dead: Vec<String> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(dead.len(), 2);
    for event_id in &dead {
        wait_for_status(&w.shop, event_id, "dead").await;
    }
    w.receiver.answer(vec![], Answer::Status(200));
    pay(&w, "ORD-REC-2", 1_000).await;
    let before = w.receiver.wait_for(13, WITHIN).await.len();
    assert_eq!(before, 13, "6 + 6 failed attempts and the third event");

    // Since a later time: nothing.
    let later = checkout_backend::clock::rfc3339(checkout_backend::clock::now_ms() + 60_000);
    let none = recover(&w.shop.api, serde_json::json!({ "since": later })).await;
    assert_eq!(none.status, StatusCode::ACCEPTED, "{}", none.body);
    assert_eq!(none.json()["recovered"], 0);

    let recovered = recover(&w.shop.api, serde_json::json!({ "since": since })).await;
    assert_eq!(recovered.status, StatusCode::ACCEPTED, "{}", recovered.body);
    assert_eq!(recovered.json()["recovered"], 2, "{}", recovered.body);
    for event_id in &dead {
        let event = wait_for_status(&w.shop, event_id, "delivered").await;
        assert_eq!(event["attempts"], 1, "a fresh schedule");
    }
    let got = w.receiver.wait_for(15, WITHIN).await;
    let again: Vec<&str> = got[13..].iter().map(|d| d.webhook_id.as_str()).collect();
    // Listed newest first: the refund's, then the payment's; sent oldest first.
    assert_eq!(again, [dead[1].as_str(), dead[0].as_str()]);
    for delivery in &got[13..] {
        verify(&w.shop, delivery);
    }

    // Nothing is dead any more: a second recovery finds nothing; the delivered on request.
    let twice = recover(&w.shop.api, serde_json::json!({ "since": since })).await;
    assert_eq!(twice.json()["recovered"], 0, "{}", twice.body);
    let all = recover(
        &w.shop.api,
        serde_json::json!({ "since": since, "include_delivered": true }),
    )
    .await;
    assert_eq!(all.json()["recovered"], 3, "{}", all.body);
    assert_eq!(w.receiver.wait_for(18, WITHIN).await.len(), 18);

    // Bad requests, someone else's events, a shopper.
    for bad in [
        serde_json::json!({ "since": "yesterday" }),
        serde_json::json!({ "since": since, "also": 1 }),
        serde_json::json!({}),
    ] {
        recover(&w.shop.api, bad)
            .await
            .assert_problem(400, "invalid_request");
    }
    let other = w.server.add_shop("Чужая лавка").await;
    let foreign = recover(&other.api, serde_json::json!({ "since": since })).await;
    assert_eq!(foreign.json()["recovered"], 0, "{}", foreign.body);
    recover(&w.shopper, serde_json::json!({ "since": since }))
        .await
        .assert_problem(403, "forbidden");
    w.db.assert_invariants().await;
}

/// `POST /api/webhook-endpoint` with this body, by the shop's key: the answer.
async fn update_endpoint(shop: &Shop, body: Value) -> support::Answer {
    shop.api
        .send(shop.api.post("/api/webhook-endpoint", None, &body))
        .await
        .unwrap()
}

/// The id of the shop's newest event of this type.
async fn newest_of_type(shop: &Shop, event_type: &str) -> Option<Value> {
    events(shop, "?limit=100").await["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == event_type)
        .cloned()
}

async fn an_endpoint_takes_only_its_types_and_a_test_event_always(backend: Backend) {
    let w = world(backend).await;
    let shown = w.shop.api.get("/api/webhook-endpoint").await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
    assert_eq!(shown.json()["enabled"], true);
    assert_eq!(shown.json()["event_types"], serde_json::json!([]));
    assert_eq!(shown.json()["url"], w.receiver.url.as_str());

    for (bad, status) in [
        (serde_json::json!({"event_types": ["payment.failed"]}), 400),
        (serde_json::json!({"colour": "red"}), 400),
        (serde_json::json!({"url": "ftp://example.ru/hook"}), 400),
        // A bad field refuses the whole change: the good ones beside it are not made either.
        (
            serde_json::json!({"event_types": ["refund.succeeded"], "enabled": false,
                               "url": "ftp://example.ru/hook"}),
            400,
        ),
    ] {
        update_endpoint(&w.shop, bad.clone())
            .await
            .assert_problem(status, "invalid_request");
    }
    let unchanged = w.shop.api.get("/api/webhook-endpoint").await.json();
    assert_eq!(
        (&unchanged["event_types"], &unchanged["enabled"]),
        (&serde_json::json!([]), &serde_json::json!(true)),
        "{unchanged}"
    );
    let shopper_asks = w.shopper.get("/api/webhook-endpoint").await;
    shopper_asks.assert_problem(403, "forbidden");

    let set = update_endpoint(
        &w.shop,
        serde_json::json!({"event_types": ["refund.succeeded", "refund.succeeded"]}),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    assert_eq!(
        set.json()["event_types"],
        serde_json::json!(["refund.succeeded"])
    );
    let payment = pay(&w, "TYPES-1", 10_000).await;
    let refunded = w.shop.refund(&payment, &new_key(), 1_000).await;
    assert_eq!(refunded.status, StatusCode::CREATED);
    let got = w.receiver.wait_for(1, WITHIN).await;
    assert_eq!(body(&got[0])["type"], "refund.succeeded");
    let paid_event = newest_of_type(&w.shop, "payment.succeeded").await.unwrap();
    assert_eq!(paid_event["status"], "filtered");

    // A test event reaches it whatever types it takes, signed like any other.
    let sent = w
        .shop
        .api
        .send(
            w.shop
                .api
                .post("/api/webhook-endpoint/test-event", None, &Value::Null),
        )
        .await
        .unwrap();
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{}", sent.body);
    let test_id = sent.json()["event_id"].as_str().unwrap().to_owned();
    let got = w.receiver.wait_for(2, WITHIN).await;
    assert_eq!(got[1].webhook_id, test_id);
    assert_eq!(body(&got[1])["type"], "webhook.test");
    verify(&w.shop, &got[1]);
    wait_for_status(&w.shop, &test_id, "delivered").await;
    let attempts = w
        .shop
        .api
        .get(&format!("/api/events/{test_id}/attempts"))
        .await
        .json();
    let attempts = attempts["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["status"], 200);
    assert_eq!(attempts[0]["url"], w.receiver.url.as_str());
    // The filtered event is sent when asked for by hand.
    let asked = w
        .shop
        .api
        .send(w.shop.api.post(
            &format!(
                "/api/events/{}/redelivery",
                paid_event["event_id"].as_str().unwrap()
            ),
            None,
            &Value::Null,
        ))
        .await
        .unwrap();
    assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
    let got = w.receiver.wait_for(3, WITHIN).await;
    assert_eq!(body(&got[2])["type"], "payment.succeeded");
    // Every type again: a later payment goes out. The broker never hears a test event.
    update_endpoint(&w.shop, serde_json::json!({"event_types": []})).await;
    pay(&w, "TYPES-2", 10_000).await;
    w.receiver.wait_for(4, WITHIN).await;
    assert_eq!(
        w.db.scalar("SELECT COUNT(*) FROM webhook_events WHERE type = 'webhook.test' AND published_at IS NULL")
            .await,
        0
    );
    w.db.assert_invariants().await;
}

async fn an_endpoint_failing_too_long_is_disabled_told_and_enabled_again(backend: Backend) {
    let w = world_with(
        backend,
        &[
            ("CHECKOUT_WEBHOOK_DISABLE_AFTER", "400ms"),
            ("CHECKOUT_WEBHOOK_ATTEMPTS", "100"),
        ],
    )
    .await;
    let owner = format!("owner-{}@shop.example.ru", uuid::Uuid::new_v4().simple());
    let link = w.server.invite(&w.shop.shop_id, &owner, "owner").await;
    let joined = w.server.dashboard().accept(&link, "пароль-владельца").await;
    assert_eq!(joined.status, StatusCode::SEE_OTHER);
    w.receiver.answer(vec![], Answer::Status(503));
    let payment = pay(&w, "DOWN-1", 10_000).await;
    support::wait_until(
        "the endpoint is disabled",
        Duration::from_secs(20),
        || async { w.shop.api.get("/api/webhook-endpoint").await.json()["enabled"] == false },
    )
    .await;
    let endpoint = w.shop.api.get("/api/webhook-endpoint").await.json();
    assert!(
        endpoint["disabled_reason"]
            .as_str()
            .unwrap()
            .starts_with("no 2xx answer for"),
        "{endpoint}"
    );
    assert!(endpoint["failing_since"].is_string(), "{endpoint}");
    // The shop is told: an event in its list (never sent to the endpoint it tells of), a mail.
    let alert = newest_of_type(&w.shop, "webhook_endpoint.disabled")
        .await
        .unwrap();
    assert_eq!(alert["status"], "no_endpoint");
    assert_eq!(alert["body"]["data"]["url"], w.receiver.url.as_str());
    let mail = support::mail::receiver()
        .nth_mail(&owner, Some(&w.server.mail_from), 2)
        .await;
    assert_eq!(mail.subject, "Вебхуки магазина отключены");
    assert!(mail.text.contains(&w.receiver.url), "{}", mail.text);
    let paid_event = newest_of_type(&w.shop, "payment.succeeded").await.unwrap();
    assert_eq!(paid_event["status"], "no_endpoint");
    assert_eq!(
        w.db.scalar(
            "SELECT COUNT(*) FROM audit_log WHERE action = 'endpoint.disabled' AND email = 'касса'"
        )
        .await,
        1
    );

    // Nothing more goes to it while disabled, however it answers now.
    w.receiver.answer(vec![], Answer::Status(200));
    let tried = w.receiver.deliveries().len();
    let second = pay(&w, "DOWN-2", 10_000).await;
    let refund = w.shop.refund(&payment, &new_key(), 500).await;
    assert_eq!(refund.status, StatusCode::CREATED);
    assert_eq!(
        w.receiver.deliveries().len(),
        tried,
        "nothing sent while disabled"
    );

    // Enabled again: what it missed arrives, in each payment's order.
    let enabled = update_endpoint(&w.shop, serde_json::json!({"enabled": true})).await;
    assert_eq!(enabled.json()["enabled"], true, "{}", enabled.body);
    assert!(enabled.json()["failing_since"].is_null());
    let got = w.receiver.wait_for(tried + 3, WITHIN).await;
    let fresh: Vec<(String, String)> = got[tried..]
        .iter()
        .map(|d| {
            let b = body(d);
            (
                b["type"].as_str().unwrap().to_owned(),
                b["data"]["payment_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let of_first: Vec<&str> = fresh
        .iter()
        .filter(|(_, p)| *p == payment)
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(
        of_first,
        ["payment.succeeded", "refund.succeeded"],
        "{fresh:?}"
    );
    assert!(fresh.iter().any(|(_, p)| *p == second), "{fresh:?}");
    assert!(
        !fresh.iter().any(|(t, _)| t == "webhook_endpoint.disabled"),
        "the alert is never sent to the endpoint it tells of"
    );
    // The shop disables it by hand too; a retry of the same change changes nothing.
    for _ in 0..2 {
        let off = update_endpoint(&w.shop, serde_json::json!({"enabled": false})).await;
        assert_eq!(off.json()["enabled"], false);
        assert_eq!(off.json()["disabled_reason"], "disabled by the shop");
    }
    w.db.assert_invariants().await;
}

async fn the_signing_secret_is_rolled_through_the_api_with_an_overlap(backend: Backend) {
    let w = world(backend).await;
    let roll = |body: Value| {
        let api = w.shop.api.clone();
        async move {
            api.send(api.post("/api/webhook-endpoint/signing-secret", None, &body))
                .await
                .unwrap()
        }
    };
    roll(serde_json::json!({"overlap_secs": 700_000}))
        .await
        .assert_problem(400, "invalid_request");
    w.shopper
        .send(w.shopper.post(
            "/api/webhook-endpoint/signing-secret",
            None,
            &serde_json::json!({}),
        ))
        .await
        .unwrap()
        .assert_problem(403, "forbidden");
    let rolled = roll(serde_json::json!({"overlap_secs": 3600})).await;
    assert_eq!(rolled.status, StatusCode::OK, "{}", rolled.body);
    let second = rolled.json()["signing_secret"].as_str().unwrap().to_owned();
    assert!(second.starts_with("whsec_") && second != w.shop.signing_secret);
    assert!(rolled.json()["old_signing_secret_expires_at"].is_string());
    let shown = w.shop.api.get("/api/webhook-endpoint").await.json();
    assert_eq!(
        shown["old_signing_secret_expires_at"],
        rolled.json()["old_signing_secret_expires_at"]
    );
    pay(&w, "ORD-API-ROLL", 100).await;
    let got = w.receiver.wait_for(1, WITHIN).await;
    for secret in [w.shop.signing_secret.as_str(), second.as_str()] {
        standardwebhooks::Webhook::new(secret)
            .unwrap()
            .verify(got[0].body.as_bytes(), &got[0].headers)
            .unwrap_or_else(|e| panic!("{e}: {:?}", got[0]));
    }
    // No overlap: the one before stops at once.
    let third = roll(serde_json::json!({})).await;
    assert!(third.json()["old_signing_secret_expires_at"].is_null());
    pay(&w, "ORD-API-ROLL-2", 100).await;
    let got = w.receiver.wait_for(2, WITHIN).await;
    assert_eq!(got[1].signature.split(' ').count(), 1);
    let third = third.json()["signing_secret"].as_str().unwrap().to_owned();
    standardwebhooks::Webhook::new(&third)
        .unwrap()
        .verify(got[1].body.as_bytes(), &got[1].headers)
        .unwrap();
}

/// An attempt ends for an event whose row is gone meanwhile: what asynchronous replication does
/// to an event written just before the primary was lost (the failover campaign lost half its
/// events so: the attempt's record, refused by the database, failed every later turn of the
/// sender, and nothing more was delivered). The sender records what it can and goes on.
async fn an_attempt_at_an_event_that_is_gone_does_not_stop_the_sender(backend: Backend) {
    let w = world(backend).await;
    // The first attempt is held until the sender gives up (the timeout, 300 ms).
    w.receiver.answer(vec![Answer::Never], Answer::Status(200));
    pay(&w, "ORD-GONE", 5_000).await;
    let held = w.receiver.wait_for(1, WITHIN).await;
    let gone = held[0].webhook_id.clone();
    // While it is held, the event's row vanishes, as a change lost with a primary does.
    w.db.execute(&format!(
        "DELETE FROM webhook_events WHERE event_id = '{gone}'"
    ))
    .await;
    // The attempt ends (no answer within the timeout): from now on every turn of the sender
    // holds its outcome to record.
    support::wait_until("the held attempt never ended", WITHIN, || async {
        w.server
            .log()
            .contains("webhook attempt failed; will retry")
    })
    .await;

    pay(&w, "ORD-AFTER", 6_000).await;
    let got = w.receiver.wait_for(2, WITHIN).await;
    let after = body(&got[1]);
    assert_eq!(after["data"]["order_id"], "ORD-AFTER", "{got:?}");
    assert!(got.iter().skip(1).all(|d| d.webhook_id != gone));
}

/// A backlog grows while the statistics the planner holds still say that almost every event
/// was delivered: after an outage of the shop's endpoint (its events waiting), or on a standby
/// just promoted, whose counters start afresh so that nothing analyzes the table again soon.
/// The failover campaign saw it: each claim walked the whole backlog once per row of it
/// (2.1 s, a million buffers, for 717 pending events), and the outbox did not drain. A claim
/// reads what it leases and the heads of the queue, never the backlog times itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_a_backlog_once_whatever_the_planner_believes() {
    use checkout_backend::store::events::{POSTGRES_CLAIM_DUE_EVENTS, POSTGRES_CLAIM_PLANNER};
    use checkout_backend::store::replace_placeholders;
    let w = world(Backend::Postgres).await;
    // No server claims meanwhile: the test claims by hand.
    drop(w.server);
    let account =
        w.db.scalar_text("SELECT account_id FROM shops WHERE webhook_url IS NOT NULL LIMIT 1")
            .await;
    let insert = |status: &str, from: i64, to: i64| {
        format!(
            "INSERT INTO webhook_events (event_id, shop_account_id, type, subject_id, body, \
                                         created_at, next_attempt_at, status) \
             SELECT 'evt_' || n, '{account}', 'payment.succeeded', 'pay_' || n, '{{}}', n, n, \
                    '{status}' FROM generate_series({from}, {to}) n"
        )
    };
    // What the planner is told: a table of delivered events.
    w.db.execute("ALTER TABLE webhook_events SET (autovacuum_enabled = false)")
        .await;
    w.db.execute(&insert("delivered", 1, 3_000)).await;
    w.db.execute("ANALYZE webhook_events").await;
    // What is there: a thousand events waiting.
    const BACKLOG: i64 = 1_000;
    w.db.execute(&insert("pending", 3_001, 3_000 + BACKLOG))
        .await;

    let claim = replace_placeholders(POSTGRES_CLAIM_DUE_EVENTS.postgres(), |n| {
        ["6000", "'probe'", "8", "32"][n - 1].to_owned()
    });
    // As the delivery worker's turn runs it: the planner's settings, then the claim.
    let mut conn = w.db.connect().await;
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    sqlx::query(POSTGRES_CLAIM_PLANNER)
        .execute(&mut *tx)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS) {claim}"))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let leased =
        w.db.scalar("SELECT COUNT(*) FROM webhook_events WHERE lease_id = 'probe'")
            .await;
    assert_eq!(leased, 8, "one shop's share, the oldest first");
    // The whole statement's buffers: the first `Buffers:` line is the plan's root.
    let root = plan
        .iter()
        .find(|line| line.trim_start().starts_with("Buffers:"))
        .expect("EXPLAIN (BUFFERS) tells the buffers");
    let buffers: i64 = root
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<i64>().ok())
        .sum();
    // Read once: each pending event's index entry and row, and its shop. Walked once per event,
    // it was 30 000 buffers (the CTEs alone) to 2.4 million (nested `IN`s).
    assert!(
        buffers < 4 * BACKLOG,
        "the claim touched {buffers} buffers for a backlog of {BACKLOG}:\n{}",
        plan.join("\n")
    );
}

/// PostgreSQL: an idle sender only reads. Each turn with nothing ended asks whether anything is
/// due, a read outside any transaction, and leases only when something is: no `BEGIN`, no claim,
/// no `COMMIT` while the outbox is empty (a write transaction per poll, per instance, would be
/// three round trips and a lock on the queue's rows, twenty times a second, for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sender_takes_no_write_transaction() {
    let db = TestDb::new(Backend::Postgres).await;
    let logs = [
        FAST.as_slice(),
        &[("RUST_LOG", "info,sqlx=warn,sqlx::query=debug")],
    ]
    .concat();
    let server = Server::start_with(SERVER, &db, &logs).await;
    let receiver = Receiver::start().await;
    server
        .add_shop_with_webhook("Лавка в тишине", &receiver.url)
        .await;
    let looks = |log: &str| log.matches("AS due FROM webhook_events").count();
    let claims = |log: &str| log.matches("summary=\"WITH ranked").count();
    // Each turn either looks (a read) or claims (a write transaction).
    let turns = |log: &str| looks(log) + claims(log);
    let before = server.log();
    // The sender turns every 10 ms: fifty turns, and not one claim among them.
    support::wait_until("the sender took fifty turns", WITHIN, || async {
        turns(&server.log()) >= turns(&before) + 50
    })
    .await;
    let after = server.log();
    assert_eq!(claims(&after), claims(&before), "an idle sender claimed");
    let planner = |log: &str| log.matches("set_config('enable_nestloop'").count();
    assert_eq!(planner(&after), planner(&before));

    // And the first event is leased at once.
    let shopper = server.api().shopper().await;
    let shop = server
        .add_shop_with_webhook("Лавка с событием", &receiver.url)
        .await;
    let body = shop.checkout("ORD-IDLE", 1_000).await;
    assert_eq!(
        shopper.pay(&new_key(), &body).await.status,
        StatusCode::CREATED
    );
    receiver.wait_for(1, WITHIN).await;
    assert!(claims(&server.log()) > claims(&after));
}
