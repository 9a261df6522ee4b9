//! The shop's dashboard in a real browser, beside the demo shop (its own process, its inbox
//! verifying every event): an owner is invited by mail and signs in, finds a payment, refunds it
//! with a double click (one refund), resends an event, rolls the signing secret while the shop
//! keeps verifying, disables and enables the endpoint. Every page is photographed at a phone's
//! width and a desktop's, and axe-core finds nothing on any of them.

use crate::browser;

use browser::{CART, Checkout};
use checkout_testkit::wait_until;

scenario!(a_shops_owner_works_in_the_dashboard, "", [Sqlite, Postgres]);

const PASSWORD: &str = "пароль-владельца";

/// The page as a person sees it at a phone's width and a desktop's: axe finds nothing at
/// either, and both are photographed (`seen-axe-dashboard-{name}-{width}`).
async fn look(c: &Checkout, name: &str) {
    for (width, height) in [(390, 844), (1280, 900)] {
        c.browser.set_window_size(width, height).await.unwrap();
        c.assert_accessible(&format!("dashboard-{name}-{width}"))
            .await;
        // Nothing wider than the window: no sideways scrolling on a phone.
        let fits = c
            .js("return document.documentElement.scrollWidth <= window.innerWidth;")
            .await;
        assert_eq!(
            fits,
            serde_json::json!(true),
            "{name} at {width} px scrolls sideways"
        );
    }
}

async fn go(c: &Checkout, path: &str) {
    c.browser
        .goto(&format!("{}{path}", c.server.base))
        .await
        .unwrap();
}

/// Submits the form `css` by its button, and waits for the page it leads to: a new page (the
/// one left is marked, since `then` may be on it too, as a search's table is) that shows `then`.
async fn submit(c: &Checkout, css: &str, then: &str) {
    c.js("document.documentElement.dataset.left = 'yes'; return null;")
        .await;
    c.click_soon(&format!("{css} button[type=submit]")).await;
    let arrived = format!(
        "return document.readyState === 'complete' && !document.documentElement.dataset.left \
                && document.querySelector({then:?}) !== null;"
    );
    wait_until(
        &format!("the page after {css} never showed {then}"),
        browser::WAIT,
        // Mid-navigation a script may find no document to run in: not arrived yet.
        || async {
            c.browser.execute(&arrived, vec![]).await.ok() == Some(serde_json::json!(true))
        },
    )
    .await;
}

/// The demo shop's inbox took this event (it verified its signature first).
async fn shop_took(c: &Checkout, event_id: &str) {
    wait_until(
        &format!("the demo shop never took {event_id}"),
        browser::WAIT,
        || async {
            c.shop
                .scalar(&format!(
                    "SELECT COUNT(*) FROM inbox WHERE webhook_id = '{event_id}' AND status = 'done'"
                ))
                .await
                == 1
        },
    )
    .await;
}

async fn event_of(c: &Checkout, subject: &str, event_type: &str) -> String {
    c.db.scalar_text(&format!(
        "SELECT event_id FROM webhook_events WHERE subject_id = '{subject}' AND type = '{event_type}' \
          ORDER BY seq DESC LIMIT 1"
    ))
    .await
}

async fn a_shops_owner_works_in_the_dashboard(c: Checkout) -> Checkout {
    // A paid order, the demo shop told of it.
    c.open().await;
    c.click("button.pay", 1).await;
    let payment = c.assert_paid_once().await;
    let order = c.order_id().await;
    c.on_top().await;

    // The operator invites the owner; the owner follows the mailed link.
    let email = format!(
        "owner-{}@coffee.example.ru",
        checkout_testkit::new_key().to_lowercase()
    );
    let link = c.server.invite("shop_demo", &email, "owner").await;
    c.browser.goto(&link).await.unwrap();
    c.wait_for("#password").await;
    look(&c, "invitation").await;
    c.type_into("#password", PASSWORD).await;
    c.type_into("#repeat", PASSWORD).await;
    submit(&c, "form.stack", "dl.figures").await;
    c.wait_for_text("dl.figures", "1 на 450,00").await;
    look(&c, "overview").await;

    // Find the payment by its order, open it.
    go(&c, "/dashboard/payments").await;
    c.type_into("#q", &order).await;
    submit(&c, "form.search", "table").await;
    assert_eq!(c.count("tbody tr").await, 1);
    look(&c, "payments").await;
    c.click_soon(&format!("a[href^='/dashboard/payments/{payment}']"))
        .await;
    c.wait_for("form.refund").await;
    c.wait_for_text("#refundable", "450,00").await;
    look(&c, "payment").await;

    // «Вернуть» clicked twice in one tick: one refund.
    c.type_into("#amount", "100").await;
    c.js("const b = document.querySelector('form.refund button'); b.click(); b.click();")
        .await;
    c.wait_for("p.notice").await;
    c.wait_for_text("#refundable", "350,00").await;
    assert_eq!(
        c.db.scalar("SELECT COUNT(*) FROM refunds").await,
        1,
        "one refund"
    );
    wait_until("the shop hears of the refund", browser::WAIT, || async {
        c.shop
            .scalar(&format!("SELECT refunded FROM orders WHERE id = '{order}'"))
            .await
            == 10_000
    })
    .await;
    assert_eq!(
        c.db.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'refund.created'")
            .await,
        1
    );

    // Resend the payment's event from its page: a second attempt, the same webhook-id, which
    // the shop's inbox takes once.
    let paid_event = event_of(&c, &payment, "payment.succeeded").await;
    go(&c, &format!("/dashboard/events/{paid_event}")).await;
    c.wait_for_text("section.panel", "доставлено").await;
    look(&c, "event").await;
    submit(&c, "form[action$='/redelivery']", "p.notice").await;
    wait_until("the event is sent again", browser::WAIT, || async {
        c.db.scalar(&format!(
            "SELECT COUNT(*) FROM delivery_attempts WHERE event_id = '{paid_event}' AND status = 200"
        ))
        .await
            == 2
    })
    .await;
    assert_eq!(
        c.shop
            .scalar(&format!(
                "SELECT COUNT(*) FROM inbox WHERE webhook_id = '{paid_event}'"
            ))
            .await,
        1
    );
    go(&c, "/dashboard/events").await;
    c.wait_for("table").await;
    look(&c, "events").await;

    // A new signing secret, the old one signing beside it for 24 h: the shop, which still holds
    // the old one, keeps verifying every event (the next order's).
    go(&c, "/dashboard/webhooks").await;
    c.wait_for("#overlap").await;
    look(&c, "webhooks").await;
    submit(
        &c,
        "form[action='/dashboard/webhooks/secret']",
        "code.secret",
    )
    .await;
    let secret = c.text("code.secret").await.unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let second = c.shop_session("ORD-AFTER-ROLL", 20_000).await;
    let shopper = c.api().await;
    let paid = shopper
        .pay(
            &checkout_testkit::new_key(),
            &checkout_testkit::pay_session(&second),
        )
        .await;
    assert_eq!(paid.status, reqwest::StatusCode::CREATED, "{}", paid.body);
    let second_payment = paid.json()["payment_id"].as_str().unwrap().to_owned();
    shop_took(
        &c,
        &event_of(&c, &second_payment, "payment.succeeded").await,
    )
    .await;

    // Disabled: a refund's event waits; enabled: the shop takes it.
    go(&c, "/dashboard/webhooks").await;
    submit(&c, "form[action='/dashboard/webhooks/state']", "div.alert").await;
    c.wait_for_text("#endpoint-state", "отключена").await;
    look(&c, "webhooks-disabled").await;
    let refunded = c
        .shop_api()
        .refund(&second_payment, &checkout_testkit::new_key(), 5_000)
        .await;
    assert_eq!(refunded.status, reqwest::StatusCode::CREATED);
    let refund_event = event_of(&c, &second_payment, "refund.succeeded").await;
    assert_eq!(
        c.db.scalar_text(&format!(
            "SELECT status FROM webhook_events WHERE event_id = '{refund_event}'"
        ))
        .await,
        "no_endpoint"
    );
    submit(&c, "form[action='/dashboard/webhooks/state']", "p.notice").await;
    c.wait_for_text("#endpoint-state", "включена").await;
    shop_took(&c, &refund_event).await;

    // The team and the audit log say who did what.
    go(&c, "/dashboard/staff").await;
    c.wait_for("#email").await;
    look(&c, "staff").await;
    go(&c, "/dashboard/audit").await;
    c.wait_for_text("table", "вернул(а) деньги").await;
    look(&c, "audit").await;

    // «Выйти»: the sign-in page; the old cookie opens nothing.
    c.click_soon(".who button").await;
    c.wait_for("#email").await;
    look(&c, "sign-in").await;
    go(&c, "/dashboard").await;
    c.wait_for("form.stack").await;
    assert!(c.url().await.ends_with("/dashboard/sign-in"));
    assert_eq!(CART, 45_000);
    c
}
