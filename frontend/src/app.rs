//! The Leptos component: it only wires the plain state in [`crate::checkout`] to signals,
//! `sessionStorage` and the network. Every change of state is saved before anything is sent.

use checkout_shared::{DemoSession, Payment, format_rub};
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::checkout::{Checkout, Seed, parse_rub, payment_status, refund_status};
use crate::intent::{Intent, Phase, RetryPolicy};
use crate::{api, storage};

pub fn start() {
    leptos::mount::mount_to_body(App);
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    let crypto = web_sys::window()
        .and_then(|w| w.crypto().ok())
        .expect("Web Crypto is available");
    crypto
        .get_random_values_with_u8_array(&mut bytes)
        .expect("random bytes");
    bytes
}

fn seed() -> Seed {
    Seed {
        key: random_bytes(),
        order: random_bytes(),
    }
}

/// Changes the state and saves it at once, so that a key is on disk before it is sent.
fn change<R>(checkout: RwSignal<Checkout>, f: impl FnOnce(&mut Checkout) -> R) -> Option<R> {
    let result = checkout.try_update(f);
    checkout.with_untracked(|c| storage::save(storage::STATE, c));
    result
}

#[derive(Clone, Copy)]
struct Widget {
    checkout: RwSignal<Checkout>,
    session: RwSignal<Option<DemoSession>>,
    balance: RwSignal<Option<i64>>,
    session_error: RwSignal<Option<String>>,
}

impl Widget {
    fn token(&self) -> Option<String> {
        self.session
            .with_untracked(|s| s.as_ref().map(|s| s.token.clone()))
    }

    async fn refresh_balance(self) {
        if let Some(token) = self.token()
            && let Ok(account) = api::account(&token).await
        {
            self.balance.set(Some(account.balance));
        }
    }

    /// Sends the payment intent until it has an outcome. Started by every click and on load;
    /// only the first start of an attempt sends anything, the rest find it on its way.
    fn pay(self) {
        spawn_local(async move {
            drive(
                self,
                |c| Some(&mut c.payment),
                |order| ("/api/payments".to_owned(), order.request()),
            )
            .await;
        });
    }

    fn refund(self) {
        spawn_local(async move {
            drive(
                self,
                |c| c.refund.as_mut(),
                |order| {
                    (
                        format!("/api/payments/{}/refunds", order.payment_id),
                        order.request(),
                    )
                },
            )
            .await;
            change(self.checkout, Checkout::settle_refund);
        });
    }
}

/// The retry loop of one intent: same key, same body, backoff between attempts.
async fn drive<Req, Receipt, Body>(
    widget: Widget,
    pick: impl Fn(&mut Checkout) -> Option<&mut Intent<Req, Receipt>>,
    request: impl Fn(&Req) -> (String, Body),
) where
    Receipt: DeserializeOwned,
    Body: Serialize,
{
    let Some(token) = widget.token() else { return };
    loop {
        let next = change(widget.checkout, |c| {
            let intent = pick(c)?;
            intent.start_attempt()?;
            let (path, body) = request(&intent.request);
            Some((intent.key.clone(), path, body))
        })
        .flatten();
        let Some((key, path, body)) = next else { break };
        let attempt = api::post_keyed(&path, &token, &key, &body).await;
        let wait = change(widget.checkout, |c| {
            pick(c)?.finish_attempt(&attempt, &RetryPolicy::WIDGET, js_sys::Math::random())
        })
        .flatten();
        match wait {
            Some(delay) => gloo_timers::future::sleep(delay).await,
            None => break,
        }
    }
    widget.refresh_balance().await;
}

#[component]
pub fn App() -> impl IntoView {
    let checkout = RwSignal::new(
        storage::load::<Checkout>(storage::STATE).unwrap_or_else(|| Checkout::new(0, seed())),
    );
    let widget = Widget {
        checkout,
        session: RwSignal::new(storage::load(storage::SESSION)),
        balance: RwSignal::new(None),
        session_error: RwSignal::new(None),
    };
    // The intent (and its key) is saved the moment it exists.
    change(checkout, |_| ());

    // On load: get a shopper, then resume whatever was in flight when the page went away.
    spawn_local(async move {
        if widget.token().is_none() {
            match api::demo_session().await {
                Ok(session) => {
                    storage::save(storage::SESSION, &session);
                    widget.session.set(Some(session));
                }
                Err(error) => {
                    widget
                        .session_error
                        .set(Some(format!("Не удалось открыть демо-сессию: {error}")));
                    return;
                }
            }
        }
        let resume_payment = change(checkout, |c| {
            c.payment.resume_after_reload();
            c.payment.is_pending() && c.payment.phase != Phase::Created
        });
        let resume_refund = change(checkout, |c| {
            let refund = c.refund.as_mut()?;
            refund.resume_after_reload();
            Some(refund.is_pending() && refund.phase != Phase::Created)
        })
        .flatten();
        if resume_payment == Some(true) {
            widget.pay();
        }
        if resume_refund == Some(true) {
            widget.refund();
        }
        widget.refresh_balance().await;
    });

    view! {
        <main class="page">
            <section class="card" aria-labelledby="checkout-title">
                <OrderSummary widget />
                {move || {
                    let settled = checkout.with(|c| !c.payment.is_pending());
                    if settled { view! { <Outcome widget /> }.into_any() } else { view! { <PayPanel widget /> }.into_any() }
                }}
                <footer class="account">
                    {move || match (widget.session_error.get(), widget.balance.get()) {
                        (Some(error), _) => view! { <span class="error">{error}</span> }.into_any(),
                        (None, Some(balance)) => view! {
                            <span>"Демо-счёт: "<span class="balance">{format_rub(balance)}</span></span>
                        }.into_any(),
                        (None, None) => view! { <span>"Демо-счёт: …"</span> }.into_any(),
                    }}
                </footer>
            </section>
            <p class="note">"Демонстрация: деньги ненастоящие. Обновите страницу или нажмите дважды — оплата пройдёт один раз."</p>
        </main>
    }
}

#[component]
fn OrderSummary(widget: Widget) -> impl IntoView {
    let order = move || widget.checkout.with(|c| c.payment.request.clone());
    view! {
        <header class="card-header">
            <h1 id="checkout-title">"Оформление заказа"</h1>
            <p class="order-id">"Заказ № "<span class="order-number">{move || order().order_id}</span></p>
        </header>
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

#[component]
fn PayPanel(widget: Widget) -> impl IntoView {
    let in_flight = move || widget.checkout.with(|c| c.payment.is_in_flight());
    let no_session = move || widget.session.with(Option::is_none);
    let status = move || widget.checkout.with(|c| payment_status(&c.payment));
    let failed = move || {
        widget
            .checkout
            .with(|c| matches!(c.payment.phase, Phase::Failed { .. }))
    };
    view! {
        <button
            class="pay"
            type="button"
            disabled=move || in_flight() || no_session()
            aria-busy=move || if in_flight() { "true" } else { "false" }
            on:click=move |_| widget.pay()
        >
            <span class="spinner" aria-hidden="true"></span>
            "Оплатить"
        </button>
        <p class="status" class:status-error=failed role="status" aria-live="polite">{status}</p>
    }
}

/// After the payment has an outcome: the receipt (with refunds) or the decline.
#[component]
fn Outcome(widget: Widget) -> impl IntoView {
    let checkout = widget.checkout;
    let new_purchase = move |_| {
        change(checkout, |c| {
            if let Some(next) = c.next_purchase(seed()) {
                *c = next;
            }
        });
        spawn_local(widget.refresh_balance());
    };
    view! {
        {move || match checkout.with(|c| c.receipt().cloned()) {
            Some(receipt) => view! { <Receipt receipt /> <RefundPanel widget /> }.into_any(),
            None => {
                let status = checkout.with(|c| payment_status(&c.payment));
                view! {
                    <div class="declined" role="alert">
                        <p class="decline-title">"Платёж не прошёл"</p>
                        <p class="status">{status}</p>
                    </div>
                }.into_any()
            }
        }}
        <button class="secondary new-purchase" type="button" on:click=new_purchase>"Новая покупка"</button>
    }
}

#[component]
fn Receipt(receipt: Payment) -> impl IntoView {
    view! {
        <div class="receipt" role="status" aria-live="polite" aria-labelledby="receipt-title">
            <p id="receipt-title" class="receipt-title"><span class="tick" aria-hidden="true">"✓"</span>" Оплачено"</p>
            <dl>
                <dt>"Платёж"</dt><dd class="payment-id">{receipt.payment_id}</dd>
                <dt>"Сумма"</dt><dd class="receipt-amount">{format_rub(receipt.amount)}</dd>
                <dt>"Остаток на счёте"</dt><dd class="receipt-balance">{format_rub(receipt.balance)}</dd>
            </dl>
        </div>
    }
}

#[component]
fn RefundPanel(widget: Widget) -> impl IntoView {
    let checkout = widget.checkout;
    let refundable = move || checkout.with(Checkout::refundable);
    let amount_text = RwSignal::new(String::new());
    let input_error = RwSignal::new(None::<String>);
    let refund_in_flight =
        move || checkout.with(|c| c.refund.as_ref().is_some_and(|r| r.is_in_flight()));
    let refund_settled =
        move || checkout.with(|c| c.refund.as_ref().is_some_and(|r| !r.is_pending()));
    let status =
        move || checkout.with(|c| c.refund.as_ref().map(refund_status).unwrap_or_default());

    let submit = move |amount: Option<i64>| {
        let Some(amount) = amount.filter(|a| *a > 0) else {
            input_error.set(Some(
                "Введите сумму в рублях, например 150 или 150,50".into(),
            ));
            return;
        };
        input_error.set(None);
        if change(checkout, |c| c.begin_refund(amount, random_bytes())) == Some(true) {
            widget.refund();
        }
    };

    view! {
        <section class="refund" aria-labelledby="refund-title">
            <h2 id="refund-title">"Возврат"</h2>
            <ul class="refunds">
                {move || checkout.with(|c| c.refunds.clone()).into_iter().map(|r| view! {
                    <li class="refund-line">
                        <span>"Возврат "<span class="refund-id">{r.refund_id}</span></span>
                        <span class="refund-amount">{format_rub(r.amount)}</span>
                    </li>
                }).collect_view()}
            </ul>
            {move || if refund_settled() {
                view! {
                    <p class="status refund-status" role="status" aria-live="polite">{status}</p>
                    <button class="secondary another-refund" type="button"
                        on:click=move |_| { change(checkout, Checkout::clear_refund); }
                        disabled=move || refundable() == 0>
                        "Ещё один возврат"
                    </button>
                }.into_any()
            } else if refundable() == 0 {
                view! { <p class="status">"Платёж возвращён полностью"</p> }.into_any()
            } else {
                view! {
                    <div class="refund-form">
                        <label for="refund-amount">"Сумма, ₽"</label>
                        <input id="refund-amount" type="text" inputmode="decimal" autocomplete="off"
                            placeholder=move || format_rub(refundable()).replace('\u{a0}', " ").trim_end_matches(" ₽").to_owned()
                            prop:value=move || amount_text.get()
                            on:input=move |ev| amount_text.set(event_target_value(&ev))
                            disabled=refund_in_flight />
                        <button class="refund-partial" type="button"
                            disabled=refund_in_flight
                            aria-busy=move || if refund_in_flight() { "true" } else { "false" }
                            on:click=move |_| submit(parse_rub(&amount_text.get_untracked()))>
                            "Вернуть"
                        </button>
                        <button class="secondary refund-full" type="button"
                            disabled=refund_in_flight
                            on:click=move |_| submit(Some(refundable()))>
                            "Вернуть всё"
                        </button>
                    </div>
                    <p class="status refund-status" role="status" aria-live="polite">
                        {move || input_error.get().unwrap_or_else(status)}
                    </p>
                }.into_any()
            }}
        </section>
    }
}
