//! The contract, scenario by scenario, against a real server over real SQLite and real
//! PostgreSQL. Every scenario runs on both and ends by checking the invariants in the database.

use checkout_testkit as support;

/// The server under test: this package's own binary.
const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Api, Backend, OPENING_BALANCE, Server, TestDb, new_key, payment};

checkout_testkit::on_both_databases!(
    a_request_sent_three_times_debits_once,
    sixty_four_concurrent_copies_execute_once,
    distinct_payments_racing_on_one_account_never_overdraw,
    a_decline_is_stored_and_replayed,
    the_same_key_with_another_body_is_refused,
    reordered_fields_are_the_same_request,
    a_missing_or_malformed_key_is_refused,
    an_order_is_paid_at_most_once,
    refunds_are_replayed_and_capped,
    concurrent_refunds_never_over_refund,
    keys_and_payments_belong_to_one_account,
    bad_inputs_are_refused_and_move_no_money,
    an_expired_key_is_a_new_key_and_is_swept,
    a_killed_server_loses_no_acknowledged_payment,
    health_account_and_demo_mode,
    hostile_paths_headers_and_bodies_never_get_a_5xx,
    a_payment_read_is_one_snapshot_during_200_concurrent_refunds,
    every_answer_about_a_kept_key_says_when_it_expires,
    a_reused_key_names_the_fields_that_differ,
    a_key_status_tells_its_own_principal_only,
);

/// Starts a server over a fresh database and gives one demo shopper.
async fn setup(backend: Backend) -> (TestDb, Server, Api) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shopper = server.api().shopper().await;
    (db, server, shopper)
}

async fn a_request_sent_three_times_debits_once(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let key = new_key();
    let body = payment("ord-1", 30_000);

    let first = shopper.pay(&key, &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert!(!first.replayed());
    let receipt = first.json();
    assert_eq!(receipt["order_id"], "ord-1");
    assert_eq!(receipt["amount"], 30_000);
    assert_eq!(receipt["currency"], "RUB");
    assert_eq!(receipt["status"], "succeeded");
    assert_eq!(receipt["balance"], OPENING_BALANCE - 30_000);

    for _ in 0..2 {
        let again = shopper.pay(&key, &body).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(
            again.replayed(),
            "a replay is marked Idempotent-Replayed: true"
        );
        assert_eq!(again.body, first.body, "a replay is byte-identical");
    }
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 30_000);
    let payment_id = receipt["payment_id"].as_str().unwrap();
    let details = shopper.get(&format!("/api/payments/{payment_id}")).await;
    assert_eq!(details.status, StatusCode::OK);
    assert_eq!(details.json()["amount"], 30_000);
    assert_eq!(details.json()["refunds"], json!([]));
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'payment'")
            .await,
        1
    );
    db.assert_invariants().await;
}

async fn sixty_four_concurrent_copies_execute_once(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let key = new_key();
    let body = payment("ord-storm", 12_345);

    let answers = join_all((0..64).map(|_| shopper.pay(&key, &body))).await;
    let firsts: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .collect();
    assert_eq!(firsts.len(), 1, "exactly one copy executes");
    for answer in &answers {
        match answer.status {
            StatusCode::CREATED => assert_eq!(
                answer.body, firsts[0].body,
                "every success is the same receipt"
            ),
            StatusCode::CONFLICT => {
                answer.assert_problem(409, "idempotency_key_in_use");
                assert!(answer.headers.contains_key("retry-after"));
            }
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }
    // Whoever got 409 retries and receives the stored receipt.
    let retried = shopper.pay_until_definite(&key, &body).await;
    assert_eq!(retried.body, firsts[0].body);
    assert!(retried.replayed());
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 12_345);
    db.assert_invariants().await;
}

async fn distinct_payments_racing_on_one_account_never_overdraw(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    // 100 000 / 3 000: 33 payments fit, 7 must be declined, whatever the interleaving.
    let answers = join_all((0..40).map(|i| {
        let shopper = shopper.clone();
        async move {
            shopper
                .pay_until_definite(&new_key(), &payment(&format!("ord-{i}"), 3_000))
                .await
        }
    }))
    .await;
    let paid = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let declined: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::PAYMENT_REQUIRED)
        .collect();
    assert_eq!(paid, 33);
    assert_eq!(declined.len(), 7);
    for decline in declined {
        decline.assert_problem(402, "insufficient_funds");
    }
    assert_eq!(shopper.balance().await, 1_000);
    db.assert_invariants().await;
}

async fn a_decline_is_stored_and_replayed(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let key = new_key();
    let too_much = payment("ord-big", OPENING_BALANCE + 1);

    let decline = shopper.pay(&key, &too_much).await;
    decline.assert_problem(402, "insufficient_funds");
    assert_eq!(decline.json()["balance"], OPENING_BALANCE);
    let again = shopper.pay(&key, &too_much).await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(
        again.replayed(),
        "the decline is the stored outcome of this key"
    );
    assert_eq!(again.body, decline.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE);

    // Paying again is a new intent: a new key, and now an amount that fits.
    let smaller = shopper.pay(&new_key(), &payment("ord-big", 50_000)).await;
    assert_eq!(smaller.status, StatusCode::CREATED, "{}", smaller.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 50_000);
    db.assert_invariants().await;
}

async fn the_same_key_with_another_body_is_refused(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let key = new_key();
    let first = shopper.pay(&key, &payment("ord-1", 300)).await;
    assert_eq!(first.status, StatusCode::CREATED);

    let other_amount = shopper.pay(&key, &payment("ord-1", 5_000)).await;
    other_amount.assert_problem(422, "idempotency_key_reused");
    let other_order = shopper.pay(&key, &payment("ord-2", 300)).await;
    other_order.assert_problem(422, "idempotency_key_reused");
    // The same key on another route is another request too.
    let payment_id = first.json()["payment_id"].as_str().unwrap().to_owned();
    let as_refund = shopper.refund(&payment_id, &key, 300).await;
    as_refund.assert_problem(422, "idempotency_key_reused");

    // The refusal changed nothing: the original still replays.
    let replay = shopper.pay(&key, &payment("ord-1", 300)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 300);
    db.assert_invariants().await;
}

async fn reordered_fields_are_the_same_request(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let key = new_key();
    let send_raw = |raw: &'static str| {
        let request = shopper
            .http
            .post(format!("{}/api/payments", shopper.base))
            .header("Idempotency-Key", key.clone())
            .header("Content-Type", "application/json")
            .body(raw);
        shopper.send(request)
    };
    let first = send_raw(r#"{"order_id":"ord-7","amount":700,"currency":"RUB"}"#)
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let reordered =
        send_raw("{ \"currency\": \"RUB\",\n  \"amount\": 700, \"order_id\": \"ord-7\" }")
            .await
            .unwrap();
    assert!(
        reordered.replayed(),
        "field order and whitespace do not make another request"
    );
    assert_eq!(reordered.body, first.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 700);
    db.assert_invariants().await;
}

async fn a_missing_or_malformed_key_is_refused(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let body = payment("ord-k", 100);
    let missing = shopper
        .send(shopper.post("/api/payments", None, &body))
        .await
        .unwrap();
    missing.assert_problem(400, "invalid_request");
    for bad in ["", "has space", "\"unterminated", &"k".repeat(256)] {
        let answer = shopper.pay(bad, &body).await;
        answer.assert_problem(400, "invalid_request");
    }
    // Non-ASCII bytes in the header value.
    let non_ascii = shopper.post("/api/payments", None, &body).header(
        "Idempotency-Key",
        reqwest::header::HeaderValue::from_bytes("ключ".as_bytes()).unwrap(),
    );
    shopper
        .send(non_ascii)
        .await
        .unwrap()
        .assert_problem(400, "invalid_request");
    let two_keys = shopper
        .post("/api/payments", Some("a"), &body)
        .header("Idempotency-Key", "b");
    shopper
        .send(two_keys)
        .await
        .unwrap()
        .assert_problem(400, "invalid_request");
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys").await,
        0,
        "nothing stored"
    );

    // The longest key works, and its quoted Structured-Field form is the same key.
    let longest = "k".repeat(255);
    let first = shopper.pay(&longest, &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let quoted = shopper.pay(&format!("\"{longest}\""), &body).await;
    assert!(quoted.replayed());
    assert_eq!(quoted.body, first.body);
    db.assert_invariants().await;
}

async fn an_order_is_paid_at_most_once(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let first = shopper.pay(&new_key(), &payment("ord-once", 2_000)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let payment_id = first.json()["payment_id"].clone();

    let key = new_key();
    let twice = shopper.pay(&key, &payment("ord-once", 2_000)).await;
    twice.assert_problem(409, "order_already_paid");
    assert_eq!(twice.json()["payment_id"], payment_id);
    let replay = shopper.pay(&key, &payment("ord-once", 2_000)).await;
    assert!(
        replay.replayed(),
        "order_already_paid is stored under the key"
    );
    assert_eq!(replay.body, twice.body);

    // Many keys racing for one order: one payment.
    let answers = join_all((0..16).map(|_| {
        let shopper = shopper.clone();
        async move {
            shopper
                .pay_until_definite(&new_key(), &payment("ord-race", 1_000))
                .await
        }
    }))
    .await;
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .count(),
        1
    );
    for answer in answers.iter().filter(|a| a.status != StatusCode::CREATED) {
        answer.assert_problem(409, "order_already_paid");
    }
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 3_000);
    db.assert_invariants().await;
}

async fn refunds_are_replayed_and_capped(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let paid = shopper.pay(&new_key(), &payment("ord-r", 30_000)).await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();

    let key = new_key();
    let refund = shopper.refund(&payment_id, &key, 10_000).await;
    assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
    assert_eq!(refund.json()["refunded_total"], 10_000);
    assert_eq!(refund.json()["balance"], OPENING_BALANCE - 20_000);
    let again = shopper.refund(&payment_id, &key, 10_000).await;
    assert!(again.replayed());
    assert_eq!(again.body, refund.body, "a repeated refund credits once");
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 20_000);

    let over_key = new_key();
    let over = shopper.refund(&payment_id, &over_key, 25_000).await;
    over.assert_problem(409, "refund_exceeds_payment");
    assert_eq!(over.json()["refundable"], 20_000);
    let over_again = shopper.refund(&payment_id, &over_key, 25_000).await;
    assert!(over_again.replayed());
    assert_eq!(over_again.body, over.body);

    let rest = shopper.refund(&payment_id, &new_key(), 20_000).await;
    assert_eq!(rest.status, StatusCode::CREATED);
    assert_eq!(rest.json()["refunded_total"], 30_000);
    shopper
        .refund(&payment_id, &new_key(), 1)
        .await
        .assert_problem(409, "refund_exceeds_payment");

    let details = shopper
        .get(&format!("/api/payments/{payment_id}"))
        .await
        .json();
    assert_eq!(details["refunded_total"], 30_000);
    let refunds = details["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 2);
    assert_eq!(refunds[0], refund.json());
    assert_eq!(refunds[1], rest.json());
    assert_eq!(shopper.balance().await, OPENING_BALANCE);

    let unknown = shopper.refund("pay_nope", &new_key(), 1).await;
    unknown.assert_problem(404, "not_found");
    db.assert_invariants().await;
}

async fn concurrent_refunds_never_over_refund(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let paid = shopper.pay(&new_key(), &payment("ord-cr", 30_000)).await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    // 20 refunds of 2 000 against 30 000: exactly 15 fit. Each is also sent twice at once.
    let answers = join_all((0..20).map(|_| {
        let (shopper, payment_id) = (shopper.clone(), payment_id.clone());
        async move {
            let key = new_key();
            let (a, b) = futures::join!(
                refund_until_definite(&shopper, &payment_id, &key),
                refund_until_definite(&shopper, &payment_id, &key)
            );
            assert_eq!(a.body, b.body, "both copies of one refund get one answer");
            a
        }
    }))
    .await;
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .count(),
        15
    );
    for answer in answers.iter().filter(|a| a.status != StatusCode::CREATED) {
        answer.assert_problem(409, "refund_exceeds_payment");
    }
    let details = shopper
        .get(&format!("/api/payments/{payment_id}"))
        .await
        .json();
    assert_eq!(details["refunded_total"], 30_000);
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    db.assert_invariants().await;
}

async fn refund_until_definite(shopper: &Api, payment_id: &str, key: &str) -> support::Answer {
    for _ in 0..200 {
        let answer = shopper.refund(payment_id, key, 2_000).await;
        if answer.status != StatusCode::CONFLICT || answer.code() != "idempotency_key_in_use" {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("refund never got a definite answer")
}

async fn keys_and_payments_belong_to_one_account(backend: Backend) {
    let (db, server, alice) = setup(backend).await;
    let bob = server.api().shopper().await;
    let body = payment("ord-shared", 4_000);

    let alices = alice.pay("shared-key", &body).await;
    let bobs = bob.pay("shared-key", &body).await;
    assert_eq!(alices.status, StatusCode::CREATED);
    assert_eq!(bobs.status, StatusCode::CREATED);
    assert!(
        !bobs.replayed(),
        "the same key string from another account is another key"
    );
    assert_ne!(alices.json()["payment_id"], bobs.json()["payment_id"]);

    let alices_payment = alices.json()["payment_id"].as_str().unwrap().to_owned();
    bob.get(&format!("/api/payments/{alices_payment}"))
        .await
        .assert_problem(404, "not_found");
    bob.refund(&alices_payment, &new_key(), 1_000)
        .await
        .assert_problem(404, "not_found");
    assert_eq!(alice.balance().await, OPENING_BALANCE - 4_000);
    assert_eq!(bob.balance().await, OPENING_BALANCE - 4_000);
    let details = alice
        .get(&format!("/api/payments/{alices_payment}"))
        .await
        .json();
    assert_eq!(details["refunded_total"], 0);
    db.assert_invariants().await;
}

async fn bad_inputs_are_refused_and_move_no_money(backend: Backend) {
    let (db, server, shopper) = setup(backend).await;
    let key = new_key(); // used for every bad request, and afterwards for a good one
    let raw = |body: &str, content_type: Option<&str>| {
        let mut request = shopper
            .http
            .post(format!("{}/api/payments", shopper.base))
            .header("Idempotency-Key", key.clone())
            .body(body.to_owned());
        if let Some(content_type) = content_type {
            request = request.header("Content-Type", content_type);
        }
        request
    };
    let json = Some("application/json");
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        (
            "invalid JSON",
            raw("{\"order_id\": ", json),
            400,
            "invalid_request",
        ),
        ("not an object", raw("[1, 2]", json), 400, "invalid_request"),
        (
            "no content type",
            raw(r#"{"order_id":"o","amount":1}"#, None),
            400,
            "invalid_request",
        ),
        (
            "text/plain",
            raw(r#"{"order_id":"o","amount":1}"#, Some("text/plain")),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            raw(r#"{"order_id":"o","amount":1,"tip":5}"#, json),
            400,
            "invalid_request",
        ),
        (
            "duplicate field",
            raw(r#"{"order_id":"o","amount":1,"amount":2}"#, json),
            400,
            "invalid_request",
        ),
        (
            "missing amount",
            raw(r#"{"order_id":"o"}"#, json),
            400,
            "invalid_request",
        ),
        (
            "zero",
            raw(r#"{"order_id":"o","amount":0}"#, json),
            400,
            "invalid_request",
        ),
        (
            "negative",
            raw(r#"{"order_id":"o","amount":-100}"#, json),
            400,
            "invalid_request",
        ),
        (
            "fractional",
            raw(r#"{"order_id":"o","amount":1.5}"#, json),
            400,
            "invalid_request",
        ),
        (
            "float form",
            raw(r#"{"order_id":"o","amount":100.0}"#, json),
            400,
            "invalid_request",
        ),
        (
            "exponent",
            raw(r#"{"order_id":"o","amount":1e3}"#, json),
            400,
            "invalid_request",
        ),
        (
            "string",
            raw(r#"{"order_id":"o","amount":"100"}"#, json),
            400,
            "invalid_request",
        ),
        (
            "past 10^12",
            raw(r#"{"order_id":"o","amount":1000000000001}"#, json),
            400,
            "invalid_request",
        ),
        (
            "past i64",
            raw(r#"{"order_id":"o","amount":99999999999999999999}"#, json),
            400,
            "invalid_request",
        ),
        (
            "null amount",
            raw(r#"{"order_id":"o","amount":null}"#, json),
            400,
            "invalid_request",
        ),
        (
            "empty order",
            raw(r#"{"order_id":"","amount":1}"#, json),
            400,
            "invalid_request",
        ),
        (
            "order chars",
            raw(r#"{"order_id":"a/b","amount":1}"#, json),
            400,
            "invalid_request",
        ),
        (
            "order non-ASCII",
            raw(r#"{"order_id":"заказ","amount":1}"#, json),
            400,
            "invalid_request",
        ),
        (
            "order too long",
            raw(
                &format!(r#"{{"order_id":"{}","amount":1}}"#, "x".repeat(65)),
                json,
            ),
            400,
            "invalid_request",
        ),
        (
            "other currency",
            raw(r#"{"order_id":"o","amount":1,"currency":"USD"}"#, json),
            400,
            "invalid_request",
        ),
        (
            "bad currency",
            raw(r#"{"order_id":"o","amount":1,"currency":"rubles"}"#, json),
            400,
            "invalid_request",
        ),
    ];
    for (name, request, status, code) in cases {
        let answer = shopper.send(request).await.unwrap();
        assert_eq!(answer.status.as_u16(), status, "{name}: {}", answer.body);
        answer.assert_problem(status, code);
    }

    // Over 1 MiB: refused from the Content-Length alone, before any of the body is read.
    let too_large = support::raw_request(
        &server.base,
        &format!(
            "POST /api/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            shopper.token.as_deref().unwrap(),
            2 << 20
        ),
    )
    .await;
    too_large.assert_problem(413, "payload_too_large");

    // Without a token or with a wrong one: 401, whatever the body.
    let anonymous = Api::new(&server.base);
    let no_token = anonymous.pay(&key, &payment("o", 1)).await;
    no_token.assert_problem(401, "unauthorized");
    let wrong = Api {
        token: Some("tok_wrong".into()),
        ..anonymous.clone()
    };
    wrong
        .pay(&key, &payment("o", 1))
        .await
        .assert_problem(401, "unauthorized");
    anonymous
        .get("/api/account")
        .await
        .assert_problem(401, "unauthorized");
    // Refund amounts are checked the same way.
    shopper
        .refund(&format!("pay_{}", "0".repeat(32)), &new_key(), 0)
        .await
        .assert_problem(400, "invalid_request");
    // Wrong method and unknown route are problems too.
    shopper
        .get("/api/payments")
        .await
        .assert_problem(405, "method_not_allowed");
    shopper
        .get("/api/nothing-here")
        .await
        .assert_problem(404, "not_found");

    assert_eq!(
        shopper.balance().await,
        OPENING_BALANCE,
        "no bad request moved money"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys").await,
        0,
        "no bad request stored its key"
    );
    let good = shopper.pay(&key, &payment("o", 1)).await;
    assert_eq!(
        good.status,
        StatusCode::CREATED,
        "the key is still fresh: {}",
        good.body
    );
    db.assert_invariants().await;
}

async fn an_expired_key_is_a_new_key_and_is_swept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_KEY_TTL_SECS", "3600"),
            ("CHECKOUT_SWEEP_SECS", "1"),
        ],
    )
    .await;
    let shopper = server.api().shopper().await;
    let key = new_key();
    let first = shopper.pay(&key, &payment("ord-ttl", 1_000)).await;
    assert_eq!(first.status, StatusCode::CREATED);

    // Age the key past the TTL; a sweep may or may not have run yet: either way it is new.
    let two_hours_ago = support_now_ms() - 2 * 3_600_000;
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {two_hours_ago}"
    ))
    .await;
    let again = shopper.pay(&key, &payment("ord-ttl", 1_000)).await;
    assert!(!again.replayed(), "an expired key is not replayed");
    again.assert_problem(409, "order_already_paid"); // the order guards the money on its own
    let reused = shopper.pay(&key, &payment("ord-ttl-2", 1_000)).await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the key is live again, for its new request"
    );

    // The sweeper deletes expired keys; ledger and payments stay.
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {two_hours_ago}"
    ))
    .await;
    support::wait_until(
        "the sweeper did not delete the expired key",
        std::time::Duration::from_secs(20),
        || async { db.scalar("SELECT COUNT(*) FROM idempotency_keys").await == 0 },
    )
    .await;
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, 1);
    let fresh = shopper.pay(&key, &payment("ord-ttl-2", 1_000)).await;
    assert_eq!(
        fresh.status,
        StatusCode::CREATED,
        "a swept key is a new key: {}",
        fresh.body
    );
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 2_000);
    db.assert_invariants_after_key_reuse().await;
}

fn support_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn a_killed_server_loses_no_acknowledged_payment(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut server = Server::start(SERVER, &db).await;
    let shopper = server.api().shopper().await;
    let requests: Vec<(String, Value)> = (0..300)
        .map(|i| (new_key(), payment(&format!("ord-k{i}"), 100)))
        .collect();

    // Fire all at once; SIGKILL the server as soon as 15 have been acknowledged.
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let enough = Arc::new(tokio::sync::Notify::new());
    let in_flight = join_all(requests.iter().map(|(key, body)| {
        let (shopper, acknowledged, enough) =
            (shopper.clone(), acknowledged.clone(), enough.clone());
        async move {
            let answer = shopper.try_pay(key, body).await.ok();
            if answer
                .as_ref()
                .is_some_and(|a| a.status == StatusCode::CREATED)
                && acknowledged.fetch_add(1, Ordering::SeqCst) + 1 == 15
            {
                enough.notify_one();
            }
            answer
        }
    }));
    let killer = async {
        enough.notified().await;
        server.kill();
    };
    let (answers, ()) = futures::join!(in_flight, killer);
    let seen: Vec<_> = answers.into_iter().collect();
    let acked = seen
        .iter()
        .filter(|a| a.as_ref().is_some_and(|a| a.status == StatusCode::CREATED))
        .count();
    let cut = seen.iter().filter(|a| a.is_none()).count();
    eprintln!("{backend:?}: {acked} acknowledged before SIGKILL, {cut} cut off in flight");
    assert!(acked >= 15);
    assert!(cut > 0, "the kill must land while requests are in flight");

    // Restart on the same database and retry every key until it has an answer.
    let restarted = Server::start(SERVER, &db).await;
    let shopper = shopper.on(&restarted);
    let mut debited = 0;
    for ((key, body), before) in requests.iter().zip(&seen) {
        let after = shopper.pay_until_definite(key, body).await;
        assert_eq!(after.status, StatusCode::CREATED, "{}", after.body);
        if let Some(before) = before.as_ref().filter(|a| a.status == StatusCode::CREATED) {
            assert_eq!(
                after.body, before.body,
                "an acknowledged payment replays exactly"
            );
            assert!(after.replayed());
        }
        debited += 100;
    }
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM payments").await,
        300,
        "every key charged exactly once"
    );
    assert_eq!(shopper.balance().await, OPENING_BALANCE - debited);
    db.assert_invariants().await;
}

async fn health_account_and_demo_mode(backend: Backend) {
    let (db, server, shopper) = setup(backend).await;
    let health = shopper.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    let account = shopper.get("/api/account").await.json();
    assert!(account["account_id"].as_str().unwrap().starts_with("acc_"));
    assert_eq!(account["balance"], OPENING_BALANCE);
    assert_eq!(account["currency"], "RUB");

    drop(server); // one server per SQLite file
    let no_demo = Server::start_with(SERVER, &db, &[("CHECKOUT_DEMO", "0")]).await;
    let answer = no_demo
        .api()
        .send(
            no_demo
                .api()
                .http
                .post(format!("{}/api/demo/session", no_demo.base)),
        )
        .await
        .unwrap();
    answer.assert_problem(404, "not_found");
    // Tokens are stored hashed: the token itself appears nowhere in the database.
    let token = shopper.token.clone().unwrap();
    let stored = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM accounts WHERE token_hash = '{token}'"
        ))
        .await;
    assert_eq!(stored, 0);
    db.assert_invariants().await;
}

async fn hostile_paths_headers_and_bodies_never_get_a_5xx(backend: Backend) {
    let (db, server, shopper) = setup(backend).await;
    let paid = shopper.pay(&new_key(), &payment("ord-h", 1_000)).await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    let mut answers = Vec::new();

    // Path parameters that are not ids: NUL bytes, bad UTF-8, long, traversal, SQL.
    let long = "9".repeat(10_000);
    let hostile_ids = [
        "%00",
        "pay_%00x",
        &format!("{}%00", &payment_id[..payment_id.len() - 1]),
        "%FF%FE",
        &long,
        "..%2F..%2Fetc%2Fpasswd",
        "pay_'%20OR%20'1'%3D'1",
        &payment_id.to_uppercase(),
    ];
    for id in hostile_ids {
        let got = shopper.get(&format!("/api/payments/{id}")).await;
        got.assert_problem(404, "not_found");
        let refund = shopper
            .send(shopper.post(
                &format!("/api/payments/{id}/refunds"),
                Some(&new_key()),
                &json!({"amount": 1}),
            ))
            .await
            .unwrap();
        refund.assert_problem(404, "not_found");
        answers.extend([got, refund]);
    }

    // Headers: bytes outside ASCII, a huge token, odd schemes, keys that look like attacks.
    let body = payment("ord-h2", 100);
    let raw_header = |name: &'static str, value: &[u8]| {
        shopper
            .http
            .post(format!("{}/api/payments", shopper.base))
            .header(
                name,
                reqwest::header::HeaderValue::from_bytes(value).unwrap(),
            )
            .json(&body)
    };
    let token = shopper.token.clone().unwrap();
    let header_cases = [
        raw_header("Authorization", b"Bearer \xff\xfe"),
        raw_header(
            "Authorization",
            format!("Bearer {}", "t".repeat(20_000)).as_bytes(),
        ),
        raw_header("Authorization", format!("Basic {token}").as_bytes()),
        raw_header("Authorization", b"Bearer"),
        raw_header("Idempotency-Key", b"\xffkey"),
        raw_header("Idempotency-Key", b"\"\\x\""),
    ];
    for request in header_cases {
        let answer = shopper.send(request).await.unwrap();
        assert!(
            answer.status.is_client_error(),
            "{}: {}",
            answer.status,
            answer.body
        );
        answers.push(answer);
    }
    // Keys that look like SQL or markup are just keys.
    for key in ["';DROP_TABLE_accounts;--", "<script>", "%00", "\\u0000"] {
        let first = shopper
            .pay(key, &payment(&format!("ord-k{}", key.len()), 10))
            .await;
        assert_eq!(first.status, StatusCode::CREATED, "{key}: {}", first.body);
        let again = shopper
            .pay(key, &payment(&format!("ord-k{}", key.len()), 10))
            .await;
        assert!(again.replayed(), "{key}");
    }

    // Bodies: NUL and lone surrogates in strings, deep nesting, bad UTF-8, huge numbers.
    let raw_body = |bytes: Vec<u8>| {
        shopper
            .http
            .post(format!("{}/api/payments", shopper.base))
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(bytes)
    };
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body_cases = [
        br#"{"order_id":"o\u0000","amount":1}"#.to_vec(),
        br#"{"order_id":"\ud800","amount":1}"#.to_vec(),
        br#"{"order_id":"o","amount":1,"\u0000":1}"#.to_vec(),
        deep.into_bytes(),
        b"{\"order_id\":\"\xff\xfe\",\"amount\":1}".to_vec(),
        br#"{"order_id":"o","amount":1e400}"#.to_vec(),
        br#"{"order_id":"o","amount":-9223372036854775809}"#.to_vec(),
        b"\xef\xbb\xbf{\"order_id\":\"o\",\"amount\":1}".to_vec(),
    ];
    for bytes in body_cases {
        let answer = shopper.send(raw_body(bytes)).await.unwrap();
        answer.assert_problem(400, "invalid_request");
        answers.push(answer);
    }

    for answer in &answers {
        assert!(
            !answer.status.is_server_error(),
            "{}: {}",
            answer.status,
            answer.body
        );
    }
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 1_000 - 4 * 10);
    let _ = server;
    db.assert_invariants().await;
}

async fn a_payment_read_is_one_snapshot_during_200_concurrent_refunds(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let paid = shopper.pay(&new_key(), &payment("ord-snap", 20_000)).await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    let path = format!("/api/payments/{payment_id}");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let refunds = join_all((0..200).map(|_| {
        let (shopper, payment_id) = (shopper.clone(), payment_id.clone());
        async move {
            let key = new_key();
            loop {
                let answer = shopper.refund(&payment_id, &key, 100).await;
                if answer.code() != "idempotency_key_in_use" && !answer.status.is_server_error() {
                    return answer;
                }
            }
        }
    }));
    let refunds = {
        let done = done.clone();
        async move {
            let answers = refunds.await;
            done.store(true, Ordering::SeqCst);
            answers
        }
    };
    // Reads the payment over and over while the refunds land; every read must agree with itself.
    let poller = async {
        let (mut reads, mut partial) = (0, 0);
        while !done.load(Ordering::SeqCst) {
            let details = shopper.get(&path).await.json();
            let listed = details["refunds"].as_array().unwrap();
            let sum: i64 = listed.iter().map(|r| r["amount"].as_i64().unwrap()).sum();
            let total = details["refunded_total"].as_i64().unwrap();
            assert_eq!(
                total,
                sum,
                "refunded_total disagrees with the {} refunds listed",
                listed.len()
            );
            let running: Vec<i64> = listed
                .iter()
                .map(|r| r["refunded_total"].as_i64().unwrap())
                .collect();
            assert!(
                running.windows(2).all(|w| w[0] < w[1]),
                "refunds in order: {running:?}"
            );
            reads += 1;
            if 0 < total && total < 20_000 {
                partial += 1;
            }
        }
        (reads, partial)
    };
    let (answers, (reads, partial)) = futures::join!(refunds, poller);
    assert!(answers.iter().all(|a| a.status == StatusCode::CREATED));
    assert!(
        partial > 0,
        "no read landed while refunds were being made ({reads} reads)"
    );
    let details = shopper.get(&path).await.json();
    assert_eq!(details["refunded_total"], 20_000);
    assert_eq!(details["refunds"].as_array().unwrap().len(), 200);
    db.assert_invariants().await;
}

/// `Idempotency-Key-Expires` (an IMF-fixdate) is when the key's creation plus the retention
/// period comes round; its value as parsed, in Unix seconds.
fn expires_header(answer: &support::Answer) -> Option<u64> {
    let text = answer.headers.get("idempotency-key-expires")?;
    let at = httpdate::parse_http_date(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    Some(at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs())
}

async fn every_answer_about_a_kept_key_says_when_it_expires(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let now = (support_now_ms() / 1000) as u64;
    let day = 86_400;
    let key = new_key();
    let body = payment("ord-e", 1_000);
    let first = shopper.pay(&key, &body).await;
    let expires = expires_header(&first).expect("on a first execution");
    assert!(
        (now + day..=now + day + 5).contains(&expires),
        "{expires} vs now {now}"
    );
    let replay = shopper.pay(&key, &body).await;
    assert_eq!(
        expires_header(&replay),
        Some(expires),
        "a replay keeps the key's expiry"
    );
    let reused = shopper.pay(&key, &payment("ord-e", 2_000)).await;
    assert_eq!(expires_header(&reused), Some(expires), "so does a 422");
    let declined = shopper
        .pay(&new_key(), &payment("ord-big", OPENING_BALANCE * 2))
        .await;
    declined.assert_problem(402, "insufficient_funds");
    assert!(expires_header(&declined).is_some(), "a stored decline too");
    let paid = shopper.pay(&new_key(), &payment("ord-e", 1_000)).await;
    paid.assert_problem(409, "order_already_paid");
    assert!(expires_header(&paid).is_some());
    // Nothing is kept for a request refused before the key was claimed.
    let refused = shopper.pay(&new_key(), &payment("ord-e", 0)).await;
    refused.assert_problem(400, "invalid_request");
    assert_eq!(expires_header(&refused), None);
    db.assert_invariants().await;
}

async fn a_reused_key_names_the_fields_that_differ(backend: Backend) {
    let (db, _server, shopper) = setup(backend).await;
    let key = new_key();
    let first = shopper
        .pay(&key, &json!({"order_id": "ord-f", "amount": 300}))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let amount = shopper
        .pay(&key, &json!({"order_id": "ord-f", "amount": 5_000}))
        .await;
    amount.assert_problem(422, "idempotency_key_reused");
    assert_eq!(amount.json()["fields"], json!(["amount"]));
    assert!(
        !amount.body.contains("5000"),
        "values are never echoed: {}",
        amount.body
    );
    let more = shopper
        .pay(
            &key,
            &json!({"order_id": "ord-g", "amount": 300, "currency": "RUB"}),
        )
        .await;
    more.assert_problem(422, "idempotency_key_reused");
    assert_eq!(more.json()["fields"], json!(["currency", "order_id"]));
    let payment_id = first.json()["payment_id"].as_str().unwrap().to_owned();
    let elsewhere = shopper.refund(&payment_id, &key, 300).await;
    elsewhere.assert_problem(422, "idempotency_key_reused");
    assert_eq!(
        elsewhere.json()["fields"],
        json!(["order_id"]),
        "the amount is the same"
    );
    let reordered = shopper
        .pay(&key, &json!({"amount": 300, "order_id": "ord-f"}))
        .await;
    assert!(
        reordered.replayed(),
        "the same fields in another order are the same request"
    );
    db.assert_invariants().await;
}

async fn a_key_status_tells_its_own_principal_only(backend: Backend) {
    let (db, server, shopper) = setup(backend).await;
    let stranger = server.api().shopper().await;
    let unknown = shopper.get("/api/idempotency-keys/never-sent").await;
    unknown.assert_problem(404, "not_found");

    let key = "key/with?odd#chars%";
    let encoded = "key%2Fwith%3Fodd%23chars%25";
    let paid = shopper.pay(key, &payment("ord-s", 1_500)).await;
    assert_eq!(paid.status, StatusCode::CREATED);
    let status = shopper
        .get(&format!("/api/idempotency-keys/{encoded}"))
        .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    let status = status.json();
    assert_eq!(status["status"], "done");
    assert_eq!(status["response_status"], 201);
    assert_eq!(status["response"], paid.json(), "its stored answer");
    let expires = expires_header(&paid).unwrap();
    let reported = time::OffsetDateTime::parse(
        status["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
    .unix_timestamp() as u64;
    assert!(reported.abs_diff(expires) <= 1, "{reported} vs {expires}");

    let declined_key = new_key();
    shopper
        .pay(&declined_key, &payment("ord-d", OPENING_BALANCE * 2))
        .await;
    let declined = shopper
        .get(&format!("/api/idempotency-keys/{declined_key}"))
        .await
        .json();
    assert_eq!(declined["response_status"], 402);
    assert_eq!(declined["response"]["code"], "insufficient_funds");

    // Another principal never learns anything about it.
    stranger
        .get(&format!("/api/idempotency-keys/{encoded}"))
        .await
        .assert_problem(404, "not_found");
    shopper
        .get("/api/idempotency-keys/%00")
        .await
        .assert_problem(404, "not_found");
    // An expired key is forgotten, even before it is swept.
    let two_days_ago = support_now_ms() - 2 * 86_400_000;
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {two_days_ago}"
    ))
    .await;
    shopper
        .get(&format!("/api/idempotency-keys/{encoded}"))
        .await
        .assert_problem(404, "not_found");
    db.assert_invariants().await;
}
