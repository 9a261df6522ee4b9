//! The proof, in a real browser, that a shopper who clicks «Оплатить» repeatedly, refreshes or
//! loses the network is charged exactly once. Every scenario buys in the demo shop, whose order
//! page embeds the widget (from the checkout's origin), and checks what the shopper sees, what
//! the ledger holds, and that the shop heard `checkout:paid` once and holds its order paid once.
//!
//! `drop_after_commit=N` hits the first N keyed requests in order: the first is the shop's own
//! session creation (which its server resends with the same key), the second the payment.

#[macro_use]
mod browser;

use browser::Checkout;
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
    c.js("window.open(location.href, '_blank');").await;
    let second_tab = c
        .browser
        .windows()
        .await
        .unwrap()
        .into_iter()
        .find(|w| *w != first_tab)
        .expect("a second tab");
    c.browser.switch_to_window(second_tab).await.unwrap();
    let receipt = c.assert_paid_once().await;
    assert_eq!(
        c.payment_key().await,
        key,
        "the second tab used the first tab's key"
    );
    c.browser.switch_to_window(first_tab).await.unwrap();
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
    c.wait_for_text("#order-state", "Оплата не прошла").await;
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
    // The widget's own page keeps its policy…
    let page = c.server.api().get("/").await;
    let policy = page.headers["content-security-policy"].clone();
    assert!(
        policy.contains("script-src 'self' 'wasm-unsafe-eval' 'sha256-"),
        "{policy}"
    );
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    // …and the shop's page lets in the checkout's origin and nothing else.
    let shop_page = reqwest::get(format!("{}/", c.shop.base)).await.unwrap();
    let policy = shop_page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    let checkout = &c.server.base;
    assert!(
        policy.contains(&format!("script-src 'self' {checkout} 'wasm-unsafe-eval';")),
        "{policy}"
    );
    assert!(
        policy.contains(&format!("connect-src 'self' {checkout};")),
        "{policy}"
    );
    assert!(
        !policy.contains("unsafe-inline") && !policy.contains(" 'unsafe-eval'"),
        "{policy}"
    );
    c.open().await;
    // The policy is in force in the browser: an inline script the page did not ship is refused…
    c.js(
        "window.__violations = [];
         document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));
         const s = document.createElement('script'); s.textContent = 'window.__injected = true;';
         document.body.appendChild(s);",
    )
    .await;
    wait_until(
        "the injected script was not reported",
        Duration::from_secs(10),
        || async { c.js("return window.__violations.length;").await.as_u64() > Some(0) },
    )
    .await;
    assert_eq!(
        c.js("return window.__injected === undefined;").await,
        json!(true)
    );
    // …while the widget, loaded from the checkout's origin, works.
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    assert_eq!(
        c.js("return window.__violations;").await,
        json!(["script-src-elem"]),
        "nothing but the injected script broke the policy"
    );
    c
}
