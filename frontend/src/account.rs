//! The live shopper's account window, `/account`: a top-level page on the checkout's own origin
//! (the address bar shows whose it is), never inside a shop's frame (the server sends it with
//! `frame-ancestors 'none'`). Here, and only here, a shopper types a password or a mailed code,
//! or uses a passkey. The sign-in it ends with goes to the payment page that asked for it:
//!
//! - opened by a payment page in a shop's frame (its «Войти», a link with `rel="opener"`): put
//!   into that page's own `sessionStorage` (same origin only: the browser refuses this window
//!   any access to a page of another origin, a shop's included), the page starts again, and
//!   this window closes;
//! - reached from a full payment page (`?return=/pay/…`): saved in this tab's `sessionStorage`,
//!   where that page finds it, and the tab goes back to it.
//!
//! Its own binary (`checkout-account`): none of this is downloaded by the payment page.

use checkout_shared::{
    EmailCode, Recovery, RecoveryRequest, ShopperCredentials, ShopperToken, SignUp,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use wasm_bindgen::JsCast;

use crate::{api, json, messages, passkeys, storage};

/// Where the account window is in its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// E-mail and password, or a passkey; or «Создать счёт».
    SignIn,
    /// The code mailed at sign-up.
    SignUpCode,
    /// «Забыли пароль?»: the address to mail a code to.
    Recovery,
    /// The recovery code, and a new password (or a new passkey).
    RecoveryCode,
    /// Signed in with no passkey yet: offer to make one (the next sign-in needs no password).
    OfferPasskey,
    /// Handed over: the window closes, or the tab goes back to the payment.
    Done,
}

/// The page's signals; `Copy`, so that every handler takes it whole.
#[derive(Clone, Copy)]
struct Account {
    step: RwSignal<Step>,
    email: RwSignal<String>,
    password: RwSignal<String>,
    code: RwSignal<String>,
    /// What went wrong, in Russian (the one `role="alert"` region).
    error: RwSignal<String>,
    /// A request is out: the buttons wait.
    busy: RwSignal<bool>,
    /// The sign-in made here, until it is handed over.
    signed_in: StoredValue<Option<ShopperToken>, LocalStorage>,
}

pub fn start() {
    leptos::mount::mount_to_body(AccountPage);
}

/// `?return=` if it names a payment page of this origin (a path, never another site).
fn return_path() -> Option<String> {
    let search = web_sys::window()?.location().search().ok()?;
    let params = web_sys::UrlSearchParams::new_with_str(&search).ok()?;
    let path = params.get("return")?;
    let session = path.strip_prefix("/pay/")?;
    (!session.is_empty()
        && session
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    .then_some(path)
}

/// The window that opened this one, if any (a shop's frame of the payment page, usually).
fn opener() -> Option<web_sys::Window> {
    let opener = web_sys::window()?.opener().ok()?;
    (!opener.is_null() && !opener.is_undefined()).then(|| opener.unchecked_into())
}

impl Account {
    /// Posts `body` (JSON) to `path`: a sign-in (`2xx` with a token) is handed over or, with no
    /// passkey yet, a passkey is offered first; `202` (a code went out) moves to `then`; a
    /// refusal is said in Russian.
    fn send(self, path: &'static str, body: Option<String>, then: Step) {
        let Some(body) = body else { return };
        if self.busy.get_untracked() {
            return;
        }
        self.busy.set(true);
        self.error.set(String::new());
        spawn_local(async move {
            match api::post_json(path, None, body).await {
                Ok((202, _)) => {
                    self.code.set(String::new());
                    self.step.set(then);
                }
                answer => match api::said(answer) {
                    Ok(text) => match json::from_str::<ShopperToken>(&text) {
                        Some(token) => self.signed_in(token).await,
                        None => self.error.set(messages::ACCOUNT_UNREADABLE.into()),
                    },
                    Err(message) => self.error.set(message),
                },
            }
            self.busy.set(false);
        });
    }

    /// A password or code sign-in: a passkey for this device is offered first (the shopper
    /// typed a secret here, so this device likely has none; one it has already is refused by the
    /// authenticator itself, as the account's passkeys are excluded).
    async fn signed_in(self, token: ShopperToken) {
        self.signed_in.set_value(Some(token));
        if passkeys::supported() {
            self.step.set(Step::OfferPasskey);
        } else {
            self.hand_over();
        }
    }

    /// Gives the sign-in to the payment page that asked for it.
    fn hand_over(self) {
        let Some(token) = self.signed_in.get_value() else {
            return;
        };
        let Some(window) = web_sys::window() else {
            return;
        };
        let text = json::to_string(&token).unwrap_or_default();
        self.step.set(Step::Done);
        if let Some(path) = return_path() {
            storage::write(storage::LIVE, &text);
            let _ = window.location().replace(&path);
        } else if let Some(opener) = opener() {
            // The payment page that opened this window gets the sign-in in its own storage (a
            // frame's is partitioned by the shop's site: only it can reach it), and starts
            // again with it. Only a page of this very origin: the browser refuses this window
            // any access to a page of another (a shop's page that opened it learns nothing).
            let handed = opener
                .session_storage()
                .ok()
                .flatten()
                .is_some_and(|storage| storage.set_item(storage::LIVE, &text).is_ok());
            if handed {
                let _ = opener.location().reload();
                let _ = window.close();
            }
        }
    }

    /// Makes a passkey for the account just signed in, then hands over.
    fn make_passkey(self) {
        let Some(token) = self.signed_in.get_value() else {
            return;
        };
        self.busy.set(true);
        self.error.set(String::new());
        spawn_local(async move {
            match passkeys::register(&token.token).await {
                Ok(()) => self.hand_over(),
                Err(message) => self.error.set(message),
            }
            self.busy.set(false);
        });
    }

    /// Signs in with a passkey the browser offers (no e-mail typed).
    fn passkey_sign_in(self) {
        if self.busy.get_untracked() {
            return;
        }
        self.busy.set(true);
        self.error.set(String::new());
        spawn_local(async move {
            match passkeys::sign_in().await {
                Ok(token) => {
                    self.signed_in.set_value(Some(token));
                    self.hand_over();
                }
                Err(message) => self.error.set(message),
            }
            self.busy.set(false);
        });
    }

    fn email(self) -> String {
        self.email.get_untracked().trim().to_owned()
    }

    /// The body of a sign-in, or of a sign-up with a password (the same fields).
    fn credentials(self) -> Option<String> {
        json::to_string(&ShopperCredentials {
            email: self.email(),
            password: self.password.get_untracked(),
        })
    }

    /// A sign-up with no password (a passkey comes after the code).
    fn passwordless_sign_up(self) -> Option<String> {
        json::to_string(&SignUp {
            email: self.email(),
            password: None,
        })
    }

    fn recovery_request(self) -> Option<String> {
        json::to_string(&RecoveryRequest {
            email: self.email(),
        })
    }

    fn sign_up_code(self) -> Option<String> {
        json::to_string(&EmailCode {
            email: self.email(),
            code: self.code.get_untracked().trim().to_owned(),
        })
    }

    /// The recovery's code, with the new password, or none (a new passkey comes next).
    fn recovery(self, with_password: bool) -> Option<String> {
        json::to_string(&Recovery {
            email: self.email(),
            code: self.code.get_untracked().trim().to_owned(),
            password: with_password.then(|| self.password.get_untracked()),
        })
    }
}

/// Whether the e-mail field holds an address (the browser says what is wrong if not).
fn email_valid() -> bool {
    web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.get_element_by_id("account-email"))
        .and_then(|e| e.dyn_into::<web_sys::HtmlInputElement>().ok())
        .is_some_and(|input| input.report_validity())
}

/// `form.reportValidity()` of the form the event came from: the browser says what is missing.
fn valid(event: &web_sys::Event) -> bool {
    event
        .target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .and_then(|e| e.closest("form").ok().flatten())
        .and_then(|f| f.dyn_into::<web_sys::HtmlFormElement>().ok())
        .is_none_or(|form| form.report_validity())
}

#[component]
fn AccountPage() -> impl IntoView {
    let account = Account {
        step: RwSignal::new(Step::SignIn),
        email: RwSignal::new(String::new()),
        password: RwSignal::new(String::new()),
        code: RwSignal::new(String::new()),
        error: RwSignal::new(String::new()),
        busy: RwSignal::new(false),
        signed_in: StoredValue::new_local(None),
    };
    let busy = move || account.busy.get();
    let error = move || {
        let text = account.error.get();
        view! { <p class="error" role="alert">{text}</p> }
    };
    // True whatever the address is: a taken one gets no code but a word that it has an account,
    // an unknown one (recovery) a word that it has none.
    let sent = move || {
        let email = account.email.get();
        let email = email.trim();
        if account.step.get() == Step::RecoveryCode {
            format!(
                "Мы отправили письмо на {email}. Если у адреса есть счёт, в письме код: он действует 10 минут."
            )
        } else {
            format!(
                "Мы отправили письмо на {email}. Введите код из него: он действует 10 минут. Если счёт у адреса уже есть, письмо скажет, как войти."
            )
        }
    };
    let email_field = move || {
        view! {
            <label for="account-email">"Электронная почта"</label>
            <input id="account-email" type="email" name="email" autocomplete="username webauthn" required
                prop:value=move || account.email.get()
                on:input=move |e| account.email.set(event_target_value(&e)) />
        }
    };
    let password_field = move |label: &'static str, autocomplete: &'static str| {
        view! {
            <label for="account-password">{label}</label>
            <input id="account-password" type="password" name="password" autocomplete=autocomplete required minlength="8"
                prop:value=move || account.password.get()
                on:input=move |e| account.password.set(event_target_value(&e)) />
        }
    };
    let code_field = move || {
        view! {
            <label for="account-code">"Код из письма (6 цифр)"</label>
            <input id="account-code" name="code" inputmode="numeric" autocomplete="one-time-code" required
                pattern="[0-9]{6}" maxlength="6"
                prop:value=move || account.code.get()
                on:input=move |e| account.code.set(event_target_value(&e)) />
        }
    };
    let body = move || {
        match account.step.get() {
        Step::SignIn => view! {
            <form class="sign-in" on:submit=move |e| {
                e.prevent_default();
                account.send("/api/shoppers/sign-in", account.credentials(), Step::SignIn);
            }>
                <p>"Войдите в свой счёт или создайте его. Пароль и код вводятся только здесь, на странице платёжного сервиса."</p>
                {email_field}
                {password_field("Пароль (не меньше 8 знаков)", "current-password")}
                {error}
                <button type="submit" class="sign-in-submit" disabled=busy>"Войти"</button>
                <button type="button" class="secondary sign-up" disabled=busy on:click=move |e| {
                    if valid(&e) {
                        account.send("/api/shoppers", account.credentials(), Step::SignUpCode);
                    }
                }>"Создать счёт"</button>
                {passkeys::supported().then(|| view! {
                    <button type="button" class="secondary passkey-sign-in" disabled=busy
                        on:click=move |_| account.passkey_sign_in()>"Войти с ключом доступа"</button>
                    <button type="button" class="secondary sign-up-passkey" disabled=busy on:click=move |_| {
                        if email_valid() {
                            account.send("/api/shoppers", account.passwordless_sign_up(), Step::SignUpCode);
                        }
                    }>"Создать счёт с ключом доступа, без пароля"</button>
                })}
                <button type="button" class="link forgot" on:click=move |_| {
                    account.error.set(String::new());
                    account.step.set(Step::Recovery);
                }>"Забыли пароль?"</button>
            </form>
        }
        .into_any(),
        Step::SignUpCode => view! {
            <form class="sign-in confirm" on:submit=move |e| {
                e.prevent_default();
                account.send("/api/shoppers/confirm", account.sign_up_code(), Step::SignUpCode);
            }>
                <p class="sent">{sent}</p>
                {code_field}
                {error}
                <button type="submit" class="confirm-submit" disabled=busy>"Подтвердить"</button>
                <button type="button" class="link back" on:click=move |_| account.step.set(Step::SignIn)>"Назад"</button>
            </form>
        }
        .into_any(),
        Step::Recovery => view! {
            <form class="sign-in recovery" on:submit=move |e| {
                e.prevent_default();
                account.send("/api/shoppers/recovery", account.recovery_request(), Step::RecoveryCode);
            }>
                <p>"Мы пришлём код на почту счёта. С ним вы зададите новый пароль; все прежние входы в счёт завершатся."</p>
                {email_field}
                {error}
                <button type="submit" class="recovery-submit" disabled=busy>"Прислать код"</button>
                <button type="button" class="link back" on:click=move |_| account.step.set(Step::SignIn)>"Назад"</button>
            </form>
        }
        .into_any(),
        Step::RecoveryCode => view! {
            <form class="sign-in recovery-code" on:submit=move |e| {
                e.prevent_default();
                account.send("/api/shoppers/recovery/confirm", account.recovery(true), Step::RecoveryCode);
            }>
                <p class="sent">{sent}</p>
                {code_field}
                {password_field("Новый пароль (не меньше 8 знаков)", "new-password")}
                {error}
                <button type="submit" class="confirm-submit" disabled=busy>"Сменить пароль и войти"</button>
                {passkeys::supported().then(|| view! {
                    <button type="button" class="secondary recover-with-passkey" disabled=busy on:click=move |_| {
                        account.send("/api/shoppers/recovery/confirm", account.recovery(false), Step::RecoveryCode);
                    }>"Войти и создать новый ключ доступа"</button>
                })}
                <button type="button" class="link back" on:click=move |_| account.step.set(Step::Recovery)>"Назад"</button>
            </form>
        }
        .into_any(),
        Step::OfferPasskey => view! {
            <div class="sign-in offer-passkey">
                <p>"Вы вошли. Создайте ключ доступа на этом устройстве: в следующий раз вход будет без пароля и кода — отпечатком пальца, лицом или PIN-кодом устройства."</p>
                {error}
                <button type="button" class="make-passkey" disabled=busy on:click=move |_| account.make_passkey()>"Создать ключ доступа"</button>
                <button type="button" class="secondary skip-passkey" disabled=busy on:click=move |_| account.hand_over()>"Не сейчас"</button>
            </div>
        }
        .into_any(),
        Step::Done => view! {
            <p class="done" role="status">"Вы вошли. Вернитесь к заказу: это окно можно закрыть."</p>
        }
        .into_any(),
    }
    };
    view! {
        <main class="checkout full-page account-page">
            <section class="card" aria-labelledby="account-title">
                <h1 id="account-title">"Вход в счёт"</h1>
                {body}
            </section>
        </main>
    }
}
