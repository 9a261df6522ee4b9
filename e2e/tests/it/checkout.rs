//! The proof, in a real browser, that a shopper who clicks «Оплатить» repeatedly, refreshes or
//! loses the network is charged exactly once. Every scenario buys in the demo shop, whose order
//! page embeds the widget (from the checkout's origin), and checks what the shopper sees, what
//! the ledger holds, and that the shop heard `checkout:paid` once and holds its order paid once.
//!
//! `drop_after_commit=N` hits the first N keyed requests in order: the first is the shop's own
//! session creation (which its server resends with the same key), the second the payment.

use crate::browser;

use browser::{CART, Checkout};
use checkout_testkit::OPENING_BALANCE;
use std::time::Duration;

use checkout_testkit::wait_until;
use reqwest::StatusCode;
use serde_json::json;

scenario!(double_click_pays_once, "", [Sqlite, Postgres]);
scenario!(burst_of_five_clicks_pays_once, "", [Sqlite]);
scenario!(
    refresh_mid_payment_resumes_the_same_key,
    "delay_before_commit_ms=1500",
    [Sqlite, Postgres]
);
scenario!(refresh_after_success_shows_the_same_receipt, "", [Sqlite]);
scenario!(
    lost_response_is_retried_and_replayed,
    "drop_after_commit=2",
    [Sqlite, Postgres]
);
scenario!(
    server_error_before_commit_runs_afresh,
    "fail_before_commit_per_key=1",
    [Sqlite]
);
scenario!(
    in_flight_duplicate_waits_for_the_first,
    "in_flight_claims=2",
    [Sqlite, Postgres]
);
scenario!(
    second_tab_with_the_same_order_ends_on_one_receipt,
    "delay_before_commit_ms=1500",
    [Sqlite, Postgres]
);
scenario!(
    decline_is_shown_kept_and_a_smaller_purchase_succeeds,
    "",
    [Sqlite]
);
scenario!(
    the_widget_pays_under_its_strict_content_security_policy,
    "",
    [Sqlite]
);
scenario!(
    a_session_paid_by_another_is_never_a_decline,
    "",
    [Sqlite, Postgres]
);
scenario!(
    tabs_of_one_session_opened_apart_pay_it_once,
    "delay_before_commit_ms=1000",
    [Sqlite, Postgres]
);
scenario!(
    an_unreadable_success_is_looked_up_and_shown_paid,
    "html_after_commit=1",
    [Sqlite]
);
scenario!(a_declined_shopper_pays_again_with_a_new_key, "", [Sqlite]);
scenario!(
    a_new_tab_asks_for_its_test_shopper_while_the_widget_loads,
    "",
    [Sqlite]
);
scenario!(
    server_killed_while_retrying_ends_on_one_receipt,
    "delay_after_commit_ms=2500",
    [Sqlite]
);

async fn double_click_pays_once(c: Checkout) -> Checkout {
    c.open().await;
    c.wait_for_text(".shop-name", "Продавец: Кофейня «Зерно»")
        .await;
    let key = c.payment_key().await;
    c.click("button.pay", 2).await;
    c.assert_paid_once().await;
    assert_eq!(c.payment_key().await, key, "the intent kept its key");
    c.assert_executed_once();
    c
}

async fn burst_of_five_clicks_pays_once(c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 5).await;
    c.assert_paid_once().await;
    c
}

async fn refresh_mid_payment_resumes_the_same_key(c: Checkout) -> Checkout {
    c.open().await;
    let key = c.payment_key().await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".status", "Оплачиваем").await;
    assert_eq!(
        c.payments_in_db().await,
        0,
        "the server is still holding the payment"
    );
    c.reload().await;
    let receipt = c.assert_paid_once().await;
    assert_eq!(
        c.payment_key().await,
        key,
        "the reload resent the same key, never a new one"
    );
    let saved = c.saved_state().await;
    assert_eq!(
        saved["payment"]["phase"]["succeeded"]["receipt"]["payment_id"],
        receipt.as_str()
    );
    c
}

async fn refresh_after_success_shows_the_same_receipt(c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 1).await;
    let receipt = c.assert_paid_once().await;
    let (key, order) = (
        c.payment_key().await,
        c.saved_state().await["payment"]["request"]["order_id"].clone(),
    );

    c.reload().await;
    assert_eq!(
        c.wait_for_text(".payment-id", "pay_").await,
        receipt,
        "the same receipt after a refresh"
    );
    assert_eq!(c.payment_outcomes().len(), 1, "the refresh sent nothing");
    c.assert_paid_once().await;

    // Buying again is a new order in the shop, a new session, a new key.
    assert_eq!(
        c.count("button.new-purchase").await,
        0,
        "no «Новая покупка» in a shop's page"
    );
    c.order(&[("chocolate", 1)]).await;
    let next = c.saved_state().await;
    assert_ne!(
        next["payment"]["key"].as_str().unwrap(),
        key,
        "a new purchase has a new key"
    );
    assert_ne!(
        next["payment"]["request"]["order_id"], order,
        "and a new order"
    );
    assert_eq!(
        c.payments_in_db().await,
        1,
        "starting a purchase moves no money"
    );
    c
}

async fn lost_response_is_retried_and_replayed(c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    c.assert_status_seen("Соединение потеряно, повторяем… (попытка 2)")
        .await;
    assert_eq!(
        c.payment_outcomes(),
        ["first", "replay"],
        "the retry got the stored response"
    );
    assert_eq!(
        c.session_outcomes(),
        ["first", "replay"],
        "the shop's server resent its session creation with the same key"
    );
    c
}

async fn server_error_before_commit_runs_afresh(c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    c.assert_status_seen("Сервер не ответил, повторяем… (попытка 2)")
        .await;
    // The 503 rolled everything back, so the retry was a first execution, not a replay.
    assert_eq!(c.payment_outcomes(), ["none", "first"]);
    assert_eq!(c.session_outcomes(), ["none", "first"]);
    assert_eq!(
        c.db.scalar("SELECT COUNT(*) FROM checkout_sessions").await,
        1,
        "one session for the order"
    );
    c
}

async fn in_flight_duplicate_waits_for_the_first(c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    c.assert_status_seen("Платёж выполняется, ждём…").await;
    assert_eq!(c.payment_outcomes(), ["conflict", "conflict", "first"]);
    c
}

async fn second_tab_with_the_same_order_ends_on_one_receipt(c: Checkout) -> Checkout {
    c.open().await;
    let key = c.payment_key().await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".status", "Оплачиваем").await;
    // A second tab opened from the first gets a copy of its sessionStorage: the same intent,
    // in flight. It resends the same key while the first tab's request is still executing.
    let first_tab = c.browser.window().await.unwrap();
    c.on_the_page("window.open(location.href, '_blank');").await;
    let second_tab = c
        .browser
        .windows()
        .await
        .unwrap()
        .into_iter()
        .find(|w| *w != first_tab)
        .expect("a second tab");
    c.browser.switch_to_window(second_tab).await.unwrap();
    c.enter_widget().await;
    let receipt = c.assert_paid_once().await;
    assert_eq!(
        c.payment_key().await,
        key,
        "the second tab used the first tab's key"
    );
    c.browser.switch_to_window(first_tab).await.unwrap();
    c.enter_widget().await;
    assert_eq!(
        c.wait_for_text(".payment-id", "pay_").await,
        receipt,
        "both tabs show the one receipt"
    );
    c.assert_executed_once();
    c
}

async fn decline_is_shown_kept_and_a_smaller_purchase_succeeds(c: Checkout) -> Checkout {
    c.open().await;
    // Spend most of the demo balance elsewhere first (the demo shop's 700,00 ₽ cart, paid
    // through the API): 300,00 ₽ are left.
    let api = c.api().await;
    let cart = api
        .send(api.post("/api/demo/checkout-session", None, &json!({"cart": 1})))
        .await
        .unwrap();
    assert_eq!(cart.status, StatusCode::CREATED, "{}", cart.body);
    let elsewhere = api
        .pay(
            "elsewhere",
            &json!({"checkout_session_id": cart.json()["session_id"]}),
        )
        .await;
    assert_eq!(elsewhere.status, StatusCode::CREATED);

    c.click("button.pay", 1).await;
    c.wait_for_text(
        ".declined",
        "Отказ: недостаточно средств (на счёте 300,00\u{a0}₽)",
    )
    .await;
    assert_eq!(
        c.payments_in_db().await,
        1,
        "only the payment made elsewhere"
    );

    // The same key again gives the same stored decline and moves nothing.
    let state = c.saved_state().await;
    let order = &state["payment"]["request"];
    let body = json!({"checkout_session_id": order["checkout_session_id"]});
    let again = api
        .pay(state["payment"]["key"].as_str().unwrap(), &body)
        .await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    c.reload().await;
    c.wait_for_text(".declined", "недостаточно средств").await;
    assert_eq!(api.balance().await, 30_000);

    // The shop's page heard the decline, and its order still waits.
    c.wait_for_order_state("Оплата не прошла").await;
    let declined_order = c.order_id().await;
    assert_eq!(
        c.shop
            .scalar(&format!("SELECT COUNT(*) FROM orders WHERE id = '{declined_order}' AND state = 'awaiting_payment'"))
            .await,
        1
    );

    // Paying again is a new order and a new intent: a grinder (700,00 ₽) is declined too,
    // three bars of chocolate (120,00 ₽) fit.
    c.order(&[("grinder", 1)]).await;
    c.wait_for_text(".total-amount", "700,00").await;
    c.click("button.pay", 1).await;
    c.wait_for(".declined").await;
    c.order(&[("chocolate", 3)]).await;
    c.wait_for_text(".total-amount", "120,00").await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".receipt-amount", "120,00").await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    c.assert_shop_order_paid(&paid).await;
    assert_eq!(api.balance().await, 30_000 - 12_000);
    assert_eq!(c.payments_in_db().await, 2);
    c.db.assert_invariants().await;
    c
}

async fn server_killed_while_retrying_ends_on_one_receipt(mut c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 1).await;
    // The payment commits; its answer is held back. Kill the server before it is sent.
    wait_until(
        "the payment never committed",
        Duration::from_secs(30),
        || async { c.payments_in_db().await > 0 },
    )
    .await;
    c.restart_server_on_same_port().await;
    c.assert_paid_once().await;
    let statuses = c.statuses().await;
    assert!(
        statuses
            .iter()
            .any(|s| s.starts_with("Соединение потеряно, повторяем…")),
        "{statuses:?}"
    );
    assert_eq!(
        c.payment_outcomes(),
        ["replay"],
        "the restarted server replayed the committed payment"
    );
    c
}

async fn the_widget_pays_under_its_strict_content_security_policy(c: Checkout) -> Checkout {
    // The payment page keeps its policy (framed by the demo shop's origin only)…
    let session = c.shop_session("ORD-CSP", 100).await;
    let page = c.server.api().get(&format!("/pay/{session}")).await;
    let policy = page.headers["content-security-policy"].clone();
    assert!(
        policy.contains("script-src 'self' 'wasm-unsafe-eval' 'sha256-"),
        "{policy}"
    );
    assert!(
        policy.contains(&format!("frame-ancestors {}", c.shop.base)),
        "{policy}"
    );
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    // …and the shop's page lets in the checkout's loader and frame, and nothing else of it.
    let shop_page = reqwest::get(format!("{}/", c.shop.base)).await.unwrap();
    let policy = shop_page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    let checkout = &c.server.base;
    assert!(
        policy.contains(&format!("script-src 'self' {checkout};")),
        "{policy}"
    );
    assert!(
        policy.contains(&format!("frame-src {checkout};")),
        "{policy}"
    );
    assert!(policy.contains("connect-src 'self';"), "{policy}");
    assert!(
        !policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"),
        "{policy}"
    );
    c.open().await;
    // The policies are in force in the browser: an inline script the shop's page did not ship
    // is refused…
    c.on_the_page(
        "window.__violations = [];
         document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));
         const s = document.createElement('script'); s.textContent = 'window.__injected = true;';
         document.body.appendChild(s);",
    )
    .await;
    wait_until(
        "the injected script was not reported",
        Duration::from_secs(10),
        || async {
            c.on_the_page("return window.__violations.length;")
                .await
                .as_u64()
                > Some(0)
        },
    )
    .await;
    assert_eq!(
        c.on_the_page("return window.__injected === undefined;")
            .await,
        json!(true)
    );
    // …while the widget, in its frame from the checkout's origin, works.
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    assert_eq!(
        c.on_the_page("return window.__violations;").await,
        json!(["script-src-elem"]),
        "nothing but the injected script broke the shop's policy"
    );
    c
}

/// What the shop's page heard (`window.shop.events`); none of it ever carries a balance.
async fn host_events(c: &Checkout) -> Vec<serde_json::Value> {
    let events = c.on_the_page("return window.shop.events;").await;
    assert!(
        !events.to_string().contains("balance"),
        "the shop's page never hears the shopper's balance: {events}"
    );
    events.as_array().cloned().unwrap_or_default()
}

/// The session is paid by another shopper while this one looks at «Оплатить»; the click finds
/// it paid: «Заказ уже оплачен», never «Платёж не прошёл», and the shop's page hears
/// `checkout:paid` (its order is paid), never `checkout:declined`. A reload says the same,
/// with no button. Before the fix: a decline, `checkout:declined`, «Оплата не прошла».
async fn a_session_paid_by_another_is_never_a_decline(c: Checkout) -> Checkout {
    c.open().await;
    let other = c.server.api().shopper().await;
    let theirs = other
        .pay(
            &checkout_testkit::new_key(),
            &checkout_testkit::pay_session(&c.session_id().await),
        )
        .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{}", theirs.body);
    let their_payment = theirs.json()["payment_id"].as_str().unwrap().to_owned();

    c.click("button.pay", 1).await;
    c.wait_for_text(".already-paid", "Заказ уже оплачен").await;
    assert_eq!(c.count(".declined").await, 0, "never a decline");
    c.wait_for_order_state("Заказ оплачен").await;
    let events = host_events(&c).await;
    assert!(
        events.iter().all(|e| e["name"] != "checkout:declined"),
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e["name"] == "checkout:paid")
            .count(),
        1
    );
    assert_eq!(events[0]["payment_id"], their_payment.as_str());
    assert_eq!(
        c.api().await.balance().await,
        OPENING_BALANCE,
        "nothing charged here"
    );
    assert_eq!(c.payments_in_db().await, 1);

    c.reload().await;
    c.wait_for_text(".already-paid", "Заказ уже оплачен").await;
    assert_eq!(c.count("button.pay").await, 0, "nothing to pay");
    c.screenshot("seen-already-paid").await;
    c.db.assert_invariants().await;
    c
}

/// Two tabs of one order opened apart (the second by its address, with its own storage, its
/// own shopper and its own intent) both click «Оплатить»: the session is paid once, one tab
/// shows the receipt, the other «Заказ уже оплачен»; neither shows a decline.
async fn tabs_of_one_session_opened_apart_pay_it_once(c: Checkout) -> Checkout {
    c.open().await;
    let url = c.url().await;
    let first = c.browser.window().await.unwrap();
    let second = c.browser.new_window(true).await.unwrap().handle;
    c.browser.switch_to_window(second.clone()).await.unwrap();
    c.browser.goto(&url).await.unwrap();
    c.enter_widget().await;
    c.wait_for(browser::PAY_ENABLED).await;
    c.click("button.pay", 1).await;
    c.browser.switch_to_window(first.clone()).await.unwrap();
    c.enter_widget().await;
    c.click("button.pay", 1).await;

    let mut shown = Vec::new();
    for tab in [&first, &second] {
        c.browser.switch_to_window(tab.clone()).await.unwrap();
        c.enter_widget().await;
        wait_until(
            "the tab never showed an outcome",
            Duration::from_secs(30),
            || async { c.count(".receipt").await + c.count(".already-paid").await > 0 },
        )
        .await;
        assert_eq!(c.count(".declined").await, 0, "never a decline");
        shown.push((c.count(".receipt").await, c.count(".already-paid").await));
    }
    shown.sort();
    assert_eq!(shown, [(0, 1), (1, 0)], "one receipt, one «already paid»");
    assert_eq!(c.payments_in_db().await, 1, "the session was paid once");
    c.db.assert_invariants().await;
    c
}

/// The payment's answer reaches the page as a proxy's HTML page with `200`: the money moved,
/// so the widget asks the key what became of it and shows the receipt. Before the fix:
/// «Платёж не прошёл: сервер прислал непонятный ответ».
async fn an_unreadable_success_is_looked_up_and_shown_paid(c: Checkout) -> Checkout {
    c.open().await;
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    c.assert_status_seen("Проверяем, прошёл ли платёж…").await;
    assert_eq!(c.payment_outcomes(), ["first"], "nothing was sent again");
    c
}

/// Declined for want of money, the shopper is offered to pay again; once money has come back
/// (the shop refunded an earlier purchase) «Оплатить снова» pays the same order under a new
/// key. The page heard the decline's code, then the payment, never a balance. Before the fix:
/// no way to pay the order again.
async fn a_declined_shopper_pays_again_with_a_new_key(c: Checkout) -> Checkout {
    c.open().await;
    let api = c.api().await;
    let cart = api
        .send(api.post("/api/demo/checkout-session", None, &json!({"cart": 1})))
        .await
        .unwrap();
    let elsewhere = api
        .pay(
            "elsewhere",
            &json!({"checkout_session_id": cart.json()["session_id"]}),
        )
        .await;
    assert_eq!(elsewhere.status, StatusCode::CREATED);
    c.click("button.pay", 1).await;
    c.wait_for_text(".declined", "недостаточно средств").await;
    c.wait_for_order_state("Оплата не прошла").await;
    let declined_key = c.payment_key().await;
    c.wait_for("button.pay-again").await;

    let refund = c
        .shop_api()
        .refund(
            elsewhere.json()["payment_id"].as_str().unwrap(),
            "give-back",
            70_000,
        )
        .await;
    assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
    c.click("button.pay-again", 1).await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    c.wait_for_text(".receipt-amount", "450,00").await;
    assert_ne!(
        c.payment_key().await,
        declined_key,
        "paying again is a new intent"
    );
    c.assert_shop_order_paid(&paid).await;
    assert_eq!(api.balance().await, OPENING_BALANCE - CART);
    let events = host_events(&c).await;
    let names: Vec<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["checkout:declined", "checkout:paid"]);
    assert_eq!(events[0]["detail"], json!({"code": "insufficient_funds"}));
    assert_eq!(
        events[1]["detail"],
        json!({"payment_id": paid, "amount": CART, "status": "succeeded"})
    );
    c.db.assert_invariants().await;
    c
}

/// A test session's first page in a tab needs a test shopper before «Оплатить» can be enabled.
/// The payment page asks for it while it is still being parsed, before the widget's code runs
/// (a module script runs only once parsing is done), and the widget takes that answer: one
/// request, started before the frame's `domInteractive` (before: the widget asked only once it
/// ran, after its WebAssembly, a round trip more to an enabled «Оплатить»). A reload keeps the
/// tab's shopper and asks for none.
async fn a_new_tab_asks_for_its_test_shopper_while_the_widget_loads(c: Checkout) -> Checkout {
    c.open().await;
    let timing = "const all = performance.getEntriesByType('resource');
         const asked = all.filter(e => e.name.endsWith('/api/test/shoppers'));
         const page = performance.getEntriesByType('navigation')[0];
         return { asked: asked.length, started: asked.length ? asked[0].startTime : null,
                  parsed: page.domInteractive, taken: !('checkoutTestShopper' in window) };";
    let seen = c.js(timing).await;
    assert_eq!(
        seen["asked"],
        json!(1),
        "one test shopper asked for: {seen}"
    );
    assert_eq!(
        seen["taken"],
        json!(true),
        "the widget took the page's request: {seen}"
    );
    let (started, parsed) = (
        seen["started"].as_f64().unwrap(),
        seen["parsed"].as_f64().unwrap(),
    );
    assert!(
        started < parsed,
        "asked while the page was parsed, before the widget ran: {seen}"
    );
    let token = c
        .js("return JSON.parse(sessionStorage.getItem('checkout.session')).token;")
        .await;
    assert!(token.is_string(), "the tab keeps its shopper: {token}");
    c.reload().await;
    c.wait_for(".balance").await;
    assert_eq!(
        c.js(timing).await["asked"],
        json!(0),
        "a reload asks for none"
    );
    assert_eq!(
        c.js("return JSON.parse(sessionStorage.getItem('checkout.session')).token;")
            .await,
        token
    );
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    c
}
