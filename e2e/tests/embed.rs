//! The widget in a shop's page: the page adds one script and one element per checkout session;
//! each widget keeps its own intent (its state is stored under its session), and the page hears
//! how each payment ended from a `checkout:paid` event on that element.

#[allow(unused_macros)]
#[macro_use]
mod browser;

use std::path::Path;

use browser::Checkout;
use checkout_testkit::{Backend, wait_until};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_widgets_for_two_sessions_on_one_page_pay_independently() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let site = tempfile::tempdir().unwrap();
        let static_dir = site.path().display().to_string();
        let c = Checkout::start(backend, "", &[("CHECKOUT_STATIC_DIR", &static_dir)]).await;
        let shop = c.server.add_shop("Книжная лавка").await;
        let (first, second) = (
            shop.session("ORD-A", 30_000).await,
            shop.session("ORD-B", 12_000).await,
        );
        shop_page(site.path(), &first, &second);

        let page = format!("{}/shop.html", c.server.base);
        c.browser.goto(&page).await.unwrap();
        c.wait_for_text("#a .total-amount", "300,00").await;
        c.wait_for_text("#b .total-amount", "120,00").await;
        c.wait_for_text("#a .shop-name", "Книжная лавка").await;
        c.wait_for("#a button.pay:not([disabled])").await;
        c.click("#a button.pay", 2).await;
        let paid_a = c.wait_for_text("#a .payment-id", "pay_").await;
        assert_eq!(
            c.count("#b .payment-id").await,
            0,
            "the other widget did not pay"
        );
        c.wait_for("#b button.pay:not([disabled])").await;
        c.click("#b button.pay", 1).await;
        let paid_b = c.wait_for_text("#b .payment-id", "pay_").await;
        assert_ne!(paid_a, paid_b);
        c.screenshot("seen-two-widgets-in-a-shop-page").await;

        // The page heard each payment once, from its own element, with the receipt.
        let events = wait_for_events(&c, 2).await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0]["name"], "checkout:paid");
        assert_eq!(events[0]["host"], "a");
        assert_eq!(events[0]["payment_id"], paid_a.as_str());
        assert_eq!(events[1]["host"], "b");
        assert_eq!(events[1]["payment_id"], paid_b.as_str());

        // Each intent is stored under its own session.
        for session in [&first, &second] {
            let saved = c
                .js(&format!(
                    "return sessionStorage.getItem('checkout.state.{session}');"
                ))
                .await;
            assert!(saved.as_str().is_some_and(|s| s.contains(session.as_str())));
        }

        // After a refresh both receipts are back, nothing is sent again.
        c.browser.refresh().await.unwrap();
        assert_eq!(c.wait_for_text("#a .payment-id", "pay_").await, paid_a);
        assert_eq!(c.wait_for_text("#b .payment-id", "pay_").await, paid_b);
        assert_eq!(
            c.payments_in_db().await,
            2,
            "{backend:?}: each session paid once"
        );
        assert_eq!(shop.balance().await, 42_000);
        c.db.assert_invariants().await;
        let _ = c.browser.close().await;
    }
}

/// The widget's own dev page (`trunk serve`, or the checkout's `/` in demo mode) mounts it as a
/// Leptos component for a demo-shop session it keeps per tab: it pays, tells the page, and a
/// refresh comes back to the same purchase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_page_pays_a_demo_session_with_the_widget_as_a_leptos_component() {
    let c = Checkout::start(checkout_testkit::Backend::Sqlite, "", &[]).await;
    c.browser
        .goto(&format!("{}/", c.server.base))
        .await
        .unwrap();
    c.wait_for(".checkout-host .checkout .balance").await;
    let total = c.wait_for_text(".total-amount", ",00").await;
    assert!(total.contains('₽'), "{total}");
    let session = c
        .js("return sessionStorage.getItem('checkout.dev-session');")
        .await;
    let session = session
        .as_str()
        .expect("the demo session is kept")
        .to_owned();
    assert!(session.starts_with("cs_"), "{session}");
    c.js("window.heard = []; document.addEventListener('checkout:paid', (e) => window.heard.push(e.detail.payment_id)); return true;")
        .await;
    c.wait_for("button.pay:not([disabled])").await;
    c.click("button.pay", 2).await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    let heard = || async { c.js("return window.heard.length;").await.as_u64() == Some(1) };
    wait_until("the page never heard checkout:paid", browser::WAIT, heard).await;
    assert_eq!(
        c.js("return window.heard;").await,
        serde_json::json!([paid])
    );
    c.screenshot("seen-dev-page").await;

    c.browser.refresh().await.unwrap();
    assert_eq!(
        c.wait_for_text(".payment-id", "pay_").await,
        paid,
        "the same purchase"
    );
    assert_eq!(
        c.js("return sessionStorage.getItem('checkout.dev-session');")
            .await,
        serde_json::json!(session)
    );
    assert_eq!(c.payments_in_db().await, 1, "paid once");
    c.db.assert_invariants().await;
    let _ = c.browser.close().await;
}

/// A session made without items (a gift card, a subscription): the widget shows and pays the
/// session's amount, on the button too, and its description. Before the fix it showed
/// «Итого 0,00 ₽» and an active button that then debited 700,00 ₽.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_items_is_shown_and_paid_for_its_amount() {
    let site = tempfile::tempdir().unwrap();
    let static_dir = site.path().display().to_string();
    let c = Checkout::start(Backend::Sqlite, "", &[("CHECKOUT_STATIC_DIR", &static_dir)]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let made = shop
        .try_session(
            &checkout_testkit::new_key(),
            &serde_json::json!({"order_id": "GIFT-1", "amount": 70_000, "description": "Подарочный сертификат"}),
        )
        .await;
    let session = made.json()["session_id"].as_str().unwrap().to_owned();
    let other = shop.session("ORD-OTHER", 100).await;
    shop_page(site.path(), &session, &other);
    c.browser
        .goto(&format!("{}/shop.html", c.server.base))
        .await
        .unwrap();
    c.wait_for_text("#a .total-amount", "700,00").await;
    c.wait_for_text("#a .description", "Подарочный сертификат")
        .await;
    c.wait_for_text("#a button.pay", "Оплатить 700,00").await;
    c.wait_for("#a button.pay:not([disabled])").await;
    c.screenshot("seen-session-without-items").await;
    c.click("#a button.pay", 1).await;
    c.wait_for_text("#a .receipt-amount", "700,00").await;
    assert_eq!(
        c.wait_for_text("#a .receipt-balance", "300,00").await,
        "300,00 ₽"
    );
    assert_eq!(shop.balance().await, 70_000);
    c.db.assert_invariants().await;
    let _ = c.browser.close().await;
}

/// A session that lapsed before the page was opened: the widget says so, offers nothing to
/// pay, and tells the page (`checkout:declined` with `session_expired`). Before the fix it
/// offered «Оплатить».
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_session_shows_it_lapsed_and_offers_nothing_to_pay() {
    let site = tempfile::tempdir().unwrap();
    let static_dir = site.path().display().to_string();
    let c = Checkout::start(
        Backend::Sqlite,
        "",
        &[
            ("CHECKOUT_STATIC_DIR", &static_dir),
            ("CHECKOUT_SESSION_TTL_SECS", "1"),
        ],
    )
    .await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let (lapsed, other) = (
        shop.session("ORD-LATE", 5_000).await,
        shop.session("ORD-X", 100).await,
    );
    let public = c.server.api();
    wait_until("the session never lapsed", browser::WAIT, || async {
        public
            .get(&format!("/api/checkout-sessions/{lapsed}"))
            .await
            .json()["status"]
            == "expired"
    })
    .await;
    shop_page(site.path(), &lapsed, &other);
    c.browser
        .goto(&format!("{}/shop.html", c.server.base))
        .await
        .unwrap();
    c.wait_for_text("#a .expired", "Срок оплаты истёк").await;
    assert_eq!(c.count("#a button.pay").await, 0, "nothing to pay");
    let events = wait_for_events(&c, 1).await;
    assert!(
        events
            .iter()
            .any(|e| e["host"] == "a" && e["name"] == "checkout:declined"),
        "{events:?}"
    );
    assert_eq!(c.payments_in_db().await, 0);
    let _ = c.browser.close().await;
}

/// What the page's listener has heard so far, once it has heard `n` events.
async fn wait_for_events(c: &Checkout, n: usize) -> Vec<Value> {
    let heard = || async {
        c.js("return window.checkoutEvents.length;")
            .await
            .as_u64()
            .unwrap_or(0) as usize
            >= n
    };
    wait_until("the page never heard its events", browser::WAIT, heard).await;
    c.js("return window.checkoutEvents;")
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A shop's page with two widgets, served beside the widget's build: the one loader script,
/// one element mounted on its own, one mounted by `Checkout.mount`, and the page's own external
/// module (the checkout's strict policy allows no inline script of the shop).
fn shop_page(dir: &Path, first: &str, second: &str) {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist");
    assert!(
        dist.join("checkout.js").exists(),
        "the widget's build (scripts/test makes it)"
    );
    copy_dir(&dist, dir);
    std::fs::write(
        dir.join("shop.html"),
        format!(
            r#"<!doctype html>
<html lang="ru"><head><meta charset="utf-8"><title>Книжная лавка</title>
<script type="module" src="/shop.js"></script>
<script type="module" src="/checkout.js"></script></head>
<body><h1>Ваш заказ</h1>
<div id="a" data-checkout-session="{first}"></div>
<div id="b" data-session="{second}"></div>
</body></html>"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("shop.js"),
        r#"window.checkoutEvents = [];
for (const name of ["checkout:paid", "checkout:declined"]) {
  document.addEventListener(name, (event) => window.checkoutEvents.push(
    { name, host: event.target.id, payment_id: event.detail && event.detail.payment_id }));
}
document.addEventListener("checkout:ready", () => {
  const b = document.getElementById("b");
  Checkout.mount(b, { session: b.dataset.session });
});
"#,
    )
    .unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
