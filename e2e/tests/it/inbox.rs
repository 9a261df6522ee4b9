//! The demo shop's webhook receiver as the checkout (or an impostor) reaches it: real processes
//! (checkout server, demo shop, each with its own database), no browser. An event changes the
//! shop once however often it arrives, racing copies included; a forged, stale or foreign one
//! changes nothing; a shop killed after its commit but before its `2xx` gets the event again and
//! absorbs it.

use std::time::Duration;

use checkout_testkit::{Backend, DemoShop, Server, TestDb, new_key, wait_until};
use reqwest::StatusCode;
use serde_json::{Value, json};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-faults");
const SHOP: &str = env!("CARGO_BIN_EXE_demo-shop-for-tests");
const WITHIN: Duration = Duration::from_secs(30);

struct World {
    db: TestDb,
    server: Server,
    /// The checkout's settings, to start it again the same way.
    server_env: Vec<(String, String)>,
    shop: DemoShop,
    credentials: tempfile::TempDir,
    http: reqwest::Client,
}

async fn world(backend: Backend, shop_env: &[(&str, &str)]) -> World {
    world_polling(backend, shop_env, "20").await
}

/// A world whose checkout looks for due events every `poll_ms`.
async fn world_polling(backend: Backend, shop_env: &[(&str, &str)], poll_ms: &str) -> World {
    world_with(backend, shop_env, poll_ms, &[]).await
}

/// A world whose checkout also has these settings.
async fn world_with(
    backend: Backend,
    shop_env: &[(&str, &str)],
    poll_ms: &str,
    server_extra: &[(&str, &str)],
) -> World {
    let db = TestDb::new(backend).await;
    let credentials = tempfile::tempdir().unwrap();
    let file = credentials.path().join("demo-shop.json");
    // The checkout's address is fixed first; the shop starts on a port of its own (reading the
    // credentials once the checkout has written them); then the checkout, which sends to it.
    let checkout_addr = format!("127.0.0.1:{}", checkout_testkit::postgres::free_port());
    let shop = DemoShop::start(SHOP, &format!("http://{checkout_addr}"), &file, shop_env).await;
    let webhook_url = format!("{}/webhooks/checkout", shop.base);
    let file_setting = file.display().to_string();
    let server_env: Vec<(String, String)> = [
        ("CHECKOUT_ADDR", checkout_addr.as_str()),
        ("CHECKOUT_DEMO_SHOP_FILE", file_setting.as_str()),
        ("CHECKOUT_DEMO_SHOP_WEBHOOK_URL", webhook_url.as_str()),
        // The shop's pages: where its sessions' `return_url`s lead.
        ("CHECKOUT_DEMO_SHOP_ORIGIN", shop.base.as_str()),
        ("CHECKOUT_WEBHOOK_POLL_MS", poll_ms),
        ("CHECKOUT_WEBHOOK_FIRST_RETRY_MS", "100"),
    ]
    .iter()
    .chain(server_extra)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let server = start_checkout(&db, &server_env).await;
    World {
        db,
        server,
        server_env,
        shop,
        credentials,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    }
}

async fn start_checkout(db: &TestDb, env: &[(String, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Server::start_with(SERVER, db, &env).await
}

impl World {
    fn signing_secret(&self) -> String {
        let text = std::fs::read_to_string(self.credentials.path().join("demo-shop.json")).unwrap();
        let credentials: Value = serde_json::from_str(&text).unwrap();
        credentials["signing_secret"].as_str().unwrap().to_owned()
    }

    /// An order of 450,00 ₽ placed in the storefront, as its form posts it: its id.
    async fn order(&self) -> String {
        let form = format!("cart_token={}&qty_ethiopia=2&qty_filters=1", new_key());
        let answer = self
            .http
            .post(format!("{}/orders", self.shop.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER);
        let location = answer.headers()["location"].to_str().unwrap().to_owned();
        location.trim_start_matches("/orders/").to_owned()
    }

    /// Posts `body` as event `id` signed at `timestamp` with `secret`: status and body.
    async fn deliver(&self, id: &str, timestamp: i64, secret: &str, body: &str) -> (u16, String) {
        let signature = standardwebhooks::Webhook::new(secret)
            .unwrap()
            .sign(id, timestamp, body.as_bytes())
            .unwrap();
        let answer = self
            .http
            .post(format!("{}/webhooks/checkout", self.shop.base))
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    }

    /// A demo shopper pays the order's session through the checkout's API.
    async fn pay(&self, order: &str) {
        let session = self
            .shop
            .text(&format!(
                "SELECT checkout_session_id FROM orders WHERE id = '{order}'"
            ))
            .await
            .expect("the order has its session");
        let shopper = self.server.api().shopper().await;
        let paid = shopper
            .pay(&new_key(), &json!({"checkout_session_id": session}))
            .await;
        assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    }

    async fn shop_count(&self, sql: &str) -> i64 {
        self.shop.scalar(sql).await
    }

    /// The body of a GET of `url`.
    async fn text(&self, url: &str) -> String {
        let answer = self.http.get(url).send().await.unwrap();
        assert!(answer.status().is_success(), "{url}: {}", answer.status());
        answer.text().await.unwrap()
    }

    async fn shop_text(&self, sql: &str) -> String {
        self.shop.text(sql).await.expect("a row")
    }
}

fn now_s() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn payment_event(order: &str) -> String {
    json!({
        "type": "payment.succeeded",
        "timestamp": "2026-12-03T10:00:00Z",
        "data": {
            "payment_id": "pay_01900000000000000000000000000001",
            "checkout_session_id": "cs_x",
            "order_id": order,
            "amount": 45_000,
            "currency": "RUB",
            "status": "succeeded",
            "created_at": "2026-12-03T10:00:00Z"
        }
    })
    .to_string()
}

const EVENT_ID: &str = "evt_0190000000000000000000000000abcd";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_event_again_or_racing_changes_nothing_the_second_time() {
    let metrics_addr = format!("127.0.0.1:{}", checkout_testkit::postgres::free_port());
    let w = world(Backend::Sqlite, &[("SHOP_METRICS_ADDR", &metrics_addr)]).await;
    let order = w.order().await;
    let (secret, body) = (w.signing_secret(), payment_event(&order));

    let (status, first) = w.deliver(EVENT_ID, now_s(), &secret, &body).await;
    assert_eq!(status, 200, "{first}");
    assert!(first.contains("order paid"), "{first}");
    let (status, again) = w.deliver(EVENT_ID, now_s(), &secret, &body).await;
    assert_eq!(
        (status, again.as_str()),
        (200, first.as_str()),
        "the stored answer, replayed"
    );

    // Eight copies of another event at once: one applies it, the others wait and replay.
    let refund = json!({
        "type": "refund.succeeded",
        "timestamp": "2026-12-03T10:05:00Z",
        "data": {"refund_id": "ref_1", "payment_id": "pay_01900000000000000000000000000001",
                 "order_id": order, "amount": 10_000, "refunded_total": 10_000,
                 "currency": "RUB", "created_at": "2026-12-03T10:05:00Z"}
    })
    .to_string();
    let refund_id = "evt_0190000000000000000000000000abce";
    let copies =
        futures::future::join_all((0..8).map(|_| w.deliver(refund_id, now_s(), &secret, &refund)))
            .await;
    for (status, answer) in &copies {
        assert!(
            *status == 200 || *status == 409,
            "applied, replayed, or told to come back: {status} {answer}"
        );
    }
    let applied: Vec<&String> = copies
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, a)| a)
        .collect();
    assert!(!applied.is_empty());
    assert!(
        applied
            .iter()
            .all(|a| *a == applied[0] && a.contains("refund recorded")),
        "one answer, stored once and replayed: {applied:?}"
    );

    assert_eq!(
        w.shop_count("SELECT COUNT(*) FROM inbox").await,
        2,
        "two events, once each"
    );

    // The shop's metrics count what the inbox absorbed.
    let scrape = w.text(&format!("http://{metrics_addr}/metrics")).await;
    let count = |outcome: &str| {
        checkout_testkit::metric(
            &scrape,
            "shop_inbox_deliveries_total",
            &[("outcome", outcome)],
        )
        .map_or(0, |n| n as u64)
    };
    let conflicts = copies.iter().filter(|(s, _)| *s == 409).count() as u64;
    assert_eq!(count("applied"), 2, "{scrape}");
    assert_eq!(count("duplicate"), 1 + (8 - conflicts - 1), "{scrape}");
    assert_eq!(count("in_use"), conflicts, "{scrape}");
    assert_eq!(
        w.shop_count(&format!(
            "SELECT COUNT(*) FROM orders WHERE id = '{order}' AND state = 'paid' AND paid_via = 'webhook' AND refunded = 10000"
        ))
        .await,
        1
    );
    // The bonus is a state: (450 − 100) ₽ / 10 = 35 points, however often anything arrived.
    assert_eq!(
        w.shop_count(&format!(
            "SELECT points FROM bonuses WHERE order_id = '{order}'"
        ))
        .await,
        35
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_stale_or_foreign_events_are_refused_and_change_nothing() {
    let w = world(Backend::Sqlite, &[]).await;
    let order = w.order().await;
    let (secret, body) = (w.signing_secret(), payment_event(&order));
    let impostor = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    let (status, _) = w.deliver(EVENT_ID, now_s(), impostor, &body).await;
    assert_eq!(status, 401, "another secret's signature");
    let (status, _) = w.deliver(EVENT_ID, now_s() - 600, &secret, &body).await;
    assert_eq!(status, 401, "signed ten minutes ago: a replay");
    let (status, _) = w
        .deliver(
            "pay_0190000000000000000000000000abcd",
            now_s(),
            &secret,
            &body,
        )
        .await;
    assert_eq!(status, 400, "not a checkout event id");
    let (status, _) = w
        .deliver(EVENT_ID, now_s(), &secret, "{\"not\":\"an event\"}")
        .await;
    assert_eq!(status, 400, "not an event");

    assert_eq!(w.shop_count("SELECT COUNT(*) FROM inbox").await, 0);
    assert_eq!(
        w.shop_count("SELECT COUNT(*) FROM orders WHERE state = 'paid'")
            .await,
        0
    );
    assert_eq!(w.shop_count("SELECT COUNT(*) FROM bonuses").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shop_killed_after_its_commit_gets_the_event_again_and_absorbs_it() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let mut w = world(backend, &[("SHOP_FAULTS", "die_after_webhook_commit=1")]).await;
        let order = w.order().await;
        // The shopper pays the order's session through the checkout's API.
        w.pay(&order).await;

        // The shop applies the event, commits, and dies before its 2xx.
        let deadline = std::time::Instant::now() + WITHIN;
        while !w.shop.has_exited() {
            assert!(std::time::Instant::now() < deadline, "the shop never died");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            w.shop_count("SELECT COUNT(*) FROM inbox").await,
            1,
            "committed"
        );
        w.shop.restart(&[]).await;

        // The checkout sends it again; the inbox absorbs it.
        let delivered =
            "SELECT COUNT(*) FROM webhook_events WHERE status = 'delivered' AND attempts >= 2";
        wait_until("the event was never delivered again", WITHIN, || async {
            w.db.scalar(delivered).await == 1
        })
        .await;
        assert_eq!(w.shop_count("SELECT COUNT(*) FROM inbox").await, 1);
        assert_eq!(
            w.shop_count(&format!(
                "SELECT points FROM bonuses WHERE order_id = '{order}'"
            ))
            .await,
            45,
            "the bonus written once: 450 ₽ / 10"
        );
        assert!(
            w.shop.log().contains("webhook already applied"),
            "the second delivery was a replay"
        );
        w.db.assert_invariants().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkout_killed_before_sending_delivers_after_restart_and_the_order_is_paid_once() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        // A checkout that cannot send yet (it was started without the shop's endpoint): the
        // payment commits, its event waits in the outbox, and the server dies.
        let mut w = world_polling(backend, &[], "20").await;
        let env = w.server_env.clone();
        w.server.kill();
        let mut without_endpoint = env.clone();
        without_endpoint.retain(|(k, _)| k != "CHECKOUT_DEMO_SHOP_WEBHOOK_URL");
        w.server = start_checkout(&w.db, &without_endpoint).await;
        let order = w.order().await;
        w.pay(&order).await;
        w.server.kill();
        assert_eq!(
            w.db.scalar(
                "SELECT COUNT(*) FROM webhook_events WHERE status = 'no_endpoint' AND attempts = 0"
            )
            .await,
            1,
            "committed with the payment, never sent"
        );
        assert_eq!(w.shop_count("SELECT COUNT(*) FROM inbox").await, 0);

        // Started again with the shop's endpoint, it sends the event; the shop applies it once.
        w.server = start_checkout(&w.db, &env).await;
        let paid_once = format!(
            "SELECT COUNT(*) FROM orders WHERE id = '{order}' AND state = 'paid' AND paid_via = 'webhook'"
        );
        wait_until("the shop never learned of the payment", WITHIN, || async {
            w.shop.scalar(&paid_once).await == 1
        })
        .await;
        assert_eq!(w.shop_count("SELECT COUNT(*) FROM inbox").await, 1);
        assert_eq!(
            w.shop_count(&format!(
                "SELECT points FROM bonuses WHERE order_id = '{order}'"
            ))
            .await,
            45
        );
        w.db.assert_invariants().await;
    }
}

/// The checkout closes a session that lapsed unpaid and tells the shop: the order says so, its
/// page no longer offers to pay, and the same event again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_that_lapses_unpaid_marks_the_order_expired_once() {
    let w = world_with(
        Backend::Sqlite,
        &[],
        "20",
        &[
            ("CHECKOUT_SESSION_TTL_SECS", "1"),
            ("CHECKOUT_SWEEP_SECS", "1"),
        ],
    )
    .await;
    let order = w.order().await;
    let expired = format!(
        "SELECT COUNT(*) FROM orders WHERE id = '{order}' AND state = 'awaiting_payment' AND session_expired_at IS NOT NULL"
    );
    let told = || async { w.shop_count(&expired).await == 1 };
    wait_until("the shop learns that the session lapsed", WITHIN, told).await;
    assert_eq!(
        w.shop_count("SELECT COUNT(*) FROM inbox").await,
        1,
        "one event, once"
    );

    let page = w.text(&format!("{}/orders/{order}", w.shop.base)).await;
    assert!(page.contains("Срок оплаты истёк"), "{page}");
    assert!(
        !page.contains("data-checkout-session"),
        "no widget for a session that cannot be paid"
    );
    let staff = w.shop.staff_cookie().await;
    let admin = w
        .http
        .get(format!("{}/admin", w.shop.base))
        .header("cookie", staff)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(admin.contains("Срок оплаты истёк"), "{admin}");

    // The same event again (its id and body from the inbox): absorbed, nothing changes.
    let (event_id, body) = (
        w.shop_text("SELECT webhook_id FROM inbox").await,
        w.shop_text("SELECT request_body FROM inbox").await,
    );
    let (status, answer) = w
        .deliver(&event_id, now_s(), &w.signing_secret(), &body)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("order expired"),
        "the stored answer: {answer}"
    );
    assert_eq!(w.shop_count(&expired).await, 1);
    assert_eq!(w.shop_count("SELECT COUNT(*) FROM inbox").await, 1);
}

/// The operator rolls the shop's signing secret with an overlap (`shop roll-webhook-secret
/// --overlap 1h`): the shop, still on the old secret, verifies every event; given the new one
/// (its credentials file), it verifies them too; after the overlap only the new one signs, and
/// a shop put back on the old secret refuses the event (kept, and sent again) until it has the
/// new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shop_verifies_its_events_with_the_old_secret_or_the_new_through_a_roll() {
    let w = world(Backend::Sqlite, &[]).await;
    let file = w.credentials.path().join("demo-shop.json");
    let credentials: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let shop_id = credentials["shop_id"].as_str().unwrap().to_owned();
    let old = w.signing_secret();
    let with_secret = |secret: &str| {
        let mut written = credentials.clone();
        written["signing_secret"] = json!(secret);
        std::fs::write(&file, written.to_string()).unwrap();
    };
    let paid_by_webhook = |order: String| {
        let sql = format!(
            "SELECT COUNT(*) FROM orders WHERE id = '{order}' AND state = 'paid' AND paid_via = 'webhook'"
        );
        let shop = &w.shop;
        async move {
            wait_until(
                &format!("{order} was never paid by the checkout's event"),
                WITHIN,
                || async { shop.scalar(&sql).await == 1 },
            )
            .await
        }
    };

    let (ok, out, err) = w
        .server
        .operator(&[
            "shop",
            "roll-webhook-secret",
            "--shop",
            &shop_id,
            "--mode",
            "test",
            "--overlap",
            "1h",
        ])
        .await;
    assert!(ok, "{out} {err}");
    let new = serde_json::from_str::<Value>(&out).unwrap()["signing_secret"]
        .as_str()
        .unwrap()
        .to_owned();
    // Still on the old secret.
    let first = w.order().await;
    w.pay(&first).await;
    paid_by_webhook(first).await;
    // Given the new one.
    with_secret(&new);
    let second = w.order().await;
    w.pay(&second).await;
    paid_by_webhook(second).await;

    // The overlap ends; a shop put back on the old secret refuses the event, which waits.
    w.db.execute(
        "UPDATE shops SET old_signing_secret_until = 0 WHERE old_signing_secret IS NOT NULL",
    )
    .await;
    with_secret(&old);
    let third = w.order().await;
    w.pay(&third).await;
    wait_until("the event was never refused", WITHIN, || async {
        w.db.scalar("SELECT COUNT(*) FROM webhook_events WHERE status = 'pending' AND attempts > 0")
            .await
            == 1
    })
    .await;
    assert_eq!(
        w.shop_count(&format!(
            "SELECT COUNT(*) FROM orders WHERE id = '{third}' AND state = 'paid'"
        ))
        .await,
        0
    );
    // With the new secret again, the event sent again is verified and applied once.
    with_secret(&new);
    paid_by_webhook(third).await;
    assert_eq!(
        w.shop_count("SELECT COUNT(*) FROM orders WHERE state = 'paid'")
            .await,
        3
    );
}

/// A refund's event older than one already applied (the checkout's `sequence`: a redelivery
/// asked after a newer event went out) is recorded, its refund settled, and the order's totals
/// stay as the newer event left them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_refund_event_after_a_newer_one_keeps_the_totals() {
    let w = world(Backend::Sqlite, &[]).await;
    let order = w.order().await;
    let secret = w.signing_secret();
    let mut paid: Value = serde_json::from_str(&payment_event(&order)).unwrap();
    paid["sequence"] = json!(1);
    let (status, answer) = w
        .deliver(EVENT_ID, now_s(), &secret, &paid.to_string())
        .await;
    assert_eq!(status, 200, "{answer}");
    let refund = |sequence: i64, refund_id: &str, amount: i64, total: i64| {
        json!({
            "type": "refund.succeeded",
            "sequence": sequence,
            "timestamp": "2026-12-03T10:05:00Z",
            "data": {"refund_id": refund_id, "payment_id": "pay_01900000000000000000000000000001",
                     "order_id": order, "amount": amount, "refunded_total": total,
                     "currency": "RUB", "created_at": "2026-12-03T10:05:00Z"}
        })
        .to_string()
    };
    // The newer first (sequence 3: 100 ₽ + 50 ₽ refunded), then the older (2: 100 ₽).
    let (status, newer) = w
        .deliver(
            "evt_0190000000000000000000000000abd3",
            now_s(),
            &secret,
            &refund(3, "ref_2", 5_000, 15_000),
        )
        .await;
    assert_eq!(status, 200, "{newer}");
    assert!(newer.contains("\"refund recorded\""), "{newer}");
    let (status, older) = w
        .deliver(
            "evt_0190000000000000000000000000abd2",
            now_s(),
            &secret,
            &refund(2, "ref_1", 10_000, 10_000),
        )
        .await;
    assert_eq!(status, 200, "{older}");
    assert!(older.contains("older than an event applied"), "{older}");

    assert_eq!(
        w.shop_count(&format!("SELECT refunded FROM orders WHERE id = '{order}'"))
            .await,
        15_000,
        "the newer total stands"
    );
    assert_eq!(
        w.shop_count(&format!(
            "SELECT payment_sequence FROM orders WHERE id = '{order}'"
        ))
        .await,
        3
    );
    // The bonus follows the totals: (450 − 150) ₽ / 10 = 30 points.
    assert_eq!(
        w.shop_count(&format!(
            "SELECT points FROM bonuses WHERE order_id = '{order}'"
        ))
        .await,
        30
    );
    assert_eq!(w.shop_count("SELECT COUNT(*) FROM inbox").await, 3);
}
