//! Shops, checkout sessions and refunds, against a real server over real SQLite and real
//! PostgreSQL: the shop fixes the amount, a session is paid at most once, the money moves from
//! shopper to shop in double entry, only the paid shop refunds, and nobody else sees a thing.

use checkout_testkit as support;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use futures::StreamExt;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Api, Backend, OPENING_BALANCE, Server, Shop, TestDb, new_key, pay_session};

checkout_testkit::on_both_databases!(
    sessions_are_keyed_and_one_per_order,
    shoppers_racing_for_one_session_pay_it_once,
    an_expired_session_is_refused_and_the_refusal_replayed,
    refunds_by_the_shop_are_replayed_and_capped,
    fifty_concurrent_refunds_while_payments_keep_arriving,
    a_shop_short_of_money_cannot_refund,
    only_the_shopper_and_the_paid_shop_see_a_payment,
    five_hundred_shoppers_pay_one_shop_at_once,
    an_operator_adds_shops_beside_the_running_server,
);

async fn setup(backend: Backend) -> (TestDb, Server, Api, Shop) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка тестов").await;
    (db, server, shopper, shop)
}

fn now_s() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn rfc3339_s(value: &Value) -> i64 {
    time::OffsetDateTime::parse(
        value.as_str().expect("a timestamp"),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
    .unix_timestamp()
}

async fn sessions_are_keyed_and_one_per_order(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let key = new_key();
    let request = json!({
        "order_id": "ord-1",
        "amount": 35_000,
        "description": "Заказ №1",
        "items": [
            { "name": "Кофе «Эфиопия», 250 г", "quantity": 2, "unit_price": 10_000 },
            { "name": "Фильтры", "quantity": 1, "unit_price": 15_000 },
        ],
    });
    let made = shop.try_session(&key, &request).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let session = made.json();
    let session_id = session["session_id"].as_str().unwrap().to_owned();
    assert!(session_id.starts_with("cs_"));
    assert_eq!(session["status"], "open");
    assert_eq!(session["amount"], 35_000);
    assert_eq!(session["currency"], "RUB");
    assert_eq!(session["payment_id"], Value::Null);
    assert_eq!(session["items"], request["items"]);
    let ttl = rfc3339_s(&session["expires_at"]) - now_s();
    assert!(
        (1_795..=1_800).contains(&ttl),
        "30 minutes by default: {ttl}"
    );

    let replay = shop.try_session(&key, &request).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, made.body);

    // Another key for the same order: the order's session, as this key's stored outcome.
    let other_key = new_key();
    let twice = shop.try_session(&other_key, &request).await;
    twice.assert_problem(409, "order_session_exists");
    assert_eq!(twice.json()["checkout_session_id"], session_id.as_str());
    let twice_again = shop.try_session(&other_key, &request).await;
    assert!(twice_again.replayed());
    assert_eq!(twice_again.body, twice.body);

    // Many keys racing for one new order: one session.
    let answers = join_all((0..16).map(|_| async {
        shop.try_session(&new_key(), &support::session_request("ord-race", 500))
            .await
    }))
    .await;
    let made: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    assert_eq!(made.len(), 1, "one session per order");
    for answer in answers.iter().filter(|a| a.status != StatusCode::CREATED) {
        answer.assert_problem(409, "order_session_exists");
        assert_eq!(
            answer.json()["checkout_session_id"],
            made[0].json()["session_id"]
        );
    }

    // Order ids are each shop's own: another shop may have an "ord-1" too.
    let other_shop = server.add_shop("Другая лавка").await;
    let theirs = other_shop.try_session(&key, &request).await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{}", theirs.body);
    assert_ne!(theirs.json()["session_id"], session_id.as_str());

    // What the widget renders: public, without a token, and without a secret in it.
    let anonymous = Api::new(&server.base);
    let view = anonymous
        .get(&format!("/api/checkout-sessions/{session_id}"))
        .await;
    assert_eq!(view.status, StatusCode::OK, "{}", view.body);
    let public = view.json();
    assert_eq!(public["shop"]["name"], "Лавка тестов");
    assert_eq!(public["amount"], 35_000);
    assert_eq!(public["items"], request["items"]);
    assert_eq!(public["status"], "open");
    for secret in ["sk_", "whsec_", "acc_", "tok_", "shop_"] {
        assert!(!view.body.contains(secret), "{secret} in {}", view.body);
    }

    // Only a shop makes sessions; the shopper pays them.
    shopper
        .send(shopper.post("/api/checkout-sessions", Some(&new_key()), &request))
        .await
        .unwrap()
        .assert_problem(403, "forbidden");
    shop.api
        .pay(&new_key(), &pay_session(&session_id))
        .await
        .assert_problem(403, "forbidden");
    let paid = shopper.pay(&new_key(), &pay_session(&session_id)).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    assert_eq!(paid.json()["amount"], 35_000, "the shop's amount");
    let public = anonymous
        .get(&format!("/api/checkout-sessions/{session_id}"))
        .await
        .json();
    assert_eq!(public["status"], "paid");
    assert_eq!(public["payment_id"], paid.json()["payment_id"]);
    db.assert_invariants().await;
}

async fn shoppers_racing_for_one_session_pay_it_once(backend: Backend) {
    let (db, server, first_shopper, shop) = setup(backend).await;
    let mut shoppers = vec![first_shopper];
    for _ in 0..15 {
        shoppers.push(server.api().shopper().await);
    }
    let session_id = shop.session("ord-race", 20_000).await;
    let body = pay_session(&session_id);
    let keys: Vec<String> = shoppers.iter().map(|_| new_key()).collect();
    let answers = join_all(
        shoppers
            .iter()
            .zip(&keys)
            .map(|(shopper, key)| shopper.pay_until_definite(key, &body)),
    )
    .await;
    let winners: Vec<usize> = (0..answers.len())
        .filter(|&i| answers[i].status == StatusCode::CREATED)
        .collect();
    assert_eq!(winners.len(), 1, "one payment per session");
    let payment_id = answers[winners[0]].json()["payment_id"].clone();
    for (i, answer) in answers.iter().enumerate() {
        if i == winners[0] {
            continue;
        }
        answer.assert_problem(409, "session_already_paid");
        assert_eq!(
            answer.json()["payment_id"],
            payment_id,
            "it names the payment"
        );
        // Stored under that shopper's key, and replayed byte for byte.
        let again = shoppers[i].pay(&keys[i], &body).await;
        assert!(again.replayed());
        assert_eq!(again.body, answer.body);
        assert_eq!(
            shoppers[i].balance().await,
            OPENING_BALANCE,
            "nothing taken"
        );
    }
    assert_eq!(
        shoppers[winners[0]].balance().await,
        OPENING_BALANCE - 20_000
    );
    assert_eq!(shop.balance().await, 20_000);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, 1);
    // Every loser's change found the session taken at its first step, and left nothing.
    assert_eq!(
        db.payment_footprint(&session_id).await,
        (1, 2, 1, 1, format!("paid/{}", payment_id.as_str().unwrap())),
        "one payment, its two ledger rows, one waiting credit, one event"
    );
    db.assert_invariants().await;
}

async fn an_expired_session_is_refused_and_the_refusal_replayed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(SERVER, &db, &[("CHECKOUT_SESSION_TTL_SECS", "60")]).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка").await;
    let made = shop
        .try_session(&new_key(), &support::session_request("ord-late", 1_000))
        .await;
    let ttl = rfc3339_s(&made.json()["expires_at"]) - now_s();
    assert!((55..=60).contains(&ttl), "CHECKOUT_SESSION_TTL_SECS: {ttl}");
    let session_id = made.json()["session_id"].as_str().unwrap().to_owned();

    // The session's time runs out (moved into the past, not waited for).
    let past = (now_s() - 1) * 1000;
    db.execute(&format!(
        "UPDATE checkout_sessions SET expires_at = {past} WHERE session_id = '{session_id}'"
    ))
    .await;
    let key = new_key();
    let late = shopper.pay(&key, &pay_session(&session_id)).await;
    late.assert_problem(410, "session_expired");
    let again = shopper.pay(&key, &pay_session(&session_id)).await;
    assert!(again.replayed(), "the refusal is this key's outcome");
    assert_eq!(again.body, late.body);
    let view = Api::new(&server.base)
        .get(&format!("/api/checkout-sessions/{session_id}"))
        .await
        .json();
    assert_eq!(view["status"], "expired");
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(shop.balance().await, 0);
    db.assert_invariants().await;
}

async fn refunds_by_the_shop_are_replayed_and_capped(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let paid = shopper
        .pay(&new_key(), &shop.checkout("ord-r", 30_000).await)
        .await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();

    let key = new_key();
    let refund = shop.refund(&payment_id, &key, 10_000).await;
    assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
    assert_eq!(refund.json()["refunded_total"], 10_000);
    assert_eq!(
        refund.json()["balance"],
        20_000,
        "the shop's balance after it"
    );
    let again = shop.refund(&payment_id, &key, 10_000).await;
    assert!(again.replayed());
    assert_eq!(
        again.body, refund.body,
        "a repeated refund moves money once"
    );
    assert_eq!(shop.balance().await, 20_000);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 20_000);

    let over_key = new_key();
    let over = shop.refund(&payment_id, &over_key, 25_000).await;
    over.assert_problem(409, "refund_exceeds_payment");
    assert_eq!(over.json()["refundable"], 20_000);
    let over_again = shop.refund(&payment_id, &over_key, 25_000).await;
    assert!(over_again.replayed());
    assert_eq!(over_again.body, over.body);

    let rest = shop.refund(&payment_id, &new_key(), 20_000).await;
    assert_eq!(rest.status, StatusCode::CREATED);
    assert_eq!(rest.json()["refunded_total"], 30_000);
    assert_eq!(rest.json()["balance"], 0);
    shop.refund(&payment_id, &new_key(), 1)
        .await
        .assert_problem(409, "refund_exceeds_payment");

    let path = format!("/api/payments/{payment_id}");
    let shops_view = shop.api.get(&path).await.json();
    assert_eq!(shops_view["refunded_total"], 30_000);
    let refunds = shops_view["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 2);
    assert_eq!(refunds[0], refund.json());
    assert_eq!(refunds[1], rest.json());
    assert_eq!(
        shops_view["balance"],
        Value::Null,
        "not the shopper's balance"
    );
    let shoppers_view = shopper.get(&path).await.json();
    assert_eq!(shoppers_view["refunded_total"], 30_000);
    assert_eq!(shoppers_view["balance"], OPENING_BALANCE - 30_000);
    for listed in shoppers_view["refunds"].as_array().unwrap() {
        assert_eq!(listed["balance"], Value::Null, "not the shop's balance");
    }
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(shop.balance().await, 0);

    shop.refund("pay_nope", &new_key(), 1)
        .await
        .assert_problem(404, "not_found");
    db.assert_invariants().await;
}

async fn fifty_concurrent_refunds_while_payments_keep_arriving(backend: Backend) {
    let (db, server, shopper, shop) = setup(backend).await;
    let paid = shopper
        .pay(&new_key(), &shop.checkout("ord-cr", 30_000).await)
        .await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    let mut payers = Vec::new();
    for i in 0..20 {
        payers.push((
            server.api().shopper().await,
            shop.checkout(&format!("ord-p{i}"), 700).await,
        ));
    }
    // 50 refunds of 1 000 against 30 000: exactly 30 fit. Each is sent twice at once, while
    // 20 other payments to the same shop land, so every refund folds credits still arriving.
    let refunds = join_all((0..50).map(|_| {
        let (shop, payment_id) = (shop.clone(), payment_id.clone());
        async move {
            let key = new_key();
            let (a, b) = futures::join!(
                refund_until_definite(&shop, &payment_id, &key),
                refund_until_definite(&shop, &payment_id, &key)
            );
            assert_eq!(a.body, b.body, "both copies of one refund get one answer");
            a
        }
    }));
    let payments = join_all(
        payers
            .iter()
            .map(|(payer, body)| payer.pay_until_definite_owned(new_key(), body.clone())),
    );
    let (refunds, payments) = futures::join!(refunds, payments);
    assert!(payments.iter().all(|a| a.status == StatusCode::CREATED));
    assert_eq!(
        refunds
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .count(),
        30
    );
    for answer in refunds.iter().filter(|a| a.status != StatusCode::CREATED) {
        answer.assert_problem(409, "refund_exceeds_payment");
    }
    let details = shop
        .api
        .get(&format!("/api/payments/{payment_id}"))
        .await
        .json();
    assert_eq!(details["refunded_total"], 30_000);
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(shop.balance().await, 20 * 700);
    db.assert_invariants().await;
}

async fn refund_until_definite(shop: &Shop, payment_id: &str, key: &str) -> support::Answer {
    for _ in 0..400 {
        let answer = shop.refund(payment_id, key, 1_000).await;
        if answer.status != StatusCode::CONFLICT || answer.code() != "idempotency_key_in_use" {
            return answer;
        }
        // The client's retry policy, not a synchronisation.
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("refund never got a definite answer")
}

/// The guard keeps a shop's balance at zero or above even when refunds are within the payment:
/// the test pays the shop's money out behind the server's back (there is no payout endpoint
/// yet), then asks for a refund.
async fn a_shop_short_of_money_cannot_refund(backend: Backend) {
    let (db, _server, shopper, shop) = setup(backend).await;
    let paid = shopper
        .pay(&new_key(), &shop.checkout("ord-s", 30_000).await)
        .await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    let shop_account = shop.api.get("/api/account").await.json()["account_id"]
        .as_str()
        .unwrap()
        .to_owned();
    db.execute(&format!(
        "DELETE FROM unfolded_credits WHERE account_id = '{shop_account}'"
    ))
    .await;
    db.execute(&format!(
        "UPDATE accounts SET balance = 5000 WHERE account_id = '{shop_account}'"
    ))
    .await;

    let key = new_key();
    let short = shop.refund(&payment_id, &key, 6_000).await;
    short.assert_problem(402, "insufficient_funds");
    assert_eq!(short.json()["balance"], 5_000);
    let again = shop.refund(&payment_id, &key, 6_000).await;
    assert!(again.replayed());
    assert_eq!(again.body, short.body);
    let within = shop.refund(&payment_id, &new_key(), 5_000).await;
    assert_eq!(within.status, StatusCode::CREATED, "{}", within.body);
    assert_eq!(within.json()["balance"], 0);
    assert_eq!(shop.balance().await, 0);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 25_000);
    let details = shop
        .api
        .get(&format!("/api/payments/{payment_id}"))
        .await
        .json();
    assert_eq!(
        details["refunded_total"], 5_000,
        "the decline refunded nothing"
    );
    // Only what the payout itself broke is broken: no refund moved money it should not have.
    assert_eq!(
        db.broken_invariants().await,
        vec!["balances_equal_ledger", "test_money_conserved"]
    );
}

async fn only_the_shopper_and_the_paid_shop_see_a_payment(backend: Backend) {
    let (db, server, alice, shop) = setup(backend).await;
    let bob = server.api().shopper().await;
    let other_shop = server.add_shop("Чужая лавка").await;

    // The same key string from two shoppers is two keys.
    let alices = alice
        .pay("shared-key", &shop.checkout("ord-a", 4_000).await)
        .await;
    let bobs = bob
        .pay("shared-key", &shop.checkout("ord-b", 4_000).await)
        .await;
    assert_eq!(alices.status, StatusCode::CREATED);
    assert_eq!(bobs.status, StatusCode::CREATED);
    assert!(!bobs.replayed(), "another principal's key is another key");
    let payment_id = alices.json()["payment_id"].as_str().unwrap().to_owned();
    let path = format!("/api/payments/{payment_id}");

    // Another shopper and another shop: it does not exist for them.
    for stranger in [&bob, &other_shop.api] {
        let answer = stranger.get(&path).await;
        answer.assert_problem(404, "not_found");
        assert!(
            !answer.body.contains("4000"),
            "nothing leaks: {}",
            answer.body
        );
    }
    other_shop
        .refund(&payment_id, &new_key(), 1_000)
        .await
        .assert_problem(404, "not_found");
    // Shoppers cannot refund, not even their own payment.
    for shopper in [&alice, &bob] {
        shopper
            .refund(&payment_id, &new_key(), 1_000)
            .await
            .assert_problem(403, "forbidden");
    }
    assert_eq!(alice.get(&path).await.status, StatusCode::OK);
    assert_eq!(shop.api.get(&path).await.status, StatusCode::OK);
    assert_eq!(alice.balance().await, OPENING_BALANCE - 4_000);
    assert_eq!(bob.balance().await, OPENING_BALANCE - 4_000);
    assert_eq!(shop.balance().await, 8_000);
    assert_eq!(other_shop.balance().await, 0);
    let details = shop.api.get(&path).await.json();
    assert_eq!(details["refunded_total"], 0);
    db.assert_invariants().await;
}

async fn five_hundred_shoppers_pay_one_shop_at_once(backend: Backend) {
    let (db, server, _shopper, shop) = setup(backend).await;
    let base = server.api();
    let prepared: Vec<(Api, Value)> = futures::stream::iter(0..500)
        .map(|i| {
            let (base, shop) = (base.clone(), shop.clone());
            async move {
                (
                    base.shopper().await,
                    shop.checkout(&format!("ord-{i}"), 100 + i).await,
                )
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let expected: i64 = (0..500).map(|i| 100 + i).sum();
    let answers = join_all(
        prepared
            .iter()
            .map(|(shopper, body)| shopper.pay_until_definite_owned(new_key(), body.clone())),
    )
    .await;
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    }
    let total: i64 = answers
        .iter()
        .map(|a| a.json()["amount"].as_i64().unwrap())
        .sum();
    assert_eq!(total, expected);
    assert_eq!(
        shop.balance().await,
        expected,
        "every payment credited, exactly"
    );
    for (shopper, _) in prepared.iter().take(20) {
        assert!(shopper.balance().await < OPENING_BALANCE);
    }
    db.assert_invariants().await;
    // A refund folds all 500 waiting credits into the balance row, and takes its amount.
    let first = answers[0].json()["payment_id"].as_str().unwrap().to_owned();
    let refund = shop.refund(&first, &new_key(), 50).await;
    assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
    assert_eq!(refund.json()["balance"], expected - 50);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM unfolded_credits").await, 0);
    assert_eq!(shop.balance().await, expected - 50);
    db.assert_invariants().await;
}

async fn an_operator_adds_shops_beside_the_running_server(backend: Backend) {
    let (db, server, shopper, _shop) = setup(backend).await;
    let added = server.add_shop("  Новая лавка  ").await;
    assert!(added.shop_id.starts_with("shop_"));
    assert!(added.signing_secret.starts_with("whsec_"));
    let secret = added.api.token.clone().unwrap();
    assert!(secret.starts_with("sk_"));
    // The running server knows it at once, by its secret key, which it stores only hashed.
    let account = added.api.get("/api/account").await;
    assert_eq!(account.status, StatusCode::OK, "{}", account.body);
    let session = added.session("ord-new", 700).await;
    let view = Api::new(&server.base)
        .get(&format!("/api/checkout-sessions/{session}"))
        .await
        .json();
    assert_eq!(view["shop"]["name"], "Новая лавка");
    assert_eq!(
        shopper.pay(&new_key(), &pay_session(&session)).await.status,
        StatusCode::CREATED
    );
    assert_eq!(added.balance().await, 700);
    assert_eq!(
        db.scalar(&format!(
            "SELECT COUNT(*) FROM accounts WHERE token_hash LIKE '%{}%'",
            &secret[3..]
        ))
        .await,
        0
    );

    // Bad names and URLs are refused with a reason, and add nothing.
    let shops_before = db.scalar("SELECT COUNT(*) FROM shops").await;
    for args in [
        vec!["shop", "add", "--name", ""],
        vec!["shop", "add", "--name", "ok", "--webhook-url", "ftp://x"],
        vec!["shop", "add", "--name", "ok", "--webhook-url", "not a url"],
        vec!["shop", "add"],
    ] {
        let output = tokio::process::Command::new(SERVER)
            .args(&args)
            .env("DATABASE_URL", &db.url)
            .output()
            .await
            .unwrap();
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(output.stdout.is_empty(), "{args:?} printed secrets");
        assert!(!output.stderr.is_empty(), "{args:?} says why");
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM shops").await, shops_before);
    db.assert_invariants().await;
}
