//! The Leptos component: it only wires the plain state in [`crate::checkout`] and
//! [`crate::intent`] to signals, `sessionStorage`, the other tabs and the network. Every change
//! of state is saved, and told to the other tabs, before anything is sent.

use std::sync::atomic::{AtomicBool, Ordering};

use leptos::prelude::LocalStorage;

use checkout_shared::{
    CheckoutSession, CheckoutSessionStatus, Payment, PaymentDetails, ShopperToken, format_rub,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde::de::DeserializeOwned;

use crate::checkout::{self, Checkout, HostEvent, Order, Read, Seed, SessionState, payment_status};
use crate::intent::{Intent, Phase, Resume, RetryPolicy, WhenForgotten};
use crate::{api, frame, json, messages, shopper, sign_in, storage, tabs};

/// Lookups and fetches that find no server are retried this many times before the shopper is
/// told (nothing is lost: the intent stays pending).
const FINDING_OUT_TRIES: u32 = 12;

/// The page: `/pay/{session_id}` is the payment page of that session, in a shop's frame or as a
/// full page.
pub fn start() {
    let Some(window) = web_sys::window() else {
        return;
    };
    let path = window.location().pathname().unwrap_or_default();
    if let Some(session_id) = path.strip_prefix("/pay/") {
        mount_page(session_id.trim_end_matches('/').to_owned());
    }
}

/// The payment page of `session_id`, alone in its document.
fn mount_page(session_id: String) {
    let host = if frame::is_framed() {
        Host::Frame(frame::parent_origin())
    } else {
        Host::Page
    };
    let mode = Mode { session_id, host };
    leptos::mount::mount_to_body(move || view! { <App mode=mode.clone() /> });
}

/// The session a widget pays, and who hears how it ended.
#[derive(Clone)]
pub struct Mode {
    session_id: String,
    host: Host,
}

/// Who hears how the purchase ended.
#[derive(Clone)]
enum Host {
    /// The shop's page that framed the payment page: told by `postMessage`, to its origin only
    /// (`None`: the checkout did not vouch for it, so it is told nothing).
    Frame(Option<String>),
    /// The payment page as a full page: the shopper goes back to the shop (`return_url`).
    Page,
}

impl Mode {
    /// Where the state lives in `sessionStorage`, and the name of the channel the tabs of it
    /// share: one per session, so that two widgets in a tab never share an intent.
    fn state_key(&self) -> String {
        format!("{}.{}", storage::STATE, self.session_id)
    }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    let crypto = web_sys::window()
        .and_then(|w| w.crypto().ok())
        .expect("Web Crypto is available");
    // Not `expect`: it would print the error with `Debug`, which links a formatter of any
    // JavaScript value into the widget (about 1 KB compressed, for a message no one reads).
    if crypto.get_random_values_with_u8_array(&mut bytes).is_err() {
        panic!("no random bytes");
    }
    bytes
}

fn seed() -> Seed {
    Seed {
        key: random_bytes(),
    }
}

/// Which kind of intent a task is working on (refunds are the shop's now, not the page's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Payment,
}

#[derive(Clone, Copy)]
struct Widget {
    mode: StoredValue<Mode, LocalStorage>,
    /// The other tabs showing this intent (see [`tabs`]).
    channel: StoredValue<Option<tabs::Channel>, LocalStorage>,
    checkout: RwSignal<Checkout>,
    session: RwSignal<Option<ShopperToken>>,
    balance: RwSignal<Option<i64>>,
    session_error: RwSignal<Option<String>>,
    /// An intent of this kind is being worked on in another tab: this one waits.
    elsewhere: RwSignal<Option<Which>>,
    /// This widget's prefix for element ids (`w1-`): unique in its document.
    ids: StoredValue<String, LocalStorage>,
    /// The shopper acted in the widget (focus was on its action): a change of view moves focus
    /// to what replaced it, never to the page's start.
    acted: StoredValue<bool, LocalStorage>,
}

/// Ids of a widget's elements: `prefix` + name, unique per widget in its document.
fn next_ids() -> String {
    thread_local! { static MOUNTED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) }; }
    MOUNTED.with(|n| {
        n.set(n.get() + 1);
        format!("w{}-", n.get())
    })
}

/// Changes the state, then saves it and tells the other tabs, before anything is sent.
fn change<R>(widget: Widget, f: impl FnOnce(&mut Checkout) -> R) -> Option<R> {
    let result = widget.checkout.try_update(f);
    let text = widget.checkout.with_untracked(checkout::write_saved);
    let key = widget.mode.with_value(Mode::state_key);
    if !storage::write(&key, &text) {
        widget
            .checkout
            .update(|c| c.notice = Some(messages::STATE_NOT_SAVED.into()));
    }
    widget.channel.with_value(|channel| {
        if let Some(channel) = channel {
            channel.publish(&text);
        }
    });
    result
}

/// Another tab's state: taken whole when it is about the same purchase (the same payment
/// key: a tab opened from this one); from a tab of the same session opened on its own (its own
/// intent), only that it paid the session.
fn from_another_tab(widget: Widget, text: &str) {
    let Read::Current(theirs) = checkout::read_saved(text) else {
        return;
    };
    let same = widget
        .checkout
        .with_untracked(|ours| ours.payment.key == theirs.payment.key);
    if same {
        widget.checkout.set(theirs);
        storage::write(&widget.mode.with_value(Mode::state_key), text);
    } else if theirs.receipt().is_some() {
        change(widget, |ours| ours.paid_in_another_tab(&theirs));
    }
}

/// What differs between a payment and a refund, for the one loop that drives both.
trait Kind: 'static {
    type Request;
    type Receipt: DeserializeOwned + Clone + 'static;
    const WHICH: Which;
    fn intent(c: &mut Checkout) -> Option<&mut Intent<Self::Request, Self::Receipt>>;
    /// The path, and the body as JSON text.
    fn path_and_body(request: &Self::Request) -> (String, String);
    fn when_forgotten(c: &Checkout) -> WhenForgotten;
    /// Files an outcome where it belongs, in the same change that recorded it.
    fn file(_c: &mut Checkout) {}
    /// The payment to fetch for a [`Resume::Confirm`] or a [`Resume::Reconcile`].
    fn payment_to_fetch(c: &Checkout, confirm: Option<String>) -> Option<String>;
    /// What the fetched payment says of this intent.
    fn found(c: &mut Checkout, details: &PaymentDetails);
}

struct PaymentKind;

impl Kind for PaymentKind {
    type Request = Order;
    type Receipt = Payment;
    const WHICH: Which = Which::Payment;

    fn intent(c: &mut Checkout) -> Option<&mut Intent<Order, Payment>> {
        Some(&mut c.payment)
    }

    fn path_and_body(order: &Order) -> (String, String) {
        let body = json::to_string(&order.request()).unwrap_or_default();
        ("/api/payments".into(), body)
    }

    fn when_forgotten(c: &Checkout) -> WhenForgotten {
        if c.recovering {
            WhenForgotten::AwaitClick
        } else {
            WhenForgotten::Resend
        }
    }

    fn payment_to_fetch(_: &Checkout, confirm: Option<String>) -> Option<String> {
        confirm
    }

    fn found(c: &mut Checkout, details: &PaymentDetails) {
        c.payment.succeed_with(details.payment.clone());
        c.sync_refunds(details);
    }
}

impl Widget {
    fn token(&self) -> Option<String> {
        self.session
            .with_untracked(|s| s.as_ref().map(|s| s.token.clone()))
    }

    async fn refresh_balance(self) {
        let Some(token) = self.token() else { return };
        match api::account(&token).await {
            Ok(account) => self.balance.set(Some(account.balance)),
            Err(api::Failure::Unauthorized) => {
                if self.renew_session().await {
                    Box::pin(self.refresh_balance()).await;
                }
            }
            Err(_) => {}
        }
    }

    fn livemode_untracked(self) -> Option<bool> {
        self.checkout.with_untracked(|c| {
            c.payment
                .request
                .is_fetched()
                .then_some(c.payment.request.livemode)
        })
    }

    /// A new test shopper when the server no longer knows this one; the shopper is told. A live
    /// shopper's sign-in that ended is forgotten here (`shopper`): the intent says the session
    /// is lost, and the page, started again, asks to sign in.
    async fn renew_session(self) -> bool {
        let live = self.livemode_untracked() == Some(true);
        match shopper::shopper(self.token().as_deref(), live).await {
            Ok(session) => {
                self.session.set(Some(session));
                change(self, |c| c.notice = Some(messages::SESSION_RENEWED.into()));
                true
            }
            Err(_) => false,
        }
    }

    /// With a shopper: learn the payment's refunds from the server, then resume whatever was
    /// in flight when the page went away, and show the balance.
    async fn start(self) {
        let paid = self
            .checkout
            .with_untracked(|c| c.receipt().map(|p| p.payment_id.clone()));
        if let (Some(payment_id), Some(token)) = (paid, self.token())
            && let Ok(details) = api::payment(&token, &payment_id).await
        {
            change(self, |c| c.sync_refunds(&details));
        }
        self.advance::<PaymentKind>(false);
        self.refresh_balance().await;
    }

    /// Works on one intent until there is nothing more to do for it now: sends it, looks its
    /// key up, fetches what settles it, renews the session. One tab at a time per key.
    fn advance<K: Kind>(self, clicked: bool) {
        spawn_local(async move {
            let Some(key) = self
                .checkout
                .try_update_untracked(|c| K::intent(c).map(|i| i.key.clone()))
                .flatten()
            else {
                return;
            };
            // One tab at a time per session, not only per key: tabs opened on their own have
            // intents of their own, and must not pay one session side by side.
            let _ = key;
            let lock = self
                .mode
                .with_value(|mode| format!("checkout-session:{}", mode.session_id));
            tabs::one_at_a_time(&lock, || self.elsewhere.set(Some(K::WHICH)), async move {
                self.elsewhere.set(None);
                self.work_on::<K>(clicked).await;
            })
            .await;
            self.refresh_balance().await;
        });
    }

    async fn work_on<K: Kind>(self, clicked: bool) {
        let mut first = true;
        let mut tries = 0;
        loop {
            let now = now_ms();
            let step = change(self, |c| {
                let intent = K::intent(c)?;
                Some(if clicked && first && intent.sendable_by_hand() {
                    Resume::Send
                } else if first {
                    // Holding the lock: a send in flight belongs to a page that is gone.
                    intent.resume_after_reload();
                    intent.resume(now)
                } else {
                    intent.next_step()
                })
            })
            .flatten()
            .unwrap_or(Resume::Nothing);
            first = false;
            let Some(token) = self.token() else { return };
            let progressed = match step {
                Resume::Nothing => return,
                Resume::Send => {
                    self.send::<K>(&token).await;
                    true
                }
                Resume::LookUp => self.look_up::<K>(&token).await,
                Resume::Confirm(payment_id) => {
                    self.fetch_payment::<K>(&token, Some(payment_id)).await
                }
                Resume::Reconcile => self.reconcile::<K>().await,
                Resume::Renew => {
                    if self.renew_session().await {
                        change(self, |c| K::intent(c).map(Intent::session_renewed));
                    } else {
                        change(self, |c| K::intent(c).map(Intent::session_lost));
                    }
                    true
                }
            };
            if progressed {
                tries = 0;
            } else {
                tries += 1;
                if tries >= FINDING_OUT_TRIES {
                    change(self, |c| K::intent(c).map(Intent::give_up));
                    return;
                }
                let delay = RetryPolicy::WIDGET.delay(tries, js_sys::Math::random(), None);
                gloo_timers::future::sleep(delay).await;
            }
        }
    }

    /// The retry loop of one round: same key, same body, backoff between attempts.
    async fn send<K: Kind>(self, token: &str) {
        loop {
            let now = now_ms();
            let next = change(self, |c| {
                let intent = K::intent(c)?;
                // A resend with a key that may be forgotten by now: find out first.
                if intent.key_expires_at_ms.is_some() && !intent.key_surely_known(now) {
                    intent.start_lookup();
                    return None;
                }
                intent.start_attempt()?;
                Some((intent.key.clone(), K::path_and_body(&intent.request)))
            })
            .flatten();
            let Some((key, (path, body))) = next else {
                return;
            };
            let attempt = api::post_keyed(&path, token, &key, &body).await;
            let wait = change(self, |c| {
                let wait = K::intent(c)?.finish_attempt(
                    &attempt,
                    &RetryPolicy::WIDGET,
                    js_sys::Math::random(),
                    now_ms(),
                );
                K::file(c);
                wait
            })
            .flatten();
            match wait {
                Some(delay) => gloo_timers::future::sleep(delay).await,
                None => return,
            }
        }
    }

    /// Asks the server what became of the key. `false`: no answer (tried again later).
    async fn look_up<K: Kind>(self, token: &str) -> bool {
        let Some(key) = change(self, |c| {
            let intent = K::intent(c)?;
            intent.start_lookup().then(|| intent.key.clone())
        })
        .flatten() else {
            return true;
        };
        match api::key_status(token, &key).await {
            Ok(found) => {
                change(self, |c| {
                    let when = K::when_forgotten(c);
                    if let Some(intent) = K::intent(c) {
                        intent.finish_lookup(found, when);
                    }
                    c.recovering = false;
                    K::file(c);
                });
                true
            }
            Err(api::Failure::Unauthorized) => {
                change(self, |c| K::intent(c).map(Intent::unauthorized));
                true
            }
            Err(_) => false,
        }
    }

    /// Fetches the payment that settles the intent (the paid order's; a refund's own payment).
    async fn fetch_payment<K: Kind>(self, token: &str, confirm: Option<String>) -> bool {
        let Some(payment_id) = self
            .checkout
            .with_untracked(|c| K::payment_to_fetch(c, confirm))
        else {
            return true;
        };
        match api::payment(token, &payment_id).await {
            Ok(details) => {
                change(self, |c| K::found(c, &details));
                true
            }
            // The session was paid, but not by this shopper: the order is paid, and nothing
            // was charged here. Never a decline.
            Err(api::Failure::NotFound) => {
                change(self, |c| c.paid_by_another(&payment_id));
                true
            }
            Err(api::Failure::Unauthorized) => {
                change(self, |c| K::intent(c).map(Intent::unauthorized));
                true
            }
            Err(_) => false,
        }
    }

    /// The outcome of a request whose answer could not be read, even from its key: what it
    /// made is in the session (paid by a payment, which is then fetched), or it made nothing
    /// and is sent again. `false`: no answer (tried again later).
    async fn reconcile<K: Kind>(self) -> bool {
        let session_id = self.mode.with_value(|mode| mode.session_id.clone());
        let Ok(session) = api::checkout_session(&session_id).await else {
            return false;
        };
        change(self, |c| {
            let Some(intent) = K::intent(c) else { return };
            match (session.status, session.payment_id.clone()) {
                (CheckoutSessionStatus::Paid, Some(payment_id)) => {
                    if matches!(intent.phase, Phase::Reconciling) {
                        intent.phase = Phase::Confirming { payment_id };
                    }
                }
                _ => intent.found_nothing(),
            }
        });
        true
    }

    fn pay(self) {
        self.acted.set_value(true);
        self.advance::<PaymentKind>(true);
    }

    fn id(&self, name: &str) -> String {
        self.ids.with_value(|prefix| format!("{prefix}{name}"))
    }

    /// After a decline: a new intent for the same open session, sent at once.
    fn pay_again(self) {
        let started = change(self, |c| c.start_over(seed(), now_ms())).unwrap_or(false);
        if started {
            self.pay();
        }
    }

    /// The shop's checkout session, read on every mount: what it asks (kept with the intent
    /// once fetched), and whether it is still open, paid or expired.
    async fn read_session(self) {
        let session_id = self.mode.with_value(|mode| mode.session_id.clone());
        match api::checkout_session(&session_id).await {
            Ok(session) => self.take_session(&session),
            Err(api::Failure::NotFound) => {
                self.session_error
                    .set(Some("Такого заказа нет: вернитесь в магазин".into()));
                if let Host::Frame(Some(origin)) = self.mode.with_value(|m| m.host.clone()) {
                    let detail = frame::object(&[("code", "not_found".into())]);
                    frame::post(&origin, "checkout:error", &[("detail", detail)]);
                }
            }
            Err(_) => self.session_error.set(Some(
                "Не удалось получить заказ магазина: обновите страницу".into(),
            )),
        }
    }
}

impl Widget {
    /// What the session says (the shop's order, its amount, paid or lapsed).
    fn take_session(self, session: &CheckoutSession) {
        change(self, |c| {
            c.payment.request.livemode = session.livemode;
            if c.wants_session() {
                c.adopt_session(session);
            }
            c.observe_session(session);
        });
    }
}

/// The session as the server wrote it into the page (`#checkout-session`), read once: what
/// `GET /api/checkout-sessions/{id}` answered when the page was made.
fn session_in_page(session_id: &str) -> Option<CheckoutSession> {
    let element = web_sys::window()?
        .document()?
        .get_element_by_id("checkout-session")?;
    element.remove();
    let session: CheckoutSession = json::from_str(&element.text_content()?)?;
    (session.session_id == session_id).then_some(session)
}

#[component]
fn App(mode: Mode) -> impl IntoView {
    let now = now_ms();
    let state_key = mode.state_key();
    let saved = storage::read(&state_key);
    let restored = checkout::restore(saved.as_deref(), seed(), now);
    if restored.keep_aside
        && let Some(text) = &saved
    {
        storage::keep_aside(text, now);
    }
    let initial = restored.checkout;
    let channel_name = state_key.clone();
    let in_page = session_in_page(&mode.session_id);
    // The mode, from the session the page carries (unknown only if it had none: then test);
    // and the mode's saved shopper, if this tab has one, before the first view (no sign-in
    // form flashes for a shopper signed in already).
    let live = in_page.as_ref().is_some_and(|s| s.livemode);
    let saved = if live {
        storage::LIVE
    } else {
        storage::SESSION
    };
    let widget = Widget {
        mode: StoredValue::new_local(mode),
        channel: StoredValue::new_local(None),
        checkout: RwSignal::new(initial),
        session: RwSignal::new(storage::load(saved)),
        balance: RwSignal::new(None),
        session_error: RwSignal::new(None),
        elsewhere: RwSignal::new(None),
        ids: StoredValue::new_local(next_ids()),
        acted: StoredValue::new_local(false),
    };
    widget
        .channel
        .set_value(tabs::Channel::join(&channel_name, move |text| {
            from_another_tab(widget, &text)
        }));
    tell_the_host(widget);
    // The intent (and its key) is saved the moment it exists.
    change(widget, |_| ());
    if let Some(session) = &in_page {
        widget.take_session(session);
    }

    // On load: the session's mode (from the page, or asked), then the shopper of that mode: a
    // test shopper is made if this tab has none; a live one signs in.
    spawn_local(async move {
        if in_page.is_none() {
            widget.read_session().await;
        }
        let Some(livemode) = widget.livemode_untracked() else {
            return; // the session could not be read; the widget says so
        };
        match shopper::shopper(None, livemode).await {
            Ok(session) => widget.session.set(Some(session)),
            // A live session: the shopper signs in (`SignIn`), and the page starts again.
            Err(_) if livemode => return,
            Err(_) => {
                widget.session_error.set(Some(
                    "Не удалось открыть тестовый счёт: обновите страницу".into(),
                ));
                return;
            }
        }
        widget.start().await;
    });

    // In a shop's frame: say it is ready, and keep the frame as tall as the page.
    if let Host::Frame(Some(origin)) = widget.mode.with_value(|m| m.host.clone()) {
        request_animation_frame(move || {
            frame::post(&origin, "checkout:ready", &[]);
            frame::follow_height(origin);
        });
    }
    let full_page = widget.mode.with_value(|m| matches!(m.host, Host::Page));
    if full_page
        && let Some(body) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.body())
    {
        let _ = body.class_list().add_1("full-page-background");
    }

    let notice = move || widget.checkout.with(|c| c.notice.clone());
    // The one live region, there from the start: what is happening, then how it ended.
    let announcement = move || {
        widget.checkout.with(|c| match (c.receipt(), &c.session) {
            (Some(receipt), _) => format!("Оплачено: {}", format_rub(receipt.amount)),
            (None, SessionState::Paid { .. }) => "Заказ уже оплачен".into(),
            (None, SessionState::Expired) => "Срок оплаты истёк".into(),
            (None, SessionState::Open) if !c.payment.is_pending() => {
                format!("Платёж не прошёл. {}", payment_status(&c.payment))
            }
            _ => payment_status(&c.payment),
        })
    };
    // Live: «Войти» (the account window, which gives this page the sign-in), or «Выйти».
    let signed_in_live = live && widget.session.with_untracked(Option::is_some);
    let (sign_in_url, sign_in_target) = sign_in::link(full_page);
    let waiting = if live && !signed_in_live {
        "вы не вошли"
    } else {
        "…"
    };
    if signed_in_live {
        sign_in::offer_sign_out(widget.token());
    }
    let title = widget.id("checkout-title");
    let account = if live {
        "Счёт: "
    } else {
        "Тестовый счёт: "
    };
    let card = view! {
            <section class="card" aria-labelledby=title>
                <div class="visually-hidden announce" role="status" aria-live="polite">{announcement}</div>
                {move || notice().map(|text| view! { <p class="notice">{text}</p> })}
                <OrderSummary widget />
                {move || {
                    let settled = widget.checkout.with(Checkout::is_settled);
                    if settled { view! { <Outcome widget /> }.into_any() }
                    // A live session with no shopper signed in on this tab: «Войти», which opens
                    // the account window (the password is never typed in a shop's frame).
                    else if live && widget.session.with(Option::is_none) { view! {
                        <div class="sign-in">
                            <p>"Заказ оплачивается настоящими деньгами: войдите в свой счёт или создайте его."</p>
                            <a class="sign-in-open" href=sign_in_url.clone() target=sign_in_target rel="opener">"Войти"</a>
                        </div>
                    }.into_any() }
                    else { view! { <PayPanel widget /> }.into_any() }
                }}
                <footer class="account">
                    {move || match (widget.session_error.get(), widget.balance.get()) {
                        (Some(error), _) => view! { <span class="error">{error}</span> }.into_any(),
                        (None, Some(balance)) => view! {
                            <span>{account}<span class="balance">{format_rub(balance)}</span></span>
                        }.into_any(),
                        (None, None) => view! { <span>{account}{waiting}</span> }.into_any(),
                    }}
                    {signed_in_live.then(|| view! { <button type="button" class="sign-out">"Выйти"</button> })}
                </footer>
            </section>
    };
    let root = match (full_page, live) {
        (true, true) => "checkout full-page live",
        (true, false) => "checkout full-page test",
        (false, true) => "checkout live",
        (false, false) => "checkout test",
    };
    view! { <main class=root>{card}</main> }
}

#[component]
fn OrderSummary(widget: Widget) -> impl IntoView {
    let order = move || widget.checkout.with(|c| c.payment.request.clone());
    view! {
        <header class="card-header">
            <h1 id=widget.id("checkout-title")>"Оформление заказа"</h1>
            {move || order().shop_name.map(|name| view! { <p class="shop-name">"Продавец: "{name}</p> })}
            <p class="order-id">"Заказ № "<span class="order-number">{move || order().order_id}</span></p>
        </header>
        {move || {
            let order = order();
            (order.items.is_empty()).then(|| order.description.map(|text| view! {
                <p class="description">{text}</p>
            }))
        }}
        <ul class="items">
            {move || order().items.into_iter().map(|item| view! {
                <li class="item">
                    <span class="item-name">{item.name.clone()}</span>
                    <span class="item-qty">{format!("{} × {}", item.quantity, format_rub(item.unit_price))}</span>
                    <span class="item-total">{format_rub(item.total())}</span>
                </li>
            }).collect_view()}
        </ul>
        <div class="total">
            <span>"Итого"</span>
            <strong class="total-amount">{move || format_rub(order().total())}</strong>
        </div>
    }
}

/// Whether the page's `checkout:pay-enabled` mark is made (once per page, whatever re-renders).
static PAY_ENABLED_MARKED: AtomicBool = AtomicBool::new(false);

#[component]
fn PayPanel(widget: Widget) -> impl IntoView {
    let waiting = move || widget.elsewhere.get() == Some(Which::Payment);
    let in_flight = move || waiting() || widget.checkout.with(|c| c.payment.is_in_flight());
    let no_session = move || {
        widget.session.with(Option::is_none)
            || widget.checkout.with(|c| !c.payment.request.is_fetched())
    };
    let status = move || {
        if waiting() {
            format!("Платёж {}", messages::OTHER_TAB)
        } else {
            widget.checkout.with(|c| payment_status(&c.payment))
        }
    };
    let failed = move || {
        widget
            .checkout
            .with(|c| matches!(c.payment.phase, Phase::Failed { .. }))
    };
    // The moment the shopper can first pay, on the page's timeline: what the widget's load is
    // measured to (bench: `widget-load`).
    Effect::new(move |_| {
        let ready = !(in_flight() || no_session());
        if ready
            && !PAY_ENABLED_MARKED.swap(true, Ordering::Relaxed)
            && let Some(performance) = web_sys::window().and_then(|w| w.performance())
        {
            let _ = performance.mark("checkout:pay-enabled");
        }
    });
    // Back from an outcome (paying again): the focus goes to the action again.
    let button = NodeRef::<leptos::html::Button>::new();
    Effect::new(move |_| {
        if widget.acted.get_value()
            && let Some(button) = button.get()
        {
            let _ = button.focus();
        }
    });
    view! {
        // `aria-disabled`, not `disabled`: a disabled button would drop the focus the shopper
        // put on it; this one keeps it, and ignores clicks while it waits.
        <button
            class="pay"
            type="button"
            node_ref=button
            aria-disabled=move || if in_flight() || no_session() { "true" } else { "false" }
            aria-busy=move || if in_flight() { "true" } else { "false" }
            on:click=move |_| if !(in_flight() || no_session()) { widget.pay() }
        >
            <span class="spinner" aria-hidden="true"></span>
            {move || {
                let total = widget.checkout.with(|c| c.payment.request.total());
                if total > 0 { format!("Оплатить {}", format_rub(total)) } else { "Оплатить".into() }
            }}
        </button>
        <p class="status" class:status-error=failed>{status}</p>
    }
}

/// After the purchase has an outcome: the receipt (with refunds); the session paid or expired
/// otherwise; or the decline, with paying again offered while the session is open. On a full
/// page, the way back to the shop (and, once paid, it goes there by itself).
#[component]
fn Outcome(widget: Widget) -> impl IntoView {
    let checkout = widget.checkout;
    let outcome = NodeRef::<leptos::html::Div>::new();
    // The view changed under the shopper's focus (the button is gone): the focus goes to what
    // replaced it.
    Effect::new(move |_| {
        if widget.acted.get_value()
            && let Some(outcome) = outcome.get()
        {
            let _ = outcome.focus();
        }
    });
    let full_page = widget.mode.with_value(|m| matches!(m.host, Host::Page));
    let return_url = move || {
        checkout
            .with(|c| c.payment.request.return_url.clone())
            .filter(|_| full_page)
    };
    // Paid, on a full page with somewhere to go back to: back to the shop after a moment.
    Effect::new(move |_| {
        let paid = checkout.with(|c| matches!(c.host_event(), Some(HostEvent::Paid(_))));
        if let (true, Some(url)) = (paid, return_url()) {
            spawn_local(async move {
                gloo_timers::future::sleep(std::time::Duration::from_secs(3)).await;
                if let Some(window) = web_sys::window() {
                    let _ = window.location().assign(&url);
                }
            });
        }
    });
    let title = widget.id("outcome-title");
    let labelled = title.clone();
    view! {
        <div class="outcome" tabindex="-1" node_ref=outcome aria-labelledby=labelled>
        {move || match checkout.with(|c| (c.receipt().cloned(), c.session.clone())) {
            (Some(receipt), _) => view! { <Receipt receipt title=title.clone() /> <ShopRefunds widget /> }.into_any(),
            (None, SessionState::Paid { .. }) => view! {
                <div class="already-paid">
                    <p class="already-paid-title" id=title.clone()><span class="tick" aria-hidden="true">"✓"</span>" Заказ уже оплачен"</p>
                    <p>"Этот заказ оплачен, платить ещё раз не нужно."</p>
                </div>
            }.into_any(),
            (None, SessionState::Expired) => view! {
                <div class="expired">
                    <p class="expired-title" id=title.clone()>"Срок оплаты истёк"</p>
                    <p>"Деньги не списаны. Вернитесь в магазин и оформите заказ снова."</p>
                </div>
            }.into_any(),
            (None, SessionState::Open) => {
                let status = checkout.with(|c| payment_status(&c.payment));
                let again = checkout.with(Checkout::can_pay_again);
                view! {
                    <div class="declined">
                        <p class="decline-title" id=title.clone()>"Платёж не прошёл"</p>
                        <p class="status">{status}</p>
                    </div>
                    {again.then(|| view! {
                        <button class="pay pay-again" type="button" on:click=move |_| widget.pay_again()>
                            "Оплатить снова"
                        </button>
                        <p class="hint">"Это новая попытка: прежняя ничего не списала."</p>
                    })}
                }.into_any()
            }
        }}
        {move || return_url().map(|url| {
            let paid = checkout.with(|c| matches!(c.host_event(), Some(HostEvent::Paid(_))));
            view! {
                {paid.then(|| view! { <p class="hint returning">"Через 3 секунды вернём вас в магазин."</p> })}
                <a class="return" href=url>"Вернуться в магазин"</a>
            }
        })}
        </div>
    }
}

/// Tells the shop's page that framed the payment page how the purchase ended, once per outcome
/// and page load: `checkout:paid` `{payment_id, amount, status}` or `checkout:declined`
/// `{code}`, by `postMessage` to the origin the checkout vouched for only. Never a balance: that
/// is the shopper's, not the shop's. A full page tells no one (it goes back by `return_url`).
fn tell_the_host(widget: Widget) {
    let Host::Frame(Some(origin)) = widget.mode.with_value(|m| m.host.clone()) else {
        return;
    };
    let told = StoredValue::new(None::<String>);
    Effect::new(move |_| {
        let Some((event, key)) = widget
            .checkout
            .with(|c| c.host_event().map(|e| (e, c.payment.key.clone())))
        else {
            return;
        };
        let identity = event.identity(&key);
        if told.with_value(|t| t.as_deref() == Some(identity.as_str())) {
            return;
        }
        told.set_value(Some(identity));
        let detail = match &event {
            HostEvent::Paid(paid) => frame::object(&[
                ("payment_id", paid.payment_id.as_str().into()),
                ("amount", (paid.amount as f64).into()),
                ("status", paid.status.as_str().into()),
            ]),
            HostEvent::Declined(declined) => {
                frame::object(&[("code", declined.code.as_str().into())])
            }
        };
        frame::post(&origin, event.name(), &[("detail", detail)]);
    });
}

#[component]
fn Receipt(receipt: Payment, title: String) -> impl IntoView {
    view! {
        <div class="receipt">
            <p id=title class="receipt-title"><span class="tick" aria-hidden="true">"✓"</span>" Оплачено"</p>
            <dl>
                <dt>"Платёж"</dt><dd class="payment-id">{receipt.payment_id}</dd>
                <dt>"Сумма"</dt><dd class="receipt-amount">{format_rub(receipt.amount)}</dd>
                {receipt.balance.map(|balance| view! {
                    <dt>"Остаток на счёте"</dt><dd class="receipt-balance">{format_rub(balance)}</dd>
                })}
            </dl>
        </div>
    }
}

/// Refunds the shop made of this payment, as the server has them (read when the page loads).
#[component]
fn ShopRefunds(widget: Widget) -> impl IntoView {
    let refunds = move || widget.checkout.with(|c| c.refunds.clone());
    let title = widget.id("refund-title");
    let labelled = title.clone();
    view! {
        <Show when=move || !refunds().is_empty()>
            <section class="refund" aria-labelledby=labelled.clone()>
                <h2 id=title.clone()>"Возвраты магазина"</h2>
                <ul class="refunds">
                    {move || refunds().into_iter().map(|r| view! {
                        <li class="refund-line">
                            <span>"Возврат "<span class="refund-id">{r.refund_id}</span></span>
                            <span class="refund-amount">{format_rub(r.amount)}</span>
                        </li>
                    }).collect_view()}
                </ul>
            </section>
        </Show>
    }
}
