//! The contract, scenario by scenario, against a real server over real SQLite and real
//! PostgreSQL: a shop (added with `checkout-server shop add`) makes checkout sessions, shoppers
//! pay them, the shop refunds. Every scenario runs on both databases and ends by checking the
//! invariants in the database, money conserved among them.

use checkout_testkit as support;

/// The server under test: this package's own binary.
const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Api, Backend, OPENING_BALANCE, Server, Shop, TestDb, new_key, pay_session};

checkout_testkit::on_every_database!(
    a_request_sent_three_times_debits_once,
    sixty_four_concurrent_copies_execute_once,
    distinct_payments_racing_on_one_account_never_overdraw,
    a_decline_is_stored_and_replayed,
    the_same_key_with_another_body_is_refused,
    reordered_fields_are_the_same_request,
    a_missing_or_malformed_key_is_refused,
    a_killed_server_loses_no_acknowledged_payment,
    health_account_demo_mode_and_test_shoppers,
    an_expired_key_is_a_new_key_and_is_swept,
    hostile_paths_headers_and_bodies_never_get_a_5xx,
    bad_inputs_are_refused_and_move_no_money,
    every_answer_about_a_kept_key_says_when_it_expires,
    a_reused_key_names_the_fields_that_differ,
    a_key_status_tells_its_own_principal_only,
    what_means_the_same_is_the_same_request,
);

/// Starts a server over a fresh database; gives one demo shopper and one shop.
pub async fn setup(backend: Backend) -> (TestDb, Server, Api, Shop) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка тестов").await;
    (db, server, shopper, shop)
}

async fn a_request_sent_three_times_debits_once(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let session_id = shop.session("ord-1", 30_000).await;
    let key = new_key();
    let body = pay_session(&session_id);

    let first = shopper.pay(&key, &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert!(!first.replayed());
    let receipt = first.json();
    assert_eq!(receipt["checkout_session_id"], session_id.as_str());
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
    assert_eq!(shop.balance().await, 30_000, "the shop is paid once");
    let payment_id = receipt["payment_id"].as_str().unwrap();
    let details = shopper.get(&format!("/api/payments/{payment_id}")).await;
    assert_eq!(details.status, StatusCode::OK);
    assert_eq!(details.json()["amount"], 30_000);
    assert_eq!(details.json()["refunds"], json!([]));
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'payment'")
            .await,
        2,
        "one transfer: the shopper's debit and the shop's credit"
    );
    db.assert_invariants().await;
}

async fn sixty_four_concurrent_copies_execute_once(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let key = new_key();
    let body = shop.checkout("ord-storm", 12_345).await;

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
    assert_eq!(shop.balance().await, 12_345);
    db.assert_invariants().await;
}

async fn distinct_payments_racing_on_one_account_never_overdraw(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let mut bodies = Vec::new();
    for i in 0..40 {
        bodies.push(shop.checkout(&format!("ord-{i}"), 3_000).await);
    }
    // 100 000 / 3 000: 33 payments fit, 7 must be declined, whatever the interleaving.
    let answers = join_all(bodies.iter().map(|body| {
        let shopper = shopper.clone();
        async move { shopper.pay_until_definite(&new_key(), body).await }
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
    assert_eq!(shop.balance().await, 99_000);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM checkout_sessions WHERE status = 'open'")
            .await,
        7,
        "a declined session stays open, to be paid later"
    );
    db.assert_invariants().await;
}

async fn a_decline_is_stored_and_replayed(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let key = new_key();
    let session_id = shop.session("ord-big", OPENING_BALANCE + 1).await;
    let too_much = pay_session(&session_id);

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
    let view = Api::new(&server.base)
        .get(&format!("/api/checkout-sessions/{session_id}"))
        .await
        .json();
    assert_eq!(view["status"], "open", "a declined session is still open");
    assert_eq!(view["payment_id"], Value::Null);

    // Paying less is another intent: another order, its own session, a new key.
    let smaller = shopper
        .pay(&new_key(), &shop.checkout("ord-small", 50_000).await)
        .await;
    assert_eq!(smaller.status, StatusCode::CREATED, "{}", smaller.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 50_000);
    assert_eq!(shop.balance().await, 50_000);
    db.assert_invariants().await;
}

async fn the_same_key_with_another_body_is_refused(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let key = new_key();
    let body = shop.checkout("ord-1", 300).await;
    let first = shopper.pay(&key, &body).await;
    assert_eq!(first.status, StatusCode::CREATED);

    let other_session = shop.checkout("ord-2", 300).await;
    let other = shopper.pay(&key, &other_session).await;
    other.assert_problem(422, "idempotency_key_reused");
    assert_eq!(other.json()["fields"], json!(["checkout_session_id"]));

    // The same key string from the shop is the shop's own key.
    let payment_id = first.json()["payment_id"].as_str().unwrap().to_owned();
    let shops = shop.refund(&payment_id, &key, 100).await;
    assert_eq!(shops.status, StatusCode::CREATED, "{}", shops.body);

    // The refusal changed nothing: the original still replays.
    let replay = shopper.pay(&key, &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 200);
    assert_eq!(shop.balance().await, 200);
    db.assert_invariants().await;
}

async fn reordered_fields_are_the_same_request(backend: Backend) {
    let (db, _server, _shopper, shop) = setup(backend).await;
    let key = new_key();
    let send_raw = |raw: &'static str| {
        let request = shop
            .api
            .http
            .post(format!("{}/api/checkout-sessions", shop.api.base))
            .header("Idempotency-Key", key.clone())
            .header("Content-Type", "application/json")
            .body(raw);
        shop.api.send(request)
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
    assert_eq!(db.scalar("SELECT COUNT(*) FROM checkout_sessions").await, 1);
    db.assert_invariants().await;
}

async fn a_missing_or_malformed_key_is_refused(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let body = shop.checkout("ord-k", 100).await;
    let keys_before = db.scalar("SELECT COUNT(*) FROM idempotency_keys").await;
    let missing = shopper
        .send(shopper.post("/api/payments", None, &body))
        .await
        .unwrap();
    missing.assert_problem(400, "invalid_request");
    shop.api
        .send(shop.api.post(
            "/api/checkout-sessions",
            None,
            &support::session_request("ord-nokey", 100),
        ))
        .await
        .unwrap()
        .assert_problem(400, "invalid_request");
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
        keys_before,
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

async fn a_killed_server_loses_no_acknowledged_payment(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut server = Server::start(SERVER, &db).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка").await;
    let mut requests: Vec<(String, Value)> = Vec::new();
    for i in 0..300 {
        requests.push((new_key(), shop.checkout(&format!("ord-k{i}"), 100).await));
    }

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
    let shop = Shop {
        api: shop.api.on(&restarted),
        ..shop
    };
    assert_eq!(shop.balance().await, debited);
    db.assert_invariants().await;
}

async fn health_account_demo_mode_and_test_shoppers(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let health = shopper.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    let account = shopper.get("/api/account").await.json();
    assert!(account["account_id"].as_str().unwrap().starts_with("acc_"));
    assert_eq!(account["balance"], OPENING_BALANCE);
    assert_eq!(account["currency"], "RUB");
    let shops = shop.api.get("/api/account").await.json();
    assert_eq!(shops["balance"], 0, "a new shop holds nothing");

    // Demo mode makes the demo shop's carts into sessions on the server: the browser names a
    // cart, never an amount.
    let anonymous = Api::new(&server.base);
    let demo = anonymous
        .send(anonymous.post("/api/demo/checkout-session", None, &json!({ "cart": 1 })))
        .await
        .unwrap();
    assert_eq!(demo.status, StatusCode::CREATED, "{}", demo.body);
    let session = demo.json();
    assert_eq!(session["status"], "open");
    assert_eq!(session["shop"]["name"], "Кофейня «Зерно»");
    let paid = shopper
        .pay(
            &new_key(),
            &pay_session(session["session_id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    assert_eq!(paid.json()["amount"], session["amount"]);
    anonymous
        .send(anonymous.post(
            "/api/demo/checkout-session",
            None,
            &json!({ "cart": 1, "amount": 1 }),
        ))
        .await
        .unwrap()
        .assert_problem(400, "invalid_request");

    drop(server); // one server per SQLite file
    let no_demo = Server::start_with(SERVER, &db, &[("CHECKOUT_DEMO", "0")]).await;
    let anonymous = no_demo.api();
    anonymous
        .send(anonymous.post("/api/demo/checkout-session", None, &json!({ "cart": 0 })))
        .await
        .unwrap()
        .assert_problem(404, "not_found");
    // Test shoppers are always there (test money pays only test sessions), demo or not.
    let tester = anonymous
        .send(anonymous.post("/api/test/shoppers", None, &json!({})))
        .await
        .unwrap();
    assert_eq!(tester.status, StatusCode::CREATED, "{}", tester.body);
    // Tokens and secret keys are stored hashed: neither appears anywhere in the database.
    for secret in [
        shopper.token.clone().unwrap(),
        shop.api.token.clone().unwrap(),
    ] {
        let stored = db
            .scalar(&format!(
                "SELECT COUNT(*) FROM accounts WHERE token_hash = '{secret}'"
            ))
            .await;
        assert_eq!(stored, 0);
    }
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
    let shop = server.add_shop("Лавка").await;
    let (first_order, second_order) = (
        shop.checkout("ord-ttl", 1_000).await,
        shop.checkout("ord-ttl-2", 1_000).await,
    );
    let key = new_key();
    let first = shopper.pay(&key, &first_order).await;
    assert_eq!(first.status, StatusCode::CREATED);

    // Age the keys past the TTL; a sweep may or may not have run yet: either way it is new.
    let two_hours_ago = support_now_ms() - 2 * 3_600_000;
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {two_hours_ago}"
    ))
    .await;
    let again = shopper.pay(&key, &first_order).await;
    assert!(!again.replayed(), "an expired key is not replayed");
    // The session guards the money on its own.
    again.assert_problem(409, "session_already_paid");
    assert_eq!(again.json()["payment_id"], first.json()["payment_id"]);
    let reused = shopper.pay(&key, &second_order).await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the key is live again, for its new request"
    );

    // The sweeper deletes expired keys; ledger, payments and sessions stay.
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {two_hours_ago}"
    ))
    .await;
    support::wait_until(
        "the sweeper did not delete the expired keys",
        std::time::Duration::from_secs(20),
        || async { db.scalar("SELECT COUNT(*) FROM idempotency_keys").await == 0 },
    )
    .await;
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, 1);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM checkout_sessions").await, 2);
    let fresh = shopper.pay(&key, &second_order).await;
    assert_eq!(
        fresh.status,
        StatusCode::CREATED,
        "a swept key is a new key: {}",
        fresh.body
    );
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 2_000);
    assert_eq!(shop.balance().await, 2_000);
    db.assert_invariants_after_key_reuse().await;
}

pub fn support_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn hostile_paths_headers_and_bodies_never_get_a_5xx(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let paid = shopper
        .pay(&new_key(), &shop.checkout("ord-h", 1_000).await)
        .await;
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
        let refund = shop
            .api
            .send(shop.api.post(
                &format!("/api/payments/{id}/refunds"),
                Some(&new_key()),
                &json!({"amount": 1}),
            ))
            .await
            .unwrap();
        refund.assert_problem(404, "not_found");
        let session = Api::new(&server.base)
            .get(&format!(
                "/api/checkout-sessions/{}",
                id.replace("pay_", "cs_")
            ))
            .await;
        session.assert_problem(404, "not_found");
        answers.extend([got, refund, session]);
    }

    // Headers: bytes outside ASCII, a huge token, odd schemes, keys that look like attacks.
    let body = shop.checkout("ord-h2", 100).await;
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
        let order = shop.checkout(&format!("ord-k{}", key.len()), 10).await;
        let first = shopper.pay(key, &order).await;
        assert_eq!(first.status, StatusCode::CREATED, "{key}: {}", first.body);
        let again = shopper.pay(key, &order).await;
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
        br#"{"checkout_session_id":"cs_\u0000"}"#.to_vec(),
        br#"{"checkout_session_id":"\ud800"}"#.to_vec(),
        br#"{"checkout_session_id":"cs_x","\u0000":1}"#.to_vec(),
        deep.into_bytes(),
        b"{\"checkout_session_id\":\"\xff\xfe\"}".to_vec(),
        br#"{"checkout_session_id":1e400}"#.to_vec(),
        b"\xef\xbb\xbf{\"checkout_session_id\":\"cs_x\"}".to_vec(),
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
    db.assert_invariants().await;
}

async fn bad_inputs_are_refused_and_move_no_money(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let session_id = shop.session("ord-b", 1_000).await;
    let keys_before = db.scalar("SELECT COUNT(*) FROM idempotency_keys").await;
    let key = new_key(); // used for every bad request, and afterwards for a good one
    let raw = |api: &Api, path: &str, body: &str, content_type: Option<&str>| {
        let mut request = api
            .http
            .post(format!("{}{path}", api.base))
            .header("Idempotency-Key", key.clone())
            .body(body.to_owned());
        if let Some(content_type) = content_type {
            request = request.header("Content-Type", content_type);
        }
        request
    };
    let json = Some("application/json");
    let good_payment = format!(r#"{{"checkout_session_id":"{session_id}"}}"#);
    let pay = |body: &str, content_type| raw(&shopper, "/api/payments", body, content_type);
    let payment_cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        ("invalid JSON", pay("{\"checkout_session_id\": ", json)),
        ("not an object", pay("[1, 2]", json)),
        ("no content type", pay(&good_payment, None)),
        ("text/plain", pay(&good_payment, Some("text/plain"))),
        (
            "an amount: the shop's to fix",
            pay(
                &format!(r#"{{"checkout_session_id":"{session_id}","amount":1}}"#),
                json,
            ),
        ),
        (
            "the v1 shape",
            pay(r#"{"order_id":"ord-b","amount":1}"#, json),
        ),
        (
            "duplicate field",
            pay(
                &format!(
                    r#"{{"checkout_session_id":"{session_id}","checkout_session_id":"{session_id}"}}"#
                ),
                json,
            ),
        ),
        ("missing session", pay("{}", json)),
        ("null session", pay(r#"{"checkout_session_id":null}"#, json)),
        ("number", pay(r#"{"checkout_session_id":42}"#, json)),
        (
            "not a session id",
            pay(r#"{"checkout_session_id":"pay_x"}"#, json),
        ),
        (
            "too long",
            pay(
                &format!(r#"{{"checkout_session_id":"cs_{}"}}"#, "a".repeat(300)),
                json,
            ),
        ),
    ];
    for (name, request) in payment_cases {
        let answer = shopper.send(request).await.unwrap();
        assert_eq!(answer.status.as_u16(), 400, "{name}: {}", answer.body);
        answer.assert_problem(400, "invalid_request");
    }

    let make = |body: &str| raw(&shop.api, "/api/checkout-sessions", body, json);
    let long_order = format!(r#"{{"order_id":"{}","amount":1}}"#, "x".repeat(65));
    let many_items = format!(
        r#"{{"order_id":"o","amount":101,"items":[{}]}}"#,
        vec![r#"{"name":"n","quantity":1,"unit_price":1}"#; 101].join(",")
    );
    let session_cases: Vec<(&str, String)> = vec![
        ("zero", r#"{"order_id":"o","amount":0}"#.into()),
        ("negative", r#"{"order_id":"o","amount":-100}"#.into()),
        ("fractional", r#"{"order_id":"o","amount":1.5}"#.into()),
        ("float form", r#"{"order_id":"o","amount":100.0}"#.into()),
        ("exponent", r#"{"order_id":"o","amount":1e3}"#.into()),
        ("string", r#"{"order_id":"o","amount":"100"}"#.into()),
        ("past 10^12", r#"{"order_id":"o","amount":1000000000001}"#.into()),
        ("past i64", r#"{"order_id":"o","amount":99999999999999999999}"#.into()),
        ("null amount", r#"{"order_id":"o","amount":null}"#.into()),
        ("missing amount", r#"{"order_id":"o"}"#.into()),
        ("unknown field", r#"{"order_id":"o","amount":1,"tip":5}"#.into()),
        ("empty order", r#"{"order_id":"","amount":1}"#.into()),
        ("order chars", r#"{"order_id":"a/b","amount":1}"#.into()),
        ("order non-ASCII", r#"{"order_id":"заказ","amount":1}"#.into()),
        ("order too long", long_order),
        ("other currency", r#"{"order_id":"o","amount":1,"currency":"USD"}"#.into()),
        ("bad currency", r#"{"order_id":"o","amount":1,"currency":"rubles"}"#.into()),
        (
            "items that do not add up",
            r#"{"order_id":"o","amount":100,"items":[{"name":"n","quantity":2,"unit_price":40}]}"#
                .into(),
        ),
        (
            "no quantity",
            r#"{"order_id":"o","amount":100,"items":[{"name":"n","quantity":0,"unit_price":100}]}"#
                .into(),
        ),
        (
            "an item without a name",
            r#"{"order_id":"o","amount":100,"items":[{"name":"","quantity":1,"unit_price":100}]}"#
                .into(),
        ),
        (
            "items past any amount",
            r#"{"order_id":"o","amount":1,"items":[{"name":"n","quantity":1000000,"unit_price":1000000000000}]}"#
                .into(),
        ),
        ("too many items", many_items),
        (
            "control characters",
            r#"{"order_id":"o","amount":1,"description":"a\u0007b"}"#.into(),
        ),
    ];
    for (name, body) in &session_cases {
        let answer = shop.api.send(make(body)).await.unwrap();
        assert_eq!(answer.status.as_u16(), 400, "{name}: {}", answer.body);
        answer.assert_problem(400, "invalid_request");
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
    let body = pay_session(&session_id);
    anonymous
        .pay(&key, &body)
        .await
        .assert_problem(401, "unauthorized");
    for wrong in ["tok_wrong", "sk_wrong"] {
        let wrong = Api {
            token: Some(wrong.into()),
            ..anonymous.clone()
        };
        wrong
            .pay(&key, &body)
            .await
            .assert_problem(401, "unauthorized");
    }
    anonymous
        .get("/api/account")
        .await
        .assert_problem(401, "unauthorized");
    // An unknown session is the caller's mistake: 404, nothing stored.
    shopper
        .pay(&key, &pay_session(&format!("cs_{}", "0".repeat(32))))
        .await
        .assert_problem(404, "not_found");
    // Refund amounts are checked the same way.
    shop.refund(&format!("pay_{}", "0".repeat(32)), &new_key(), 0)
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
        keys_before,
        "no bad request stored its key"
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM checkout_sessions").await, 1);
    let good = shopper.pay(&key, &body).await;
    assert_eq!(
        good.status,
        StatusCode::CREATED,
        "the key is still fresh: {}",
        good.body
    );
    assert_eq!(good.json()["amount"], 1_000, "the shop's amount");
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
    let (db, _server, shopper, shop) = setup(backend).await;
    let now = (support_now_ms() / 1000) as u64;
    let day = 86_400;
    let key = new_key();
    let body = shop.checkout("ord-e", 1_000).await;
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
    let reused = shopper
        .pay(&key, &shop.checkout("ord-e2", 1_000).await)
        .await;
    assert_eq!(expires_header(&reused), Some(expires), "so does a 422");
    let declined = shopper
        .pay(
            &new_key(),
            &shop.checkout("ord-big", OPENING_BALANCE * 2).await,
        )
        .await;
    declined.assert_problem(402, "insufficient_funds");
    assert!(expires_header(&declined).is_some(), "a stored decline too");
    let paid = shopper.pay(&new_key(), &body).await;
    paid.assert_problem(409, "session_already_paid");
    assert!(expires_header(&paid).is_some());
    let session = shop
        .try_session(&new_key(), &support::session_request("ord-e", 1))
        .await;
    session.assert_problem(409, "order_session_exists");
    assert!(expires_header(&session).is_some(), "and a shop's answers");
    // Nothing is kept for a request refused before the key was claimed.
    let refused = shopper
        .pay(&new_key(), &json!({"checkout_session_id": "nope"}))
        .await;
    refused.assert_problem(400, "invalid_request");
    assert_eq!(expires_header(&refused), None);
    db.assert_invariants().await;
}

async fn a_reused_key_names_the_fields_that_differ(backend: Backend) {
    let (db, _server, _shopper, shop) = setup(backend).await;
    let key = new_key();
    let make = |body: Value| {
        let (shop, key) = (&shop, &key);
        async move { shop.try_session(key, &body).await }
    };
    let first = make(json!({"order_id": "ord-f", "amount": 300})).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let amount = make(json!({"order_id": "ord-f", "amount": 5_000})).await;
    amount.assert_problem(422, "idempotency_key_reused");
    assert_eq!(amount.json()["fields"], json!(["amount"]));
    assert!(
        !amount.body.contains("5000"),
        "values are never echoed: {}",
        amount.body
    );
    // The shop's own currency, spelled out, means what its omission meant: only the order
    // differs.
    let more = make(json!({"order_id": "ord-g", "amount": 300, "currency": "RUB"})).await;
    more.assert_problem(422, "idempotency_key_reused");
    assert_eq!(more.json()["fields"], json!(["order_id"]));
    // The same key on another route of the same principal is another request too; fields of
    // two different requests are not compared.
    let elsewhere = shop
        .refund(&format!("pay_{}", "0".repeat(32)), &key, 300)
        .await;
    elsewhere.assert_problem(422, "idempotency_key_reused");
    assert_eq!(elsewhere.json()["fields"], json!([]));
    assert!(
        elsewhere.json()["detail"]
            .as_str()
            .unwrap()
            .contains("another route"),
        "{}",
        elsewhere.body
    );
    let reordered = make(json!({"amount": 300, "order_id": "ord-f"})).await;
    assert!(
        reordered.replayed(),
        "the same fields in another order are the same request"
    );
    db.assert_invariants().await;
}

async fn a_key_status_tells_its_own_principal_only(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let stranger = server.api().shopper().await;
    let unknown = shopper.get("/api/idempotency-keys/never-sent").await;
    unknown.assert_problem(404, "not_found");

    let key = "key/with?odd#chars%";
    let encoded = "key%2Fwith%3Fodd%23chars%25";
    let paid = shopper.pay(key, &shop.checkout("ord-s", 1_500).await).await;
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
        .pay(
            &declined_key,
            &shop.checkout("ord-d", OPENING_BALANCE * 2).await,
        )
        .await;
    let declined = shopper
        .get(&format!("/api/idempotency-keys/{declined_key}"))
        .await
        .json();
    assert_eq!(declined["response_status"], 402);
    assert_eq!(declined["response"]["code"], "insufficient_funds");

    // Another principal, shopper or shop, never learns anything about it.
    for other in [&stranger, &shop.api] {
        other
            .get(&format!("/api/idempotency-keys/{encoded}"))
            .await
            .assert_problem(404, "not_found");
    }
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

/// A request is fingerprinted as it is understood, defaults applied: the shop's own currency
/// spelled out or left out, no items or `[]`, no description or `null` are one request, and
/// its replay says where the session is (`Location`). Before the fix each spelling was a
/// different request under the key (`422`), and no `Location` was sent.
async fn what_means_the_same_is_the_same_request(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let key = new_key();
    let first = shop
        .try_session(&key, &json!({"order_id": "ord-same", "amount": 2_500}))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let session_id = first.json()["session_id"].as_str().unwrap().to_owned();
    let location = format!("/api/checkout-sessions/{session_id}");
    for spelled in [
        json!({"order_id": "ord-same", "amount": 2_500, "currency": "RUB"}),
        json!({"order_id": "ord-same", "amount": 2_500, "items": []}),
        json!({"order_id": "ord-same", "amount": 2_500, "description": null}),
        json!({"order_id": "ord-same", "amount": 2_500, "currency": "RUB", "items": [], "description": null}),
    ] {
        let again = shop.try_session(&key, &spelled).await;
        assert_eq!(
            again.status,
            StatusCode::CREATED,
            "{spelled}: {}",
            again.body
        );
        assert!(again.replayed(), "{spelled}");
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers.get("location"), Some(&location), "{spelled}");
    }
    assert_eq!(first.headers.get("location"), Some(&location));
    let described = shop
        .try_session(
            &key,
            &json!({"order_id": "ord-same", "amount": 2_500, "description": "Подарок"}),
        )
        .await;
    described.assert_problem(422, "idempotency_key_reused");
    assert_eq!(described.json()["fields"], json!(["description"]));
    // What Location names can be read.
    assert_eq!(shop.api.get(&location).await.status, StatusCode::OK);

    // A payment's 201 names the payment, first time and replayed.
    let pay_key = new_key();
    let paid = shopper.pay(&pay_key, &pay_session(&session_id)).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    let payment_location = format!(
        "/api/payments/{}",
        paid.json()["payment_id"].as_str().unwrap()
    );
    assert_eq!(paid.headers.get("location"), Some(&payment_location));
    let replayed = shopper.pay(&pay_key, &pay_session(&session_id)).await;
    assert_eq!(replayed.headers.get("location"), Some(&payment_location));
    assert_eq!(shopper.get(&payment_location).await.status, StatusCode::OK);
    db.assert_invariants().await;
}
