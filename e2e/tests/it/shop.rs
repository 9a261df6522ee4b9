//! The demo shop as its staff and its server use the checkout: the storefront's session
//! creation survives failures (same key, one session), and the back office refunds once however
//! often a refund is submitted or its answer is lost.

use crate::browser;

use std::time::Duration;

use browser::{CART, Checkout};
use checkout_testkit::{OPENING_BALANCE, wait_until};

scenario!(
    back_office_refund_submitted_twice_credits_once,
    "",
    [Sqlite, Postgres]
);
scenario!(
    every_lost_answer_on_the_way_is_resent_with_its_key,
    // The shop's session creation, the shopper's payment, the shop's refund: each commits and
    // its answer is cut.
    "drop_after_commit=3",
    [Sqlite, Postgres]
);
scenario!(
    a_shopper_who_leaves_before_the_answer_still_has_the_order_paid_by_webhook,
    // The payment commits; its answer is held back long enough for the shopper to leave.
    "delay_after_commit_ms=3000",
    [Sqlite, Postgres]
);
scenario!(
    the_back_office_needs_a_sign_in_and_takes_no_post_from_another_site,
    "",
    [Sqlite]
);
scenario!(
    a_refund_whose_answer_is_lost_is_retried_with_its_own_key,
    // Each first execution's answer waits 3 s: time to kill the checkout after the refund's
    // commit, before its answer. The checkout does not send the shop its events here (they
    // would settle the refund too): only «Повторить» can.
    "delay_after_commit_ms=3000",
    env = [("CHECKOUT_DEMO_SHOP_WEBHOOK_URL", "")],
    [Sqlite]
);
scenario!(
    a_refund_whose_answer_is_lost_is_settled_by_the_checkouts_event,
    "delay_after_commit_ms=3000",
    env = [("CHECKOUT_DEMO_SHOP_WEBHOOK_URL", "")],
    [Sqlite]
);
scenario!(
    storefront_session_survives_a_failed_attempt_and_a_checkout_that_is_down,
    "fail_before_commit_per_key=1",
    [Sqlite]
);

/// Pays the usual cart in the widget and returns the order and its payment.
async fn paid_order(c: &Checkout) -> (String, String) {
    c.open().await;
    c.click("button.pay", 1).await;
    let payment = c.assert_paid_once().await;
    (c.order_id().await, payment)
}

/// The back office (signed in), with the order's row.
async fn back_office(c: &Checkout, order: &str) {
    c.back_office().await;
    c.wait_for(&format!("tr[id='{order}']")).await;
}

async fn refunds_in_db(c: &Checkout) -> i64 {
    c.db.scalar("SELECT COUNT(*) FROM refunds").await
}

async fn back_office_refund_submitted_twice_credits_once(c: Checkout) -> Checkout {
    let (order, payment) = paid_order(&c).await;
    let api = c.api().await;
    back_office(&c, &order).await;
    let row = format!("tr[id='{order}']");
    assert_eq!(
        c.text(&format!("{row} .payment")).await.as_deref(),
        Some(payment.as_str())
    );

    // A double click on «Вернуть» (two clicks in one task: the button cannot disable itself
    // in between).
    c.type_into(&format!("{row} input[name=amount]"), "100")
        .await;
    c.click(&format!("{row} button.refund"), 2).await;
    c.wait_for_text(&format!("{row} .refunded"), "100,00").await;
    assert_eq!(refunds_in_db(&c).await, 1, "one refund");
    assert_eq!(api.balance().await, OPENING_BALANCE - CART + 10_000);

    // The same form submitted twice at once, as two requests racing to the shop's server: both
    // carry the form's key; the checkout refunds once.
    c.type_into(&format!("{row} input[name=amount]"), "50,5")
        .await;
    let statuses = c
        .js_async(&format!(
            "const form = document.querySelector({:?});
             const send = () => fetch(form.action, {{method: 'POST', body: new URLSearchParams(new FormData(form))}})
               .then(r => r.status);
             Promise.all([send(), send()]).then(done);",
            format!("{row} form.refund-form")
        ))
        .await;
    assert_eq!(
        statuses,
        serde_json::json!([200, 200]),
        "both ended on the back office"
    );
    c.browser.refresh().await.unwrap();
    c.wait_for_text(&format!("{row} .refunded"), "150,50").await;
    assert_eq!(refunds_in_db(&c).await, 2, "two refunds for two forms");
    assert_eq!(api.balance().await, OPENING_BALANCE - CART + 15_050);
    assert_eq!(
        c.shop
            .scalar("SELECT COUNT(*) FROM refunds WHERE state = 'succeeded'")
            .await,
        2
    );
    assert_eq!(
        c.refund_outcomes().iter().filter(|o| *o == "first").count(),
        2,
        "{:?}",
        c.refund_outcomes()
    );
    c.screenshot("seen-back-office-after-refunds").await;
    c.db.assert_invariants().await;

    // The payment as the checkout tells the shop: two refunds, 150,50 ₽.
    let details = c.shop_api().get(&format!("/api/payments/{payment}")).await;
    assert_eq!(details.json()["refunded_total"], 15_050);
    c
}

async fn every_lost_answer_on_the_way_is_resent_with_its_key(c: Checkout) -> Checkout {
    let (order, _payment) = paid_order(&c).await;
    assert_eq!(c.session_outcomes(), ["first", "replay"]);
    assert_eq!(c.payment_outcomes(), ["first", "replay"]);
    back_office(&c, &order).await;
    let row = format!("tr[id='{order}']");
    c.type_into(&format!("{row} input[name=amount]"), "450")
        .await;
    c.click(&format!("{row} button.refund"), 1).await;
    c.wait_for_text(&format!("{row} .refunded"), "450,00").await;
    c.wait_for_text(&row, "Возвращён полностью").await;
    assert_eq!(
        c.refund_outcomes(),
        ["first", "replay"],
        "the shop resent the refund with its key and got the stored answer"
    );
    assert_eq!(refunds_in_db(&c).await, 1);
    assert_eq!(c.api().await.balance().await, OPENING_BALANCE);
    c.db.assert_invariants().await;
    c
}

async fn a_shopper_who_leaves_before_the_answer_still_has_the_order_paid_by_webhook(
    c: Checkout,
) -> Checkout {
    c.open().await;
    let order = c.order_id().await;
    c.click("button.pay", 1).await;
    checkout_testkit::wait_until("the payment never committed", browser::WAIT, || async {
        c.payments_in_db().await == 1
    })
    .await;
    // The tab is gone before the answer arrives: no page will ever tell the shop.
    c.browser.goto("about:blank").await.unwrap();
    let paid_by_webhook = format!(
        "SELECT COUNT(*) FROM orders WHERE id = '{order}' AND state = 'paid' AND paid_via = 'webhook'"
    );
    checkout_testkit::wait_until(
        "the shop never learned of the payment",
        browser::WAIT,
        || async { c.shop.scalar(&paid_by_webhook).await == 1 },
    )
    .await;
    back_office(&c, &order).await;
    let row = format!("tr[id='{order}']");
    c.wait_for_text(&row, "Оплачен · из уведомления кассы")
        .await;
    assert_eq!(
        c.text(&format!("{row} .bonus")).await.as_deref(),
        Some("45 б.")
    );
    assert_eq!(
        c.count("tr.inbox-entry").await,
        1,
        "one event, applied once"
    );
    c.wait_for_text("tr.inbox-entry", &order).await;
    c.screenshot("seen-back-office-paid-by-webhook").await;
    c.db.assert_invariants().await;
    c
}

async fn storefront_session_survives_a_failed_attempt_and_a_checkout_that_is_down(
    mut c: Checkout,
) -> Checkout {
    // The first attempt fails before its commit; the shop's server resends the same key.
    c.open().await;
    assert_eq!(c.session_outcomes(), ["none", "first"]);
    let first_order = c.order_id().await;
    let session = c.session_id().await;
    assert_eq!(
        c.shop
            .text(&format!(
                "SELECT checkout_session_id FROM orders WHERE id = '{first_order}'"
            ))
            .await
            .as_deref(),
        Some(session.as_str())
    );
    assert_eq!(
        c.db.scalar("SELECT COUNT(*) FROM checkout_sessions").await,
        1
    );

    // The checkout is down for longer than the shop's retries: the order stands, its page
    // offers to try again, and trying again once the checkout is back opens its one session.
    c.server.kill();
    c.browser.goto(&format!("{}/", c.shop.base)).await.unwrap();
    c.type_into("input[name=qty_chocolate]", "2").await;
    c.click("button.checkout", 1).await;
    c.wait_for_text(".error", "Не удалось начать оплату").await;
    c.screenshot("seen-storefront-checkout-down").await;
    assert_eq!(c.count("[data-checkout-session]").await, 0);
    c.restart_server_on_same_port().await;
    c.click("form button.primary", 1).await;
    c.enter_widget().await;
    c.wait_for(".checkout .balance").await;
    c.wait_for_text(".total-amount", "80,00").await;
    c.wait_for(browser::PAY_ENABLED).await;
    c.click("button.pay", 1).await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    c.assert_shop_order_paid(&paid).await;
    assert_eq!(
        c.db.scalar("SELECT COUNT(*) FROM checkout_sessions").await,
        2,
        "one session per order"
    );
    c.db.assert_invariants().await;
    c
}

/// The back office is for signed-in staff, and its forms carry the sign-in's CSRF token; a page
/// on another site that auto-posts a refund (the staff member signed in, in the same browser)
/// is refused, and no money moves. Before the fix there was no sign-in, and such a page
/// refunded the whole order.
async fn the_back_office_needs_a_sign_in_and_takes_no_post_from_another_site(
    c: Checkout,
) -> Checkout {
    let (order, _payment) = paid_order(&c).await;
    c.browser
        .goto(&format!("{}/admin", c.shop.base))
        .await
        .unwrap();
    assert!(c.url().await.ends_with("/admin/login"), "sign in first");
    c.type_into("input[name=password]", "не тот пароль").await;
    c.click("form.login button", 1).await;
    c.wait_for_text(".error", "Неверный пароль").await;
    back_office(&c, &order).await;

    // Another site's page posts a full refund of the order to the back office: cross-site
    // (localhost is another site than 127.0.0.1), then same-site on another port.
    let forged = |shop: &str| {
        format!(
            r#"<!doctype html><html><body><form method="post" action="{shop}/admin/orders/{order}/refunds">
<input name="amount" value="450"><input name="key" value="{}"><input name="csrf" value="guess">
</form><script>document.forms[0].submit()</script></body></html>"#,
            checkout_testkit::new_key()
        )
    };
    let site = checkout_testkit::serve_page(forged(&c.shop.base)).await;
    for attacker in [site.replace("127.0.0.1", "localhost"), site.clone()] {
        c.browser.goto(&attacker).await.unwrap();
        c.wait_for_text(".error", "другого сайта").await;
    }
    assert_eq!(refunds_in_db(&c).await, 0, "no refund was made");
    assert_eq!(c.shop.scalar("SELECT COUNT(*) FROM refunds").await, 0);

    // Not from a browser: without the sign-in, or without the form's token, nothing either.
    let http = reqwest::Client::new();
    let refund = |cookie: Option<String>| {
        let mut request = http
            .post(format!("{}/admin/orders/{order}/refunds", c.shop.base))
            .form(&[("amount", "450"), ("key", &checkout_testkit::new_key())]);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };
    assert_eq!(refund(None).await.unwrap().status(), 403);
    let signed_in = c.shop.staff_cookie().await;
    assert_eq!(
        refund(Some(signed_in)).await.unwrap().status(),
        403,
        "no CSRF token"
    );
    assert_eq!(refunds_in_db(&c).await, 0);

    // Signing out ends the sign-in.
    back_office(&c, &order).await;
    c.click("form.logout button", 1).await;
    c.wait_for("form.login").await;
    c.browser
        .goto(&format!("{}/admin", c.shop.base))
        .await
        .unwrap();
    assert!(c.url().await.ends_with("/admin/login"));
    c
}

/// A refund commits at the checkout, whose answer never reaches the shop (the checkout dies
/// first, for longer than the shop's retries): the request stays waiting, with its key. The
/// back office offers «Повторить» with that key and takes no other refund of the order
/// meanwhile. Before the fix, reloading it offered a fresh form (a new key: a second refund).
async fn pending_refund(c: &mut Checkout) -> String {
    let (order, _payment) = paid_order(c).await;
    back_office(c, &order).await;
    let row = format!("tr[id='{order}']");
    c.type_into(&format!("{row} input[name=amount]"), "100")
        .await;
    c.click_soon(&format!("{row} button.refund")).await;
    wait_until(
        "the refund never committed",
        Duration::from_secs(30),
        || async { refunds_in_db(c).await == 1 },
    )
    .await;
    c.server.kill();
    c.wait_for_text(".error", "не отвечает").await;
    back_office(c, &order).await;
    c.wait_for_text(&format!("{row} .refund-pending"), "ждёт ответа кассы")
        .await;
    assert_eq!(
        c.count(&format!("{row} form.refund-form")).await,
        0,
        "no new refund meanwhile"
    );
    assert_eq!(c.count(&format!("{row} button.retry-refund")).await, 1);
    // Nor behind the page's back: another key for the order is refused.
    let refused = c
        .js_async(&format!(
            "const form = document.querySelector({:?});
             const body = new URLSearchParams(new FormData(form)); body.set('key', crypto.randomUUID());
             fetch(form.action, {{method: 'POST', body}}).then(r => r.status).then(done);",
            format!("{row} form.retry-refund-form")
        ))
        .await;
    assert_eq!(refused, serde_json::json!(409));
    assert_eq!(c.shop.scalar("SELECT COUNT(*) FROM refunds").await, 1);
    order
}

async fn a_refund_whose_answer_is_lost_is_retried_with_its_own_key(mut c: Checkout) -> Checkout {
    let order = pending_refund(&mut c).await;
    // Back, but not telling the shop (its events wait): only «Повторить» can settle it.
    c.restart_server(false).await;
    let row = format!("tr[id='{order}']");
    c.click(&format!("{row} button.retry-refund"), 1).await;
    c.wait_for_text(&format!("{row} .refunded"), "100,00").await;
    assert_eq!(c.count(&format!("{row} .refund-pending")).await, 0);
    assert_eq!(refunds_in_db(&c).await, 1, "one refund");
    // (A `401` may come first: the restarted checkout gave the shop a new key.)
    let outcomes: Vec<String> = c
        .refund_outcomes()
        .into_iter()
        .filter(|o| o != "none")
        .collect();
    assert_eq!(outcomes, ["replay"], "its own key, its stored answer");
    assert_eq!(
        c.shop
            .scalar("SELECT COUNT(*) FROM refunds WHERE state = 'succeeded'")
            .await,
        1
    );
    assert_eq!(
        c.api().await.balance().await,
        OPENING_BALANCE - CART + 10_000
    );
    c.db.assert_invariants().await;
    c
}

async fn a_refund_whose_answer_is_lost_is_settled_by_the_checkouts_event(
    mut c: Checkout,
) -> Checkout {
    let order = pending_refund(&mut c).await;
    // Back, and telling the shop: its `refund.succeeded` settles the waiting request.
    c.restart_server(true).await;
    wait_until("the event never settled the refund", Duration::from_secs(30), || async {
        c.shop.scalar("SELECT COUNT(*) FROM refunds WHERE state = 'succeeded' AND refund_id IS NOT NULL").await == 1
    })
    .await;
    back_office(&c, &order).await;
    let row = format!("tr[id='{order}']");
    c.wait_for_text(&format!("{row} .refunded"), "100,00").await;
    assert_eq!(c.count(&format!("{row} button.retry-refund")).await, 0);
    assert_eq!(
        c.count(&format!("{row} form.refund-form")).await,
        1,
        "refunds are taken again"
    );
    assert_eq!(refunds_in_db(&c).await, 1, "one refund");
    c.db.assert_invariants().await;
    c
}
