//! The widget never loses or misreads an intent: each scenario is one way a shopper could pay
//! twice, or be told a paid order failed, with a widget that trusted its own state too much.

use crate::browser;

use std::time::Duration;

use browser::{CART, Checkout};
use checkout_testkit::{OPENING_BALANCE, wait_until};
use reqwest::StatusCode;

/// A key retention short enough to outlive within a test.
const SHORT_TTL: [(&str, &str); 2] = [("CHECKOUT_KEY_TTL_SECS", "2"), ("CHECKOUT_SWEEP_SECS", "1")];

scenario!(
    unreadable_state_during_a_lost_answer_recovers_the_receipt,
    "delay_after_commit_ms=1500",
    [Sqlite, Postgres]
);
scenario!(
    an_unreadable_state_whose_payment_never_arrived_waits_for_a_click,
    // Long enough for the reload to land before the commit even on a busy machine.
    "delay_before_commit_ms=4000",
    [Sqlite]
);
scenario!(
    a_payment_resumed_after_its_key_expired_shows_its_receipt,
    "delay_before_commit_ms=1000",
    env = super::SHORT_TTL,
    [Sqlite, Postgres]
);
scenario!(
    two_tabs_clicking_together_send_once_and_show_one_receipt,
    "delay_before_commit_ms=1500",
    [Sqlite, Postgres]
);
scenario!(
    a_dead_demo_session_is_replaced_and_the_shopper_reads_russian,
    "",
    [Sqlite]
);

/// Nothing the shopper saw was in English (server `detail` strings are English).
async fn assert_only_russian(c: &Checkout) {
    let statuses = c.statuses().await;
    let page = c.text(".checkout").await.unwrap_or_default();
    for text in statuses.iter().chain([&page]) {
        // Words of Latin letters, but not ids (`pay_0190…`, the shop's `ORD-KCPTBAQEP1`).
        let is_id = |token: &&str| {
            ["ORD-", "pay_", "rf_", "cs_"]
                .iter()
                .any(|p| token.starts_with(p))
        };
        let english = text
            .split_whitespace()
            .filter(|token| !is_id(token))
            .flat_map(|token| token.split(|ch: char| !ch.is_ascii_alphabetic()))
            .find(|word| word.len() >= 4 && !word.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(english.is_none(), "English reached the shopper: {text:?}");
    }
}

async fn unreadable_state_during_a_lost_answer_recovers_the_receipt(c: Checkout) -> Checkout {
    c.open().await;
    let key = c.payment_key().await;
    c.click("button.pay", 1).await;
    // The payment commits; its answer is held back.
    wait_until(
        "the payment never committed",
        Duration::from_secs(30),
        || async { c.payments_in_db().await == 1 },
    )
    .await;
    // A new release renamed a field of the saved state (or a write was cut short); the page
    // reloads, and the answer is lost with the old page.
    let state = c.state_key().await;
    c.js(&format!(
        "const s = sessionStorage.getItem({state:?});
         sessionStorage.setItem({state:?}, s.replace('\"payment\"', '\"payment_v9\"'));"
    ))
    .await;
    c.reload().await;
    c.wait_for_text(".notice", "Не удалось прочитать").await;
    let receipt = c.assert_paid_once().await;
    c.screenshot("seen-unreadable-state-recovered").await;
    assert_eq!(c.payments_in_db().await, 1, "no second debit");
    assert_eq!(
        c.payment_key().await,
        key,
        "the recovered intent kept its key"
    );
    let aside = c
        .js("return Object.keys(sessionStorage).filter(k => k.startsWith('checkout.state.unreadable')).map(k => sessionStorage.getItem(k));")
        .await;
    let aside = aside.as_array().cloned().unwrap_or_default();
    assert_eq!(aside.len(), 1, "the unreadable state is kept aside");
    assert!(aside[0].as_str().unwrap().contains(&key));
    assert!(!receipt.is_empty());
    assert_only_russian(&c).await;
    c
}

async fn an_unreadable_state_whose_payment_never_arrived_waits_for_a_click(
    c: Checkout,
) -> Checkout {
    c.open().await;
    let key = c.payment_key().await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".status", "Оплачиваем").await;
    // The reload cuts the request before its commit: the server drops it, nothing is paid.
    let state = c.state_key().await;
    c.js(&format!(
        "const s = sessionStorage.getItem({state:?});
         sessionStorage.setItem({state:?}, s.slice(0, s.length - 40));"
    ))
    .await;
    c.reload().await;
    c.wait_for_text(".notice", "Не удалось прочитать").await;
    // The server never knew the key: the intent waits for the shopper, with the same key.
    c.wait_for(browser::PAY_ENABLED).await;
    assert_eq!(c.payments_in_db().await, 0, "nothing was paid on its own");
    assert_eq!(c.payment_key().await, key);
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    assert_eq!(c.payment_key().await, key, "paid under the salvaged key");
    c
}

/// Waits until the server has forgotten `key` (it answers 404 about it to its shopper).
async fn wait_until_forgotten(api: &checkout_testkit::Api, key: &str) {
    wait_until("the key never expired", Duration::from_secs(30), || async {
        api.get(&format!("/api/idempotency-keys/{key}"))
            .await
            .status
            == StatusCode::NOT_FOUND
    })
    .await;
}

async fn a_payment_resumed_after_its_key_expired_shows_its_receipt(c: Checkout) -> Checkout {
    c.open().await;
    let key = c.payment_key().await;
    let api = c.api().await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".status", "Оплачиваем").await;
    // The shopper leaves mid-payment; the payment commits without them; the key expires.
    let order_page = c.url().await;
    c.browser.goto("about:blank").await.unwrap();
    wait_until(
        "the payment never committed",
        Duration::from_secs(30),
        || async { c.payments_in_db().await == 1 },
    )
    .await;
    wait_until_forgotten(&api, &key).await;
    // Back to the checkout: the pending intent is looked up, never taken for a failure.
    c.browser.goto(&order_page).await.unwrap();
    c.enter_widget().await;
    c.wait_for(".card").await;
    let receipt = c.wait_for_text(".payment-id", "pay_").await;
    assert_eq!(c.payments_in_db().await, 1);
    assert_eq!(api.balance().await, OPENING_BALANCE - CART);
    assert_eq!(
        c.count(".declined").await,
        0,
        "a paid order is never shown as declined"
    );
    let details = api.get(&format!("/api/payments/{receipt}")).await;
    assert_eq!(details.status, StatusCode::OK);
    c.db.assert_invariants_after_key_reuse().await;
    c
}

async fn two_tabs_clicking_together_send_once_and_show_one_receipt(c: Checkout) -> Checkout {
    c.open().await;
    let key = c.payment_key().await;
    let (first, second) = c.second_tab().await;
    c.wait_for("button.pay").await;
    c.click("button.pay", 1).await;
    c.browser.switch_to_window(first.clone()).await.unwrap();
    c.enter_widget().await;
    c.click("button.pay", 1).await;
    // This tab tells the other tab's story (its state arrived by broadcast); had its click
    // come first, it would be waiting for the other tab's lock, and say so.
    c.wait_for_text(".status", "Оплачиваем").await;
    c.screenshot("seen-second-tab-in-step").await;
    let receipt = c.assert_paid_once().await;
    c.browser.switch_to_window(second).await.unwrap();
    c.enter_widget().await;
    assert_eq!(
        c.wait_for_text(".payment-id", "pay_").await,
        receipt,
        "both tabs show one receipt"
    );
    assert_eq!(c.payment_key().await, key);
    assert_eq!(
        c.payment_outcomes(),
        ["first"],
        "one tab sent the payment; the other waited for it"
    );
    c
}

async fn a_dead_demo_session_is_replaced_and_the_shopper_reads_russian(c: Checkout) -> Checkout {
    c.open().await;
    // The shopper's session died (revoked, or the server's database was reset).
    c.js(
        "const s = JSON.parse(sessionStorage.getItem('checkout.session'));
         s.token = 'tok_dead';
         sessionStorage.setItem('checkout.session', JSON.stringify(s));",
    )
    .await;
    c.reload().await;
    c.click("button.pay", 1).await;
    c.assert_paid_once().await;
    c.wait_for_text(".notice", "демо-сессия").await;
    c.screenshot("seen-session-renewed").await;
    assert_only_russian(&c).await;
    c
}
