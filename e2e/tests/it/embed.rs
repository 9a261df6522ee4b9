//! The widget in a shop's page, as a shop embeds it: the page (on an origin of its own, served
//! here, `http://localhost:…`, another site than the checkout's `127.0.0.1`) adds the loader
//! and one element per checkout session; each gets the payment page in a frame of the
//! checkout's origin. What the page can learn is what the events carry: never the shopper's
//! credential, nor the balance.

use crate::browser;

use std::time::Duration;

use browser::{Checkout, PAY_ENABLED};
use checkout_testkit::{Backend, Shop, wait_until};
use serde_json::{Value, json};

/// The loader (a classic script), elements given as HTML, and a listener that writes down
/// every event the page hears (name, element, detail), in order.
fn shop_html(checkout: &str, body: &str) -> String {
    shop_html_loading(checkout, body, "")
}

/// The same, the loader loaded as `<script type="module">`.
fn shop_html_with_module(checkout: &str, body: &str) -> String {
    shop_html_loading(checkout, body, r#" type="module""#)
}

fn shop_html_loading(checkout: &str, body: &str, kind: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="ru"><head><meta charset="utf-8"><title>Книжная лавка</title>
<script>
window.heard = [];
for (const name of ["checkout:ready", "checkout:paid", "checkout:declined", "checkout:error"]) {{
  document.addEventListener(name, (event) =>
    window.heard.push({{ name, host: event.target.id, detail: event.detail }}));
}}
</script>
<script{kind} src="{checkout}/v1/checkout.js"></script></head>
<body><h1>Ваш заказ</h1>
{body}
</body></html>"#
    )
}

/// A shop's page on a server of its own: its origin, spelled `http://localhost:PORT` (another
/// site than the checkout's `127.0.0.1`, as a real shop is).
async fn serve_shop_page(html: String) -> String {
    on_another_site(checkout_testkit::serve_page(html).await)
}

/// A page served on loopback (`http://127.0.0.1:PORT`), spelled as another site than the
/// checkout's: `http://localhost:PORT`.
fn on_another_site(base: String) -> String {
    base.replace("127.0.0.1", "localhost")
}

/// The element `#a` holds its frame and nothing else (the shop's own content replaced whole),
/// and the frame offers «Оплатить».
async fn holds_its_frame_only(c: &Checkout) {
    assert_eq!(
        c.js("const a = document.querySelector('#a'); \
              return [a.children.length, a.firstElementChild.tagName, a.textContent];")
            .await,
        json!([1, "IFRAME", ""]),
        "the element holds its frame only"
    );
    c.enter_frame_in("#a").await;
    c.wait_for(PAY_ENABLED).await;
}

/// A checkout (SQLite), a shop, a session of 300,00 ₽ for `order` in element `#a` of a page of
/// the shop's (made by `html`) whose origin it registered; the scenario in the frame, with
/// «Оплатить» enabled. Also the page's address.
async fn one_frame(html: fn(&str, &str) -> String, order: &str) -> (Checkout, Shop, String) {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let session = shop.session(order, 30_000).await;
    let page = serve_shop_page(html(
        &c.server.base,
        &format!(r#"<div id="a" data-checkout-session="{session}"></div>"#),
    ))
    .await;
    register_origins(&c, &shop, &[&page]).await;
    c.browser.goto(&page).await.unwrap();
    c.enter_frame_in("#a").await;
    c.wait_for(PAY_ENABLED).await;
    (c, shop, page)
}

/// `shop set-origins`: the pages of `shop` that may frame its payment pages.
async fn register_origins(c: &Checkout, shop: &Shop, origins: &[&str]) {
    let mut args = vec!["shop", "set-origins", "--shop", shop.shop_id.as_str()];
    for origin in origins {
        args.extend(["--origin", origin]);
    }
    let (ok, out, err) = c.server.operator(&args).await;
    assert!(ok, "set-origins: {out} {err}");
}

/// What the page has heard so far, once it has heard `n` events named `name`.
async fn wait_for_heard(c: &Checkout, name: &str, n: usize) -> Vec<Value> {
    let count = format!("return window.heard.filter((e) => e.name === {name:?}).length;");
    let enough = || async { c.js(&count).await.as_u64().unwrap_or(0) as usize >= n };
    wait_until(
        &format!("the page never heard {n} × {name}"),
        browser::WAIT,
        enough,
    )
    .await;
    heard(c, name).await
}

async fn heard(c: &Checkout, name: &str) -> Vec<Value> {
    c.js(&format!(
        "return window.heard.filter((e) => e.name === {name:?});"
    ))
    .await
    .as_array()
    .cloned()
    .unwrap_or_default()
}

/// The frame in `host` is exactly as tall as the page in it (so it never scrolls inside), and
/// that height.
async fn frame_fits(c: &Checkout, host: &str) -> i64 {
    let outer = format!(
        "return Math.round(document.querySelector('{host} iframe').getBoundingClientRect().height);"
    );
    let deadline = std::time::Instant::now() + browser::WAIT;
    loop {
        c.enter_frame_in(host).await;
        let inner = c
            .js(
                "return [document.documentElement.scrollHeight, window.innerHeight, \
                 document.documentElement.scrollWidth, window.innerWidth];",
            )
            .await;
        c.on_top().await;
        let frame = c.js(&outer).await.as_i64().unwrap();
        let [content, viewport, wide, width] = [0, 1, 2, 3].map(|i| inner[i].as_i64().unwrap());
        if content == frame && content <= viewport {
            assert!(
                wide <= width,
                "{host}: the frame scrolls sideways ({wide} > {width})"
            );
            return frame;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{host}: the frame is {frame}px tall, its page {content}px (viewport {viewport}px)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_frames_for_two_sessions_on_one_shop_page_pay_independently() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let c = Checkout::start(backend, "", &[]).await;
        let shop = c.server.add_shop("Книжная лавка").await;
        let (first, second) = (
            shop.session("ORD-A", 30_000).await,
            shop.session("ORD-B", 12_000).await,
        );
        // One element found by the loader, one mounted by the page's own script.
        let page = serve_shop_page(shop_html(
            &c.server.base,
            &format!(
                r#"<div id="a" data-checkout-session="{first}"></div>
<div id="b"></div>
<script>Checkout.mount(document.getElementById("b"), {{ session: "{second}" }});</script>"#
            ),
        ))
        .await;
        register_origins(&c, &shop, &[&page]).await;
        c.browser.goto(&page).await.unwrap();
        wait_for_heard(&c, "checkout:ready", 2).await;
        // Mounting an element again is the same widget.
        let frames = c
            .js_async(&format!(
                "Checkout.mount(document.getElementById('a'), {{ session: '{first}' }}).then(() => \
                 done(document.querySelectorAll('#a iframe').length));"
            ))
            .await;
        assert_eq!(frames, json!(1));

        c.enter_frame_in("#a").await;
        c.wait_for_text(".total-amount", "300,00").await;
        c.wait_for_text(".shop-name", "Книжная лавка").await;
        c.wait_for(PAY_ENABLED).await;
        let form_height = frame_fits(&c, "#a").await;
        c.enter_frame_in("#a").await;
        c.click("button.pay", 2).await;
        let paid_a = c.wait_for_text(".payment-id", "pay_").await;
        let saved = c
            .js(&format!(
                "return sessionStorage.getItem('checkout.state.{first}');"
            ))
            .await;
        assert!(saved.as_str().is_some_and(|s| s.contains(first.as_str())));

        c.enter_frame_in("#b").await;
        c.wait_for_text(".total-amount", "120,00").await;
        assert_eq!(
            c.count(".payment-id").await,
            0,
            "the other widget did not pay"
        );
        c.wait_for(PAY_ENABLED).await;
        c.click("button.pay", 1).await;
        let paid_b = c.wait_for_text(".payment-id", "pay_").await;
        assert_ne!(paid_a, paid_b);

        // The receipt is taller than the form: the frame grew with it.
        c.on_top().await;
        let receipt_height = frame_fits(&c, "#a").await;
        assert!(
            receipt_height > form_height,
            "{receipt_height}px after paying, {form_height}px before"
        );
        frame_fits(&c, "#b").await;
        c.screenshot("seen-two-frames-in-a-shop-page").await;

        // The page heard each payment once, from its own element, with the receipt only.
        let paid = wait_for_heard(&c, "checkout:paid", 2).await;
        assert_eq!(paid.len(), 2, "{paid:?}");
        assert_eq!(paid[0]["host"], "a");
        assert_eq!(
            paid[0]["detail"],
            json!({"payment_id": paid_a, "amount": 30_000, "status": "succeeded"})
        );
        assert_eq!(paid[1]["host"], "b");
        assert_eq!(paid[1]["detail"]["payment_id"], paid_b.as_str());

        // After a refresh of the shop's page both receipts are back, nothing is sent again.
        c.browser.refresh().await.unwrap();
        c.enter_frame_in("#a").await;
        assert_eq!(c.wait_for_text(".payment-id", "pay_").await, paid_a);
        c.enter_frame_in("#b").await;
        assert_eq!(c.wait_for_text(".payment-id", "pay_").await, paid_b);
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

/// What the shopper's browser downloads, as Chromium counts it (Resource Timing's
/// `transferSize`, cold cache, compressed as the server sends it): the shop's page at most
/// 5 KB from the checkout to show the loader; the frame's WebAssembly and JavaScript at most
/// 100 KB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shops_page_downloads_under_5_kb_and_the_frame_under_100_kb() {
    let (c, _, _) = one_frame(shop_html, "ORD-SIZE").await;
    let sizes =
        "return performance.getEntriesByType('resource').map((r) => [r.name, r.transferSize]);";
    let bytes = |entries: &Value, ends: &[&str]| -> u64 {
        entries
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| ends.iter().any(|end| e[0].as_str().unwrap().ends_with(end)))
            .map(|e| e[1].as_u64().unwrap())
            .sum()
    };
    let frame = c.js(sizes).await;
    let widget = bytes(&frame, &[".wasm", ".js"]);
    c.on_top().await;
    let loader = bytes(&c.js(sizes).await, &["/v1/checkout.js"]);
    eprintln!("transferred: loader {loader} B, the frame's wasm + JS {widget} B");
    assert!(loader > 0 && loader <= 5_000, "the loader: {loader} B");
    assert!(
        widget > 50_000 && widget <= 100_000,
        "wasm + JS: {widget} B"
    );
    let _ = c.browser.close().await;
}

/// Whatever runs in the shop's page (its own scripts, a tag manager, an injected one) finds no
/// credential of the shopper's, cannot look into the frame, and cannot make it do anything or
/// make the page believe something happened: forged messages, from the page itself and from a
/// page of another origin, change nothing. The page hears one `checkout:paid`, with no balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shops_page_can_neither_read_the_shoppers_credential_nor_forge_an_outcome() {
    let (c, _, page) = one_frame(shop_html_with_module, "ORD-SAFE").await;
    let token = c
        .js("return JSON.parse(sessionStorage.getItem('checkout.session')).token;")
        .await;
    let token = token
        .as_str()
        .expect("the frame has the shopper's token")
        .to_owned();
    assert!(token.len() >= 32, "{token}");

    // Everything the shop's page can reach.
    c.on_top().await;
    let reach = c
        .js(r##"
            const dump = (s) => Object.keys(s).map((k) => `${k}=${s.getItem(k)}`).join("\n");
            const frame = document.querySelector("#a iframe");
            let inside;
            try { inside = frame.contentWindow.document.documentElement.outerHTML; }
            catch (error) { inside = error.name; }
            let storage;
            try { storage = frame.contentWindow.sessionStorage; } catch (error) { storage = error.name; }
            return { session: dump(sessionStorage), local: dump(localStorage), cookie: document.cookie,
                     inside, storage: String(storage), page: document.documentElement.outerHTML,
                     heard: JSON.stringify(window.heard) };
        "##)
        .await;
    assert_eq!(reach["inside"], "SecurityError", "{reach}");
    assert_eq!(reach["storage"], "SecurityError", "{reach}");
    for (what, text) in reach.as_object().unwrap() {
        let text = text.as_str().unwrap();
        assert!(!text.contains(&token), "the token is in the page's {what}");
        assert!(
            !text.contains("balance"),
            "a balance is in the page's {what}: {text}"
        );
    }

    // Forgeries from the shop's page: to the frame, and to itself as if from the frame.
    let forged_paid = json!({"type": "checkout:paid",
        "detail": {"payment_id": "pay_forged", "amount": 1, "status": "succeeded"}});
    c.js(&format!(
        r##"const frame = document.querySelector("#a iframe").contentWindow;
        for (const m of [{{type: "checkout:pay"}}, "pay", {forged_paid}, {{type: "checkout:resize", height: 5}}]) {{
          frame.postMessage(m, "*");
          window.postMessage(m, "*");
        }}"##
    ))
    .await;
    // From a page of another origin, which opens the shop's page and writes to it and its frame.
    let attacker = checkout_testkit::serve_page("<h1>Чужая страница</h1>".into()).await;
    let shop_tab = c.browser.window().await.unwrap();
    let attacker_tab = c.browser.new_window(true).await.unwrap();
    c.browser
        .switch_to_window(attacker_tab.handle)
        .await
        .unwrap();
    c.browser.goto(&attacker).await.unwrap();
    c.js_async(&format!(
        r#"const w = window.open({page:?}, "victim");
        const until = () => w.frames.length > 0 ? go() : setTimeout(until, 20);
        const go = () => setTimeout(() => {{
          for (const m of [{{type: "checkout:pay"}}, {forged_paid}]) {{
            w.frames[0].postMessage(m, "*");
            w.postMessage(m, "*");
          }}
          done(true);
        }}, 500);
        until();"#
    ))
    .await;
    c.browser.switch_to_window(shop_tab).await.unwrap();

    // Nothing changed: not paid, the form as it was, nothing heard but `ready`, full height.
    let sentinel = c
        .js_async(
            "window.addEventListener('message', (e) => e.data === 'sentinel' && done(true)); \
             window.postMessage('sentinel', '*');",
        )
        .await;
    assert_eq!(sentinel, json!(true));
    assert_eq!(heard(&c, "checkout:paid").await, Vec::<Value>::new());
    assert!(frame_fits(&c, "#a").await > 100);
    c.enter_frame_in("#a").await;
    c.wait_for(PAY_ENABLED).await;
    assert_eq!(c.count(".payment-id").await, 0);
    assert_eq!(c.payments_in_db().await, 0, "a message paid");

    // The shopper pays: one event, with exactly the receipt's three fields.
    c.click("button.pay", 1).await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    c.on_top().await;
    let heard_paid = wait_for_heard(&c, "checkout:paid", 1).await;
    c.js_async(&format!(
        "window.postMessage({forged_paid}, '*'); \
         window.addEventListener('message', (e) => e.data === 'sentinel' && done(true)); \
         window.postMessage('sentinel', '*');"
    ))
    .await;
    assert_eq!(heard(&c, "checkout:paid").await, heard_paid);
    assert_eq!(heard_paid.len(), 1, "{heard_paid:?}");
    assert_eq!(
        heard_paid[0]["detail"],
        json!({"payment_id": paid, "amount": 30_000, "status": "succeeded"})
    );
    assert_eq!(c.payments_in_db().await, 1);
    c.db.assert_invariants().await;
    let _ = c.browser.close().await;
}

/// The loader knows the checkout's origin from the server that sent it, not from the page: a
/// script element of another server's named like it (earlier in the page, never run) neither
/// gets the frame nor is believed when its look-alike page says the order is paid. As a
/// classic script and as a module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loader_believes_no_other_script_named_like_it() {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let look_alike = checkout_testkit::serve_page_at_every_path(
        r#"<!doctype html><title>Оплата</title><script>
for (const m of [{type: "checkout:ready"}, {type: "checkout:paid",
     detail: {payment_id: "pay_forged", amount: 30000, status: "succeeded"}}]) {
  parent.postMessage(m, "*");
}</script>"#
            .into(),
    )
    .await;
    for (order, kind) in [("ORD-DECOY-1", ""), ("ORD-DECOY-2", r#" type="module""#)] {
        let session = shop.session(order, 30_000).await;
        let html = shop_html_loading(
            &c.server.base,
            &format!(r#"<div id="a" data-checkout-session="{session}"></div>"#),
            kind,
        )
        .replacen(
            "<script",
            &format!(
                r#"<script type="text/x-decoy" src="{look_alike}/v1/checkout.js"></script><script"#
            ),
            1,
        );
        let page = serve_shop_page(html).await;
        register_origins(&c, &shop, &[&page]).await;
        c.browser.goto(&page).await.unwrap();
        let ready = wait_for_heard(&c, "checkout:ready", 1).await;
        let src = c
            .js("return document.querySelector('#a iframe').src;")
            .await;
        assert!(
            src.as_str()
                .unwrap()
                .starts_with(&format!("{}/pay/", c.server.base)),
            "{kind}: the frame is {src}"
        );
        assert_eq!(
            heard(&c, "checkout:paid").await,
            Vec::<Value>::new(),
            "{kind}"
        );
        assert_eq!(ready.len(), 1, "{kind}: {ready:?}");
        c.enter_frame_in("#a").await;
        c.wait_for(PAY_ENABLED).await;
        c.on_top().await;
    }
    assert_eq!(c.payments_in_db().await, 0);
    let _ = c.browser.close().await;
}

/// The loader in a shop page's `<head>` frames an element the moment the parser is past it, not
/// once the whole page is parsed: the frame loads while the rest of a (long) shop page is still
/// coming. The shop's script right after the element already finds the frame there; the
/// element's own content (a «Загружаем оплату…» of the shop's) is replaced whole, and the frame
/// offers «Оплатить».
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_is_made_as_soon_as_the_parser_is_past_its_element() {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let session = shop.session("ORD-EARLY", 30_000).await;
    let body = format!(
        r##"<div id="a" data-checkout-session="{session}"><p>Загружаем оплату…</p></div>
<script>window.framedWhileParsing = document.querySelectorAll("#a iframe").length;</script>
<p>Доставка: курьером, завтра.</p>"##
    );
    let page = serve_shop_page(shop_html(&c.server.base, &body)).await;
    register_origins(&c, &shop, &[&page]).await;
    c.browser.goto(&page).await.unwrap();
    assert_eq!(
        c.js("return window.framedWhileParsing;").await,
        json!(1),
        "the frame is there when the shop's next script runs"
    );
    holds_its_frame_only(&c).await;
    c.on_top().await;
    assert_eq!(wait_for_heard(&c, "checkout:ready", 1).await.len(), 1);
    let _ = c.browser.close().await;
}

/// An element whose content is still on its way waits for it: the shop's page here stops in
/// the middle of the element (its next part comes only once the page's script inside the
/// element has run), and the frame replaces the element's whole content once the parser is past
/// it, the «Загружаем оплату…» that came later included. Framed at once, the element would have
/// lost the script still to run (and the page its next part), and kept that text beside its
/// frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_element_still_being_parsed_is_framed_once_it_is_whole() {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let session = shop.session("ORD-STREAM", 30_000).await;
    let html = shop_html(
        &c.server.base,
        &format!(
            r#"<div id="a" data-checkout-session="{session}"><script>fetch("/rest");</script><!--rest--><span>Загружаем оплату…</span></div>
<p>Доставка: курьером, завтра.</p>"#
        ),
    );
    let (first, rest) = html.split_once("<!--rest-->").unwrap();
    let page =
        on_another_site(checkout_testkit::serve_page_in_two_parts(first.into(), rest.into()).await);
    register_origins(&c, &shop, &[&page]).await;
    // Were the page's next part never asked for, its load would never end: fail in seconds.
    c.browser
        .update_timeouts(fantoccini::wd::TimeoutConfiguration::new(
            None,
            Some(Duration::from_secs(15)),
            None,
        ))
        .await
        .unwrap();
    c.browser.goto(&page).await.expect("the whole page loads");
    holds_its_frame_only(&c).await;
    let _ = c.browser.close().await;
}

/// Only the pages a shop registered may frame its payment pages: on any other origin Chromium
/// refuses to show it (`frame-ancestors`), and the element hears `checkout:error`. Registering
/// the origin is what lets it in. A session that does not exist is said so to the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_the_shop_did_not_register_cannot_frame_its_payment_page() {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let session = shop.session("ORD-FRAME", 10_000).await;
    let unknown = format!("cs_{}", "0".repeat(32));
    let page = serve_shop_page(shop_html(
        &c.server.base,
        &format!(
            r#"<div id="a"></div><div id="u" data-checkout-session="{unknown}"></div>
<script>Checkout.mount(document.getElementById("a"), {{ session: "{session}", timeout: 4000 }});</script>"#
        ),
    ))
    .await;
    let registered = serve_shop_page(String::new()).await;
    register_origins(&c, &shop, &[&registered]).await;

    c.browser.goto(&page).await.unwrap();
    let errors = wait_for_heard(&c, "checkout:error", 2).await;
    let code_of = |host: &str| {
        errors
            .iter()
            .find(|e| e["host"] == host)
            .map(|e| e["detail"]["code"].clone())
    };
    assert_eq!(code_of("u"), Some(json!("not_found")), "{errors:?}");
    assert_eq!(code_of("a"), Some(json!("frame_unavailable")), "{errors:?}");
    let ready = heard(&c, "checkout:ready").await;
    assert!(ready.iter().all(|e| e["host"] != "a"), "{ready:?}");
    let frame = c.wait_for("#a iframe").await;
    frame.enter_frame().await.unwrap();
    let shown = c.js("return location.href;").await;
    assert!(
        shown.as_str().is_some_and(|s| !s.contains("/pay/")),
        "Chromium showed the payment page: {shown}"
    );
    assert_eq!(c.count(".checkout").await, 0);
    c.on_top().await;
    c.screenshot("seen-unregistered-origin").await;

    register_origins(&c, &shop, &[&registered, &page]).await;
    c.browser.refresh().await.unwrap();
    let ready = wait_for_heard(&c, "checkout:ready", 2).await;
    assert!(ready.iter().any(|e| e["host"] == "a"), "{ready:?}");
    let errors = wait_for_heard(&c, "checkout:error", 1).await;
    assert!(errors.iter().all(|e| e["host"] == "u"), "{errors:?}");
    c.enter_frame_in("#a").await;
    c.wait_for_text(".total-amount", "100,00").await;
    assert_eq!(c.payments_in_db().await, 0);
    let _ = c.browser.close().await;
}

/// The payment page as a full page (a shop that redirects instead of framing): it pays, says it
/// goes back, and goes back to the `return_url` the shop gave the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_page_flow_returns_the_shopper_to_the_shop_after_paying() {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let thanks = serve_shop_page("<h1>Спасибо за заказ</h1>".into()).await;
    let return_url = format!("{thanks}/?order=ORD-FULL");
    // The shop's pages are where its `return_url`s may lead.
    register_origins(&c, &shop, &[&thanks]).await;
    let made = shop
        .try_session(
            &checkout_testkit::new_key(),
            &json!({"order_id": "ORD-FULL", "amount": 25_000, "return_url": return_url}),
        )
        .await;
    assert_eq!(made.status, reqwest::StatusCode::CREATED, "{}", made.body);
    assert_eq!(made.json()["return_url"], return_url.as_str());
    let session = made.json()["session_id"].as_str().unwrap().to_owned();

    c.browser
        .goto(&format!("{}/pay/{session}", c.server.base))
        .await
        .unwrap();
    c.wait_for_text(".total-amount", "250,00").await;
    c.wait_for(PAY_ENABLED).await;
    c.click("button.pay", 1).await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    c.wait_for_text(".returning", "вернём вас в магазин").await;
    let link = c.wait_for("a.return").await;
    assert_eq!(
        link.attr("href").await.unwrap().as_deref(),
        Some(return_url.as_str())
    );
    c.screenshot("seen-full-page-paid").await;
    wait_until(
        "the page never went back to the shop",
        browser::WAIT,
        || async { c.url().await.starts_with(&thanks) },
    )
    .await;
    assert_eq!(c.url().await, return_url);
    c.wait_for_text("h1", "Спасибо за заказ").await;
    assert!(paid.starts_with("pay_"));
    assert_eq!(c.payments_in_db().await, 1);
    let _ = c.browser.close().await;
}

/// The demo shop's order page with the frame, as a phone (390 px) and a desktop show it: no
/// sideways scrolling anywhere, the frame as tall as its content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_page_with_the_frame_fits_a_phone_and_a_desktop() {
    let c = Checkout::start(Backend::Sqlite, "", &[]).await;
    c.browser.set_window_size(390, 844).await.unwrap();
    c.open().await;
    c.on_top().await;
    let fits = "return document.documentElement.scrollWidth <= window.innerWidth;";
    assert_eq!(
        c.js(fits).await,
        json!(true),
        "the shop's page scrolls sideways"
    );
    frame_fits(&c, "").await;
    c.screenshot("seen-order-page-phone").await;
    c.enter_widget().await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".payment-id", "pay_").await;
    c.on_top().await;
    frame_fits(&c, "").await;
    c.screenshot("seen-order-page-phone-paid").await;

    c.browser.set_window_size(1280, 900).await.unwrap();
    assert_eq!(c.js(fits).await, json!(true));
    frame_fits(&c, "").await;
    c.screenshot("seen-order-page-desktop-paid").await;
    let _ = c.browser.close().await;
}

/// axe-core, run inside the frame, finds nothing in each view the shopper can meet: the form,
/// paying (the answer held back by the server), paid, declined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axe_finds_no_violation_in_the_frame_idle_paying_paid_or_declined() {
    let c = Checkout::start(Backend::Sqlite, "delay_before_commit_ms=6000", &[]).await;
    let shop = c.server.add_shop("Книжная лавка").await;
    let (affordable, too_dear) = (
        shop.session("ORD-AXE", 30_000).await,
        shop.session("ORD-DEAR", checkout_testkit::OPENING_BALANCE + 1)
            .await,
    );
    let page = serve_shop_page(shop_html(
        &c.server.base,
        &format!(
            r#"<div id="a" data-checkout-session="{affordable}"></div>
<div id="b" data-checkout-session="{too_dear}"></div>"#
        ),
    ))
    .await;
    register_origins(&c, &shop, &[&page]).await;
    c.browser.goto(&page).await.unwrap();

    c.enter_frame_in("#a").await;
    c.wait_for(PAY_ENABLED).await;
    c.assert_accessible("idle").await;
    c.click("button.pay", 1).await;
    c.wait_for("button.pay[aria-busy='true']").await;
    c.assert_accessible("paying").await;
    assert_eq!(
        c.count("button.pay[aria-busy='true']").await,
        1,
        "the check ran while the payment was still held"
    );
    c.wait_for_text(".payment-id", "pay_").await;
    c.assert_accessible("paid").await;

    c.enter_frame_in("#b").await;
    c.wait_for(PAY_ENABLED).await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".decline-title", "Платёж не прошёл").await;
    c.assert_accessible("declined").await;
    let _ = c.browser.close().await;
}

/// Live money in the frame: the frame offers only «Войти», which opens the account window (a
/// tab of its own on the checkout's origin: the password and the code are never typed in the
/// shop's frame). There the shopper signs up («Создать счёт», then the code the mail brought),
/// declines a passkey for now, and the window closes: the frame is signed in. The operator
/// funds the shopper (the same deposit sent twice is one); «Выйти» in the frame (that sign-in's
/// token is refused from then on); «Войти» again with the password, and pay a live session:
/// one debit, the shop's live account credited, its live event says `livemode: true`, the page
/// hears one `checkout:paid`. A test session's frame says it is test money; a live one does not.
async fn a_live_shopper_pays_a_live_session_in_the_frame(backend: Backend) {
    let c = Checkout::start(backend, "", &[]).await;
    let shop = c.server.add_shop("Живая лавка").await;
    let live = live_session(&shop, "LIVE-FRAME", 45_000).await;
    let test = shop.session("TEST-FRAME", 10_000).await;
    let page = serve_shop_page(shop_html(
        &c.server.base,
        &format!(
            r#"<div id="a" data-checkout-session="{live}"></div><div id="t" data-checkout-session="{test}"></div>"#
        ),
    ))
    .await;
    register_origins(&c, &shop, &[&page]).await;
    c.browser.goto(&page).await.unwrap();

    // The test frame says so; the live one offers «Войти» (a link to the account window) and no
    // «Оплатить», and no field to type a secret into.
    c.enter_frame_in("#t").await;
    let said = c
        .js("return getComputedStyle(document.querySelector('.card'), '::before').content;")
        .await;
    assert!(said.as_str().unwrap().contains("Тестовый режим"), "{said}");
    c.enter_frame_in("#a").await;
    c.wait_for("a.sign-in-open").await;
    let said = c
        .js("return getComputedStyle(document.querySelector('.card'), '::before').content;")
        .await;
    assert_eq!(said, json!("none"));
    assert_eq!(c.count("button.pay").await, 0);
    assert_eq!(c.count("input").await, 0, "no field in the shop's frame");
    c.assert_accessible("live-sign-in").await;
    c.on_top().await;
    c.screenshot("live-frame-sign-in").await;
    c.enter_frame_in("#a").await;

    // «Войти»: the account window, top-level on the checkout's origin.
    let email = "mila@example.ru";
    let password = "пароль-надёжный";
    let shop_window = c.enter_window_opened_by("a.sign-in-open").await;
    c.wait_for("#account-email").await;
    assert_eq!(c.url().await, format!("{}/account", c.server.base));
    c.type_into("#account-email", email).await;
    c.type_into("#account-password", password).await;
    let mailbox = checkout_testkit::mail::receiver();
    c.click_soon(".sign-up").await;
    // The code arrives by mail (a real SMTP server), and only it makes the account.
    c.wait_for("#account-code").await;
    let mail = mailbox.nth_mail(email, Some(&c.server.mail_from), 1).await;
    let code = mail.code().expect("the mail carries the code");
    c.type_into("#account-code", &code).await;
    c.click_soon(".confirm-submit").await;
    // Signed in: a passkey for this device is offered; not now.
    c.wait_for(".skip-passkey").await;
    c.click_soon(".skip-passkey").await;
    c.after_window_closes(shop_window.clone()).await;
    c.enter_frame_in("#a").await;
    c.wait_for(".sign-out").await;
    c.wait_for_text(".balance", "0,00").await;
    c.assert_accessible("live-signed-in").await;
    c.on_top().await;
    for (size, width, height) in [("phone", 390, 844), ("desktop", 1280, 800)] {
        c.browser.set_window_size(width, height).await.unwrap();
        c.screenshot(&format!("seen-live-frame-signed-in-{size}"))
            .await;
    }
    c.browser.set_window_size(520, 900).await.unwrap();
    c.enter_frame_in("#a").await;
    let first_token = c
        .js("return JSON.parse(sessionStorage.getItem('checkout.live')).token;")
        .await
        .as_str()
        .unwrap()
        .to_owned();

    // «Выйти»: «Войти» again, and that token no longer works.
    c.click_soon(".sign-out").await;
    c.wait_for("a.sign-in-open").await;
    let old = checkout_testkit::Api {
        token: Some(first_token),
        ..c.server.api()
    };
    old.get("/api/account")
        .await
        .assert_problem(401, "unauthorized");

    // The operator funds the shopper: sent twice under one key, one deposit.
    let key = checkout_testkit::new_key();
    for _ in 0..2 {
        let (ok, deposit) = c.server.deposit(email, 150_000, &key).await;
        assert!(ok, "{deposit}");
        assert_eq!(deposit["balance"], 150_000);
    }
    assert_eq!(c.db.scalar("SELECT COUNT(*) FROM deposits").await, 1);

    // «Войти» with the password, and pay.
    c.enter_window_opened_by("a.sign-in-open").await;
    c.wait_for("#account-email").await;
    c.type_into("#account-email", email).await;
    c.type_into("#account-password", password).await;
    c.click_soon(".sign-in-submit").await;
    c.wait_for(".skip-passkey").await;
    c.click_soon(".skip-passkey").await;
    c.after_window_closes(shop_window).await;
    c.enter_frame_in("#a").await;
    c.wait_for_text(".balance", "1 500,00").await;
    c.wait_for(PAY_ENABLED).await;
    c.click("button.pay", 1).await;
    let paid = c.wait_for_text(".payment-id", "pay_").await;
    c.wait_for_text(".balance", "1 050,00").await;
    c.on_top().await;
    c.screenshot("live-frame-paid").await;
    c.enter_frame_in("#a").await;
    c.on_top().await;
    let heard_paid = wait_for_heard(&c, "checkout:paid", 1).await;
    assert_eq!(heard_paid.len(), 1, "{heard_paid:?}");
    assert_eq!(heard_paid[0]["host"], "a");
    let livemode =
        c.db.scalar(&format!(
            "SELECT livemode FROM payments WHERE payment_id = '{paid}'"
        ))
        .await;
    assert_eq!(livemode, 1);
    let account = shop.live_api.get("/api/account").await;
    assert_eq!(account.json()["balance"], 45_000);
    let events = shop.live_api.get("/api/events").await.json();
    assert_eq!(events["events"][0]["body"]["livemode"], true);
    assert_eq!(
        events["events"][0]["body"]["data"]["payment_id"],
        paid.as_str()
    );
    assert_eq!(c.payments_in_db().await, 1);
    c.db.assert_invariants().await;
    let _ = c.browser.close().await;
}

/// A live checkout session of `shop`'s, for `order`: its id.
async fn live_session(shop: &Shop, order: &str, amount: i64) -> String {
    let made = shop
        .live_api
        .send(shop.live_api.post(
            "/api/checkout-sessions",
            Some(&checkout_testkit::new_key()),
            &json!({"order_id": order, "amount": amount}),
        ))
        .await
        .unwrap();
    assert_eq!(made.status.as_u16(), 201, "{}", made.body);
    made.json()["session_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_shopper_pays_a_live_session_in_the_frame_sqlite() {
    a_live_shopper_pays_a_live_session_in_the_frame(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_shopper_pays_a_live_session_in_the_frame_postgres() {
    a_live_shopper_pays_a_live_session_in_the_frame(Backend::Postgres).await;
}

/// What a person sees of a view of the account window: axe-core finds nothing, and it is
/// photographed on a phone (390 px) and a desktop.
async fn account_view_seen(c: &Checkout, view: &str) {
    c.assert_accessible(view).await;
    for (size, width, height) in [("phone", 390, 844), ("desktop", 1280, 800)] {
        c.browser.set_window_size(width, height).await.unwrap();
        let fits = "return document.documentElement.scrollWidth <= window.innerWidth;";
        assert_eq!(
            c.js(fits).await,
            json!(true),
            "{view} scrolls sideways ({size})"
        );
        c.screenshot(&format!("seen-{view}-{size}")).await;
    }
    c.browser.set_window_size(520, 900).await.unwrap();
}

/// Passkeys, with Chromium's virtual authenticators (one per tab, as Chromium scopes them; the
/// checkout at `http://localhost`, the passkeys' relying party, the shop at `127.0.0.1`):
/// 1. as a full page, a shopper signs up with no password (the code from the mail), makes a
///    passkey on device A, and is back on the payment page, signed in;
/// 2. in a shop's frame (its storage is the shop site's: not signed in there), «Войти» opens the
///    account window, and device A's passkey signs in with nothing typed; the frame, reloaded,
///    is still signed in, and pays;
/// 3. on a second device B (no passkey), «Забыли пароль?» and the mailed code sign in and make a
///    second passkey (in the page's other frame): the account has two, and every sign-in before
///    the recovery has ended.
async fn passkeys_sign_up_and_sign_in_with_nothing_typed(backend: Backend) {
    let c = Checkout::start(backend, "", &[]).await;
    let checkout = on_another_site(c.server.base.clone());
    let shop = c.server.add_shop("Ключница").await;
    let full = live_session(&shop, "PK-FULL", 10_000).await;
    let framed = live_session(&shop, "PK-FRAME", 20_000).await;
    let later = live_session(&shop, "PK-LATER", 5_000).await;
    let page = checkout_testkit::serve_page(shop_html(
        &checkout,
        &format!(
            r#"<div id="a" data-checkout-session="{framed}"></div><div id="b" data-checkout-session="{later}"></div>"#
        ),
    ))
    .await;
    register_origins(&c, &shop, &[&page]).await;
    let email = "kira@example.ru";
    let mailbox = checkout_testkit::mail::receiver();
    let from = Some(c.server.mail_from.as_str());

    // 1. Sign-up with a passkey, as a full page.
    c.browser
        .goto(&format!("{checkout}/pay/{full}"))
        .await
        .unwrap();
    c.wait_for("a.sign-in-open").await;
    let device_a = c.add_authenticator().await;
    c.click_soon("a.sign-in-open").await;
    c.wait_for("#account-email").await;
    assert!(
        c.url()
            .await
            .starts_with(&format!("{checkout}/account?return=")),
        "{}",
        c.url().await
    );
    account_view_seen(&c, "account-sign-in").await;
    c.type_into("#account-email", email).await;
    c.click_soon(".sign-up-passkey").await;
    c.wait_for("#account-code").await;
    let code = mailbox.nth_mail(email, from, 1).await.code().unwrap();
    account_view_seen(&c, "account-code").await;
    c.type_into("#account-code", &code).await;
    c.click_soon(".confirm-submit").await;
    c.wait_for(".make-passkey").await;
    account_view_seen(&c, "account-offer-passkey").await;
    c.click_soon(".make-passkey").await;
    c.wait_for(".sign-out").await;
    assert_eq!(c.url().await, format!("{checkout}/pay/{full}"));
    c.wait_for_text(".balance", "0,00").await;
    let kept = c.authenticator_credentials(&device_a).await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["isResidentCredential"], true);
    assert_eq!(kept[0]["rpId"], "localhost");
    let first_token = c
        .js("return JSON.parse(sessionStorage.getItem('checkout.live')).token;")
        .await
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, deposit) = c
        .server
        .deposit(email, 50_000, &checkout_testkit::new_key())
        .await;
    assert!(ok, "{deposit}");

    // 2. In a shop's frame: the same passkey (device A's, in the account window's tab).
    c.browser.goto(&page).await.unwrap();
    c.enter_frame_in("#a").await;

    c.wait_for("a.sign-in-open").await;
    let shop_window = c.enter_window_opened_by("a.sign-in-open").await;
    c.wait_for(".passkey-sign-in").await;
    assert_eq!(c.url().await, format!("{checkout}/account"));
    let tab_of_a = c.add_authenticator().await;
    c.add_credential(&tab_of_a, &kept[0]).await;
    c.click_soon(".passkey-sign-in").await;
    c.after_window_closes(shop_window.clone()).await;
    c.enter_frame_in("#a").await;
    c.wait_for_text(".balance", "500,00").await;
    c.on_top().await;
    c.browser.refresh().await.unwrap();
    c.enter_frame_in("#a").await;
    c.wait_for_text(".balance", "500,00").await;
    c.wait_for(PAY_ENABLED).await;
    c.click("button.pay", 1).await;
    c.wait_for_text(".payment-id", "pay_").await;
    c.wait_for_text(".balance", "300,00").await;

    // 3. A second device: recovery by the mailed code, and a new passkey there (in the other
    // frame, whose session is still open: a paid one offers no «Войти»).
    c.enter_frame_in("#b").await;
    c.wait_for(".sign-out").await;
    c.click_soon(".sign-out").await;
    c.wait_for("a.sign-in-open").await;
    c.enter_window_opened_by("a.sign-in-open").await;
    c.add_authenticator().await;
    c.wait_for(".forgot").await;
    c.click_soon(".forgot").await;
    c.wait_for(".recovery-submit").await;
    account_view_seen(&c, "account-recovery").await;
    c.type_into("#account-email", email).await;
    c.click_soon(".recovery-submit").await;
    c.wait_for(".recover-with-passkey").await;
    let code = mailbox.nth_mail(email, from, 2).await.code().unwrap();
    account_view_seen(&c, "account-recovery-code").await;
    c.type_into("#account-code", &code).await;
    c.click_soon(".recover-with-passkey").await;
    c.wait_for(".make-passkey").await;
    c.click_soon(".make-passkey").await;
    c.after_window_closes(shop_window).await;
    c.enter_frame_in("#b").await;
    c.wait_for_text(".balance", "300,00").await;
    let token = c
        .js("return JSON.parse(sessionStorage.getItem('checkout.live')).token;")
        .await;
    let now = checkout_testkit::Api {
        token: Some(token.as_str().unwrap().to_owned()),
        ..c.server.api()
    };
    let passkeys = now.get("/api/shoppers/passkeys").await.json();
    let passkeys = passkeys["passkeys"].as_array().unwrap();
    assert_eq!(passkeys.len(), 2, "{passkeys:?}");
    assert!(passkeys[0]["last_used_at"].is_string(), "{passkeys:?}");
    let before = checkout_testkit::Api {
        token: Some(first_token),
        ..c.server.api()
    };
    before
        .get("/api/account")
        .await
        .assert_problem(401, "unauthorized");
    assert_eq!(c.payments_in_db().await, 1);
    c.db.assert_invariants().await;
    let _ = c.browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passkeys_sign_up_and_sign_in_with_nothing_typed_sqlite() {
    passkeys_sign_up_and_sign_in_with_nothing_typed(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passkeys_sign_up_and_sign_in_with_nothing_typed_postgres() {
    passkeys_sign_up_and_sign_in_with_nothing_typed(Backend::Postgres).await;
}
