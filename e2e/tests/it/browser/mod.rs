//! A shopper in a real browser: Debian's headless Chromium driven through chromedriver (started
//! here on a free port), buying in the demo shop (its own process and database), whose order
//! page frames the checkout's payment page (the release-built widget, served by a
//! checkout-server with fault injection, on another origin). The scenario works inside that
//! frame ([`Checkout::enter_widget`]) and steps out to the shop's page for what the shop shows
//! ([`Checkout::on_the_page`]). A failing scenario leaves a screenshot under
//! `target/e2e-screenshots/`.
//!
//! Shared by the test binaries `checkout` and `intents`; each uses part of it.
#![allow(dead_code)]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use checkout_testkit::{Api, Backend, DemoShop, OPENING_BALANCE, Server, TestDb};
use fantoccini::{Client, Locator};
use futures::FutureExt;
use serde_json::Value;

pub const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-faults");
pub const SHOP: &str = env!("CARGO_BIN_EXE_demo-shop-for-tests");

/// The demo shop's cart every scenario buys unless it says otherwise (2 × 150,00 ₽ + 150,00 ₽).
pub const CART_ITEMS: [(&str, u32); 2] = [("ethiopia", 2), ("filters", 1)];

/// The first demo cart: 2 × 150,00 ₽ + 150,00 ₽.
pub const CART: i64 = 45_000;

/// One test per backend for a scenario `async fn name(c: Checkout) -> Checkout`, on a server
/// with these faults (and, optionally, more settings).
macro_rules! scenario {
    ($name:ident, $faults:expr, [$($backend:ident),+]) => {
        scenario!($name, $faults, env = [], [$($backend),+]);
    };
    ($name:ident, $faults:expr, env = $env:expr, [$($backend:ident),+]) => {
        mod $name {
            $(
                #[allow(non_snake_case)]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $backend() {
                    let backend = checkout_testkit::Backend::$backend;
                    super::Checkout::run(
                        stringify!($name), backend, $faults, &$env, super::$name,
                    )
                    .await;
                }
            )+
        }
    };
}
pub const WAIT: Duration = Duration::from_secs(30);

/// The pay button, ready to be clicked (it is `aria-disabled` while it waits, keeping focus).
pub const PAY_ENABLED: &str = "button.pay:not([aria-disabled='true'])";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The release build of the widget, which the server serves at `/`.
fn dist() -> String {
    let dist = workspace().join("dist");
    assert!(
        dist.join("index.html").exists(),
        "no widget build in {}: run scripts/test, which builds it first",
        dist.display()
    );
    dist.display().to_string()
}

/// One scenario's world: a database, a checkout server over it, the demo shop, a browser.
pub struct Checkout {
    pub db: TestDb,
    pub server: Server,
    pub shop: DemoShop,
    pub browser: Client,
    /// Where the demo checkout writes the demo shop's credentials, for the shop to read.
    credentials: Arc<tempfile::TempDir>,
    /// Shared with [`Checkout::run`], so that a failed scenario can still be photographed.
    chromium: Arc<checkout_testkit::chromium::Chromium>,
    /// The shopper's token as last read in the widget's frame.
    shopper_token: std::sync::Mutex<Option<String>>,
}

impl Checkout {
    pub async fn start(backend: Backend, faults: &str, env: &[(&str, &str)]) -> Checkout {
        let db = TestDb::new(backend).await;
        let credentials = Arc::new(tempfile::tempdir().unwrap());
        // The checkout's address is fixed first (the shop calls it); the shop starts next, on
        // a port of its own, and reads the credentials the checkout writes once it needs them;
        // then the checkout starts, sending the shop's webhooks to it.
        let checkout_port = checkout_testkit::postgres::free_port().to_string();
        let shop = DemoShop::start(
            SHOP,
            &format!("http://127.0.0.1:{checkout_port}"),
            &credentials.path().join(CREDENTIALS),
            &[],
        )
        .await;
        // The checkout sends the shop its events unless the scenario says it must not (the
        // setting given empty): then they wait in its outbox.
        let webhook_url = format!("{}/webhooks/checkout", shop.base);
        let mut env: Vec<(&str, &str)> = env.to_vec();
        if !env
            .iter()
            .any(|(k, _)| *k == "CHECKOUT_DEMO_SHOP_WEBHOOK_URL")
        {
            env.push(("CHECKOUT_DEMO_SHOP_WEBHOOK_URL", &webhook_url));
        }
        env.retain(|(k, v)| !(*k == "CHECKOUT_DEMO_SHOP_WEBHOOK_URL" && v.is_empty()));
        // The shop's order page frames the payment page: its origin is registered, whether or
        // not it hears webhooks.
        env.push(("CHECKOUT_DEMO_SHOP_ORIGIN", &shop.base));
        let server =
            start_server(&db, faults, Some(&checkout_port), &env, credentials.path()).await;
        let (chromium, browser) = checkout_testkit::chromium::open(520, 900).await;
        Checkout {
            db,
            server,
            shop,
            credentials,
            browser,
            chromium,
            shopper_token: Default::default(),
        }
    }

    /// Runs a scenario on a server with these faults and settings (`CHECKOUT_*`); if it fails,
    /// saves what the shopper saw and the server's log.
    pub async fn run<F, Fut>(
        name: &str,
        backend: Backend,
        faults: &str,
        env: &[(&str, &str)],
        scenario: F,
    ) where
        F: FnOnce(Checkout) -> Fut,
        Fut: Future<Output = Checkout>,
    {
        let checkout = Checkout::start(backend, faults, env).await;
        let browser = checkout.browser.clone();
        let log = checkout.server.log_handle();
        let shop_log = checkout.shop.log_handle();
        let _keep_alive = checkout.chromium.clone();
        match AssertUnwindSafe(scenario(checkout)).catch_unwind().await {
            Ok(checkout) => {
                let _ = checkout.browser.close().await;
            }
            Err(panic) => {
                let dir = workspace().join("target/e2e-screenshots");
                let _ = std::fs::create_dir_all(&dir);
                let file = dir.join(format!("{name}-{backend:?}.png"));
                if let Ok(png) = browser.screenshot().await {
                    let _ = std::fs::write(&file, png);
                    eprintln!("screenshot of the failure: {}", file.display());
                }
                eprintln!("server log:\n{}", log());
                eprintln!("demo shop log:\n{}", shop_log());
                let _ = browser.close().await;
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// Saves what the shopper sees now under `target/e2e-screenshots/<name>.png`, to be looked at.
    pub async fn screenshot(&self, name: &str) {
        let dir = workspace().join("target/e2e-screenshots");
        let _ = std::fs::create_dir_all(&dir);
        if let Ok(png) = self.browser.screenshot().await {
            let _ = std::fs::write(dir.join(format!("{name}.png")), png);
        }
    }

    /// The order page the shopper is on (where the widget is).
    pub async fn url(&self) -> String {
        self.browser.current_url().await.unwrap().to_string()
    }

    /// Buys the usual cart: the storefront, «Оформить заказ», the order page with the widget,
    /// which has a shopper and a balance.
    pub async fn open(&self) {
        self.order(&CART_ITEMS).await;
    }

    /// Orders these `(product, quantity)` in the storefront and waits on the order page until
    /// the widget (in its frame, which the scenario is in afterwards) shows the order and the
    /// shopper's balance.
    pub async fn order(&self, cart: &[(&str, u32)]) {
        self.on_top().await;
        self.browser
            .goto(&format!("{}/", self.shop.base))
            .await
            .unwrap();
        self.wait_for("button.checkout").await;
        for (product, quantity) in cart {
            self.type_into(&format!("input[name=qty_{product}]"), &quantity.to_string())
                .await;
        }
        self.click("button.checkout", 1).await;
        self.enter_widget().await;
        self.wait_for(".checkout .balance").await;
        self.wait_for(PAY_ENABLED).await;
        self.record_statuses().await;
    }

    /// Into the payment page's frame on the shop's page (the first one, or the one in the
    /// element `host`).
    pub async fn enter_widget(&self) {
        self.enter_frame_in("").await;
    }

    /// Into the frame inside the element matching `host` (`#a`), or the first frame.
    pub async fn enter_frame_in(&self, host: &str) {
        self.on_top().await;
        let frame = self.wait_for(format!("{host} iframe").trim_start()).await;
        frame.enter_frame().await.expect("into the widget's frame");
        self.wait_for(".checkout").await;
    }

    /// Out of any frame, into the page the tab shows.
    pub async fn on_top(&self) {
        self.browser
            .enter_frame(None)
            .await
            .expect("to the top page");
    }

    /// Runs `script` in the shop's page (outside the widget's frame), then steps back into it.
    pub async fn on_the_page(&self, script: &str) -> Value {
        self.on_top().await;
        let value = self.js(script).await;
        self.enter_widget().await;
        value
    }

    /// The checkout session the widget pays (in its frame: `/pay/{session_id}`).
    pub async fn session_id(&self) -> String {
        self.js(
            "return location.pathname.startsWith('/pay/') ? location.pathname.slice(5) \
             : document.querySelector('[data-checkout-session]').dataset.checkoutSession;",
        )
        .await
        .as_str()
        .expect("a widget")
        .to_owned()
    }

    /// Where the widget keeps its state in `sessionStorage`: under its session.
    pub async fn state_key(&self) -> String {
        format!("checkout.state.{}", self.session_id().await)
    }

    /// A refresh of the shop's page (the frame comes back with it); then back in the widget.
    pub async fn reload(&self) {
        self.on_top().await;
        self.browser.refresh().await.unwrap();
        self.enter_widget().await;
        self.wait_for(".card").await;
        self.record_statuses().await;
    }

    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        match self
            .browser
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
        {
            Ok(element) => element,
            Err(error) => panic!("{css} never appeared: {error}"),
        }
    }

    /// Waits until the element's text contains `expected`. WebDriver reports no-break spaces
    /// as plain ones, so both sides are compared that way.
    pub async fn wait_for_text(&self, css: &str, expected: &str) -> String {
        let expected = expected.replace('\u{a0}', " ");
        let expected = expected.as_str();
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.text(css).await.unwrap_or_default();
            if text.contains(expected) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{css} never said {expected:?}; it says {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn text(&self, css: &str) -> Option<String> {
        let element = self.browser.find(Locator::Css(css)).await.ok()?;
        element.text().await.ok().map(|t| t.replace('\u{a0}', " "))
    }

    pub async fn count(&self, css: &str) -> usize {
        self.browser
            .find_all(Locator::Css(css))
            .await
            .map(|v| v.len())
            .unwrap_or(0)
    }

    pub async fn js(&self, script: &str) -> Value {
        self.browser
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Runs `script`, which ends by calling `done(value)`; returns that value.
    pub async fn js_async(&self, script: &str) -> Value {
        let script = format!("const done = arguments[arguments.length - 1];\n{script}");
        self.browser
            .execute_async(&script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// The API as the demo shop, with the secret key the checkout gave it at its last start.
    pub fn shop_api(&self) -> Api {
        let text = std::fs::read_to_string(self.credentials.path().join(CREDENTIALS)).unwrap();
        let credentials: Value = serde_json::from_str(&text).unwrap();
        Api {
            token: Some(credentials["secret_key"].as_str().unwrap().to_owned()),
            ..self.server.api()
        }
    }

    /// A new session of the demo shop (made through the API with its secret key): its id.
    pub async fn shop_session(&self, order_id: &str, amount: i64) -> String {
        let api = self.shop_api();
        let made = api
            .send(api.post(
                "/api/checkout-sessions",
                Some(&checkout_testkit::new_key()),
                &checkout_testkit::session_request(order_id, amount),
            ))
            .await
            .unwrap();
        assert_eq!(made.status, reqwest::StatusCode::CREATED, "{}", made.body);
        made.json()["session_id"].as_str().unwrap().to_owned()
    }

    /// Clicks `times` times within one JavaScript task: no re-render happens in between, so
    /// the button's own disabling cannot be what keeps the payment single.
    pub async fn click(&self, css: &str, times: usize) {
        self.js(&format!(
            "const b = document.querySelector({css:?}); for (let i = 0; i < {times}; i++) b.click();"
        ))
        .await;
    }

    /// Clicks once, a moment after this command has returned: for a form whose submission
    /// navigates, which chromedriver would otherwise wait out (the whole answer) before
    /// returning, had the navigation begun within the command.
    pub async fn click_soon(&self, css: &str) {
        self.js(&format!(
            "setTimeout(() => document.querySelector({css:?}).click(), 300);"
        ))
        .await;
    }

    /// Sets an input's value as typing would, so that the widget's `input` handler sees it.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.js(&format!(
            "const i = document.querySelector({css:?}); i.value = {text:?};
             i.dispatchEvent(new Event('input', {{bubbles: true}}));"
        ))
        .await;
    }

    /// Every text the status lines showed from now on, in order (kept by the page itself).
    async fn record_statuses(&self) {
        self.js(
            "window.__statuses = [];
             const seen = () => document.querySelectorAll('.status').forEach(e => {
               const t = e.textContent; const all = window.__statuses;
               if (t && all[all.length - 1] !== t) all.push(t);
             });
             new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
             seen();",
        )
        .await;
    }

    pub async fn statuses(&self) -> Vec<String> {
        let all: Vec<String> =
            serde_json::from_value(self.js("return window.__statuses || [];").await).unwrap();
        all.into_iter().map(|t| t.replace('\u{a0}', " ")).collect()
    }

    /// The widget's saved state, as it is in `sessionStorage` (inside its versioned envelope).
    pub async fn saved_state(&self) -> Value {
        let key = self.state_key().await;
        let text = self
            .js(&format!("return sessionStorage.getItem({key:?});"))
            .await;
        let saved: Value = serde_json::from_str(text.as_str().expect("a saved state")).unwrap();
        match saved.get("checkout") {
            Some(checkout) => checkout.clone(),
            None => saved,
        }
    }

    pub async fn payment_key(&self) -> String {
        self.saved_state().await["payment"]["key"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The API as this shopper: to check what the ledger holds. The token is the widget's (in
    /// its frame); elsewhere (the back office), the one last seen there.
    pub async fn api(&self) -> Api {
        let session = self
            .js("return sessionStorage.getItem('checkout.session');")
            .await;
        let token = match session.as_str() {
            Some(text) => {
                let session: Value = serde_json::from_str(text).unwrap();
                let token = session["token"].as_str().unwrap().to_owned();
                *self.shopper_token.lock().unwrap() = Some(token.clone());
                token
            }
            None => self
                .shopper_token
                .lock()
                .unwrap()
                .clone()
                .expect("a shopper seen in the widget"),
        };
        Api {
            token: Some(token),
            ..self.server.api()
        }
    }

    pub async fn payments_in_db(&self) -> i64 {
        self.db.scalar("SELECT COUNT(*) FROM payments").await
    }

    /// What every scenario ends with: one payment of the cart, the receipt on screen, the
    /// ledger consistent. Returns the payment's id.
    pub async fn assert_paid_once(&self) -> String {
        let payment_id = self.wait_for_text(".payment-id", "pay_").await;
        assert_eq!(self.count(".receipt").await, 1, "one receipt");
        assert_eq!(
            self.wait_for_text(".receipt-amount", "450,00").await,
            "450,00 ₽"
        );
        let api = self.api().await;
        assert_eq!(api.balance().await, OPENING_BALANCE - CART, "debited once");
        let payment = api.get(&format!("/api/payments/{payment_id}")).await;
        assert_eq!(payment.status, reqwest::StatusCode::OK);
        assert_eq!(payment.json()["amount"], CART);
        assert_eq!(self.payments_in_db().await, 1);
        self.db.assert_invariants().await;
        self.assert_shop_order_paid(&payment_id).await;
        payment_id
    }

    /// The host page heard `checkout:paid` once, with this payment, and the shop, having asked
    /// the checkout itself, holds its order paid by it, once.
    pub async fn assert_shop_order_paid(&self, payment_id: &str) {
        self.on_top().await;
        self.wait_for_text("#order-state", "Заказ оплачен").await;
        let events = self.js("return window.shop.events;").await;
        self.enter_widget().await;
        let paid: Vec<&Value> = events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "checkout:paid")
            .collect();
        assert_eq!(paid.len(), 1, "one checkout:paid for the page: {events}");
        assert_eq!(paid[0]["payment_id"], payment_id);
        let order = self.order_id().await;
        assert_eq!(
            self.shop
                .text(&format!(
                    "SELECT payment_id FROM orders WHERE id = '{order}' AND state = 'paid'"
                ))
                .await
                .as_deref(),
            Some(payment_id),
            "the shop's order is paid by this payment"
        );
        assert_eq!(
            self.shop
                .scalar(&format!(
                    "SELECT COUNT(*) FROM orders WHERE payment_id = '{payment_id}'"
                ))
                .await,
            1
        );
    }

    /// The shop's order on the page.
    pub async fn order_id(&self) -> String {
        self.on_the_page("return document.querySelector('[data-order]').dataset.order;")
            .await
            .as_str()
            .expect("an order page")
            .to_owned()
    }

    /// The shop's page says this of its order (`#order-state`).
    pub async fn wait_for_order_state(&self, expected: &str) {
        self.on_top().await;
        self.wait_for_text("#order-state", expected).await;
        self.enter_widget().await;
    }

    /// The server executed the payment once; every other copy that reached it was a replay or
    /// found the key in flight.
    pub fn assert_executed_once(&self) {
        let outcomes = self.payment_outcomes();
        assert_eq!(
            outcomes.iter().filter(|o| *o == "first").count(),
            1,
            "{outcomes:?}"
        );
    }

    /// The shopper saw this status line at some point since the page was opened.
    pub async fn assert_status_seen(&self, expected: &str) {
        let statuses = self.statuses().await;
        assert!(
            statuses.iter().any(|s| s == expected),
            "never showed {expected:?}: {statuses:?}"
        );
    }

    /// The idempotency outcome of each `POST /api/payments` the server answered, in order.
    pub fn payment_outcomes(&self) -> Vec<String> {
        outcomes(&self.server.log(), "uri=/api/payments ")
    }

    /// The same for refunds.
    pub fn refund_outcomes(&self) -> Vec<String> {
        outcomes(&self.server.log(), "/refunds ")
    }

    /// The same for the shop's session creations.
    pub fn session_outcomes(&self) -> Vec<String> {
        outcomes(&self.server.log(), "uri=/api/checkout-sessions ")
    }

    /// Opens the page in a second tab, which starts with a copy of this tab's
    /// `sessionStorage` (as browsers do for a tab opened from another), and returns both
    /// handles (this tab's first). The second tab is the current one afterwards.
    pub async fn second_tab(&self) -> (fantoccini::wd::WindowHandle, fantoccini::wd::WindowHandle) {
        let first = self.browser.window().await.unwrap();
        self.on_top().await;
        self.js("window.open(location.href, '_blank');").await;
        let second = self
            .browser
            .windows()
            .await
            .unwrap()
            .into_iter()
            .find(|w| *w != first)
            .expect("a second tab");
        self.browser.switch_to_window(second.clone()).await.unwrap();
        self.enter_widget().await;
        self.wait_for(".card").await;
        self.record_statuses().await;
        (first, second)
    }

    pub async fn restart_server_on_same_port(&mut self) {
        self.restart_server(true).await;
    }

    /// The checkout again, on the same port and database, without faults; `webhooks`: whether
    /// it knows where the demo shop receives its events (without, they wait in its outbox).
    pub async fn restart_server(&mut self, webhooks: bool) {
        self.server.kill();
        let port = self.server.base.rsplit(':').next().unwrap().to_owned();
        let webhook_url = format!("{}/webhooks/checkout", self.shop.base);
        let mut env: Vec<(&str, &str)> = vec![("CHECKOUT_DEMO_SHOP_ORIGIN", &self.shop.base)];
        if webhooks {
            env.push(("CHECKOUT_DEMO_SHOP_WEBHOOK_URL", &webhook_url));
        }
        self.server = start_server(&self.db, "", Some(&port), &env, self.credentials.path()).await;
    }

    /// The back office, signed in as the shop's staff (signing in first if asked to).
    pub async fn back_office(&self) {
        self.browser
            .goto(&format!("{}/admin", self.shop.base))
            .await
            .unwrap();
        if self.url().await.ends_with("/admin/login") {
            self.type_into("input[name=password]", checkout_testkit::STAFF_PASSWORD)
                .await;
            self.click("form.login button", 1).await;
        }
        self.wait_for("form.logout").await;
    }
}

async fn start_server(
    db: &TestDb,
    faults: &str,
    port: Option<&str>,
    env: &[(&str, &str)],
    credentials: &std::path::Path,
) -> Server {
    let addr = format!("127.0.0.1:{}", port.unwrap_or("0"));
    let dist = dist();
    let credentials = credentials.join(CREDENTIALS).display().to_string();
    let mut settings = vec![
        ("CHECKOUT_FAULTS", faults),
        ("CHECKOUT_STATIC_DIR", dist.as_str()),
        ("CHECKOUT_ADDR", addr.as_str()),
        ("CHECKOUT_DEMO_SHOP_FILE", credentials.as_str()),
    ];
    settings.extend_from_slice(env);
    Server::start_with(SERVER, db, &settings).await
}

const CREDENTIALS: &str = "demo-shop.json";

/// Reads `idempotency=…` off the server's one-line-per-response log.
fn outcomes(log: &str, route: &str) -> Vec<String> {
    log.lines()
        .filter(|line| {
            line.contains("finished processing request")
                && line.contains(route)
                && line.contains("method=POST")
        })
        .map(|line| match line.split("idempotency=").nth(1) {
            Some(rest) => rest
                .split(['}', ' '])
                .next()
                .unwrap_or("")
                .trim_matches('"')
                .to_owned(),
            None => "none".to_owned(),
        })
        .collect()
}

/// A command of WebAuthn's WebDriver extension (virtual authenticators, W3C WebAuthn §11),
/// which fantoccini does not name: `{method} /session/{id}/webauthn/{path}`.
#[derive(Debug)]
struct WebAuthnCommand {
    method: http::Method,
    path: String,
    body: Option<Value>,
}

impl fantoccini::wd::WebDriverCompatibleCommand for WebAuthnCommand {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/webauthn/{}",
            session_id.unwrap_or_default(),
            self.path
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            self.method.clone(),
            self.body.as_ref().map(ToString::to_string),
        )
    }
}

impl Checkout {
    async fn webauthn(&self, method: http::Method, path: String, body: Option<Value>) -> Value {
        let what = format!("{method} webauthn/{path}");
        self.browser
            .issue_cmd(WebAuthnCommand { method, path, body })
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// A virtual passkey device in the current tab (Chromium scopes them to a tab): a platform
    /// authenticator that keeps discoverable credentials and verifies its user at once. Its id.
    pub async fn add_authenticator(&self) -> String {
        let options = serde_json::json!({
            "protocol": "ctap2", "transport": "internal", "hasResidentKey": true,
            "hasUserVerification": true, "isUserVerified": true, "isUserConsenting": true,
        });
        let id = self
            .webauthn(http::Method::POST, "authenticator".into(), Some(options))
            .await;
        id.as_str().expect("an authenticator id").to_owned()
    }

    /// The credentials the device keeps (id, rpId, private key, user handle, counter).
    pub async fn authenticator_credentials(&self, authenticator: &str) -> Vec<Value> {
        let path = format!("authenticator/{authenticator}/credentials");
        let found = self.webauthn(http::Method::GET, path, None).await;
        found.as_array().cloned().unwrap_or_default()
    }

    /// Puts a credential (as [`Self::authenticator_credentials`] gave it) into a device: the
    /// same passkey on the same device, in another tab.
    pub async fn add_credential(&self, authenticator: &str, credential: &Value) {
        let path = format!("authenticator/{authenticator}/credential");
        self.webauthn(http::Method::POST, path, Some(credential.clone()))
            .await;
    }

    /// The browser's tabs and windows, by handle.
    pub async fn windows(&self) -> Vec<fantoccini::wd::WindowHandle> {
        self.browser.windows().await.unwrap()
    }

    /// Clicks `css` (a link that opens a window), then goes into the window it opened; returns
    /// the window it came from.
    pub async fn enter_window_opened_by(&self, css: &str) -> fantoccini::wd::WindowHandle {
        let from = self.browser.window().await.unwrap();
        let before = self.windows().await;
        self.click_soon(css).await;
        let deadline = Instant::now() + WAIT;
        let opened = loop {
            if let Some(new) = self
                .windows()
                .await
                .into_iter()
                .find(|w| !before.contains(w))
            {
                break new;
            }
            assert!(Instant::now() < deadline, "{css} opened no window");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.browser.switch_to_window(opened).await.unwrap();
        from
    }

    /// Waits until the window we are in closes itself, then goes back to `to`.
    pub async fn after_window_closes(&self, to: fantoccini::wd::WindowHandle) {
        let count = self.windows().await.len();
        let closed = || async { self.windows().await.len() < count };
        checkout_testkit::wait_until("the account window never closed", WAIT, closed).await;
        self.browser.switch_to_window(to).await.unwrap();
    }
}

impl Checkout {
    /// Runs axe-core (from tools/, as scripts/test installs it) on the page the scenario is in,
    /// photographs it as `seen-axe-{view}`, and finds no violation.
    pub async fn assert_accessible(&self, view: &str) {
        let axe = workspace().join("tools/node_modules/axe-core/axe.min.js");
        let source = std::fs::read_to_string(&axe)
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/test installs axe-core)", axe.display()));
        let loaded = self
            .js(&format!("{source}\nreturn typeof window.axe;"))
            .await;
        assert_eq!(loaded, serde_json::json!("object"), "axe-core did not load");
        let found = self
            .js_async(
                "axe.run(document).then((r) => done({ passes: r.passes.length, violations: r.violations.map((v) => \
                 ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(' ')) })) }));",
            )
            .await;
        assert!(
            found["passes"].as_u64().unwrap_or(0) >= 10,
            "axe checked little: {found}"
        );
        self.screenshot(&format!("seen-axe-{view}")).await;
        assert_eq!(
            &found["violations"],
            &serde_json::json!([]),
            "axe in the {view} view"
        );
    }
}
