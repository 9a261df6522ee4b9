//! The shop's dashboard, `/dashboard`: what a shop's staff use every day, on the checkout's own
//! origin, rendered by the server (no script at all), in Russian, readable on a phone.
//!
//! - [`sign_in`]: an invitation's link sets a password; sign-in and «Выйти».
//! - [`payments`]: payments searched, a payment with its ledger, refunds and events; a keyed
//!   refund (the form carries its key: a double click or a resend refunds once).
//! - [`webhooks`]: events and each delivery attempt, resend, recover since a time; the
//!   endpoint per mode, its signing secret rolled with an overlap.
//! - [`staff`]: members, roles, invitations, the audit log.
//! - [`charts`]: the days' payments, refunds and delivery success as SVG drawn here.
//!
//! A sign-in is a random token in an HttpOnly `SameSite=Strict` cookie, stored as its hash.
//! Every form carries a CSRF token derived from it (never stored), and no `POST` whose browser
//! says it came from another site is taken. Each page is framed by no one
//! (`frame-ancestors 'none'`) and runs no script.

pub mod charts;
pub mod payments;
pub mod sign_in;
pub mod staff;
pub mod webhooks;

use std::collections::HashMap;

use axum::Router;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};
use sha2::{Digest, Sha256};

use crate::api::state::AppState;
use crate::operations::error::OperationError;
use crate::operations::staff::{Member, Role};
use crate::store::ShopRow;

/// The sign-in cookie over plain http (a checkout on one machine).
const COOKIE: &str = "dashboard";
/// Over https: host-only, `Secure`, `Path=/`: no subdomain or plain-http page can set it.
const SECURE_COOKIE: &str = "__Host-dashboard";

/// The pages' own policy: their stylesheet, pictures drawn inline, forms to themselves; no
/// script, no frame around them.
const POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
                      form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLESHEET: &str = include_str!("dashboard.css");

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/dashboard", get(payments::overview))
        .route("/dashboard/dashboard.css", get(stylesheet))
        .route(
            "/dashboard/sign-in",
            get(sign_in::sign_in_page).post(sign_in::sign_in),
        )
        .route("/dashboard/sign-out", post(sign_in::sign_out))
        .route(
            "/dashboard/invite/{token}",
            get(sign_in::invite_page).post(sign_in::accept_invite),
        )
        .route("/dashboard/payments", get(payments::list))
        .route("/dashboard/payments/{payment_id}", get(payments::show))
        .route(
            "/dashboard/payments/{payment_id}/refunds",
            post(payments::refund),
        )
        .route("/dashboard/events", get(webhooks::events))
        .route("/dashboard/events/recovery", post(webhooks::recover))
        .route("/dashboard/events/{event_id}", get(webhooks::event))
        .route(
            "/dashboard/events/{event_id}/redelivery",
            post(webhooks::redeliver),
        )
        .route(
            "/dashboard/webhooks",
            get(webhooks::endpoint).post(webhooks::set_endpoint),
        )
        .route("/dashboard/webhooks/secret", post(webhooks::roll_secret))
        .route("/dashboard/webhooks/state", post(webhooks::set_state))
        .route("/dashboard/webhooks/test-event", post(webhooks::test_event))
        .route("/dashboard/staff", get(staff::members))
        .route("/dashboard/staff/invitations", post(staff::invite))
        .route("/dashboard/staff/{staff_id}", post(staff::change))
        .route("/dashboard/audit", get(staff::audit))
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        STYLESHEET,
    )
        .into_response()
}

/// Test or live: every page shows one mode's money, named in its address (`?mode=live`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Test,
    Live,
}

impl Mode {
    pub fn of(query: &HashMap<String, String>) -> Mode {
        match query.get("mode").map(String::as_str) {
            Some("live") => Mode::Live,
            _ => Mode::Test,
        }
    }

    pub fn livemode(self) -> bool {
        self == Mode::Live
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Test => "test",
            Mode::Live => "live",
        }
    }

    /// `path` in this mode.
    pub fn href(self, path: &str) -> String {
        let joiner = if path.contains('?') { '&' } else { '?' };
        format!("{path}{joiner}mode={}", self.as_str())
    }
}

/// A signed-in member, from the request's cookie; none (or an ended sign-in) sends the browser
/// to the sign-in page.
pub struct Signed {
    pub member: Member,
    token: String,
}

impl Signed {
    /// The token every form of this sign-in carries: derived from the cookie's token, which a
    /// page of another site can neither read nor guess.
    pub fn csrf(&self) -> String {
        csrf_of(&self.token)
    }

    /// A form came from this sign-in's own pages: its CSRF token matches (in constant time).
    pub fn check(&self, form: &HashMap<String, String>) -> Result<(), Failure> {
        let sent = form.get("csrf").map(String::as_bytes).unwrap_or_default();
        let expected = self.csrf();
        let same = sent.len() == expected.len()
            && sent
                .iter()
                .zip(expected.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Failure::Shown(
                StatusCode::FORBIDDEN,
                "Форма устарела или пришла не из кабинета: обновите страницу и повторите".into(),
            ))
        }
    }

    /// The shop's account in `mode`.
    pub async fn shop(&self, app: &AppState, mode: Mode) -> Result<ShopRow, Failure> {
        app.store
            .shop(&self.member.shop_id, mode.livemode())
            .await
            .map_err(OperationError::from)?
            .ok_or_else(|| Failure::Shown(StatusCode::NOT_FOUND, "Магазин не найден".into()))
    }

    /// A form this member posted from its own pages, its role at least `role`: the fields,
    /// and the mode they act in.
    pub fn posted(
        &self,
        form: Posted,
        role: Role,
    ) -> Result<(HashMap<String, String>, Mode), Failure> {
        let fields = form_fields(form)?;
        self.check(&fields)?;
        self.may(role)?;
        let mode = Mode::of(&fields);
        Ok((fields, mode))
    }

    /// Only a role at least `role` goes on.
    pub fn may(&self, role: Role) -> Result<(), Failure> {
        self.member.may(role).map(|_| ()).map_err(Failure::from)
    }
}

fn csrf_of(token: &str) -> String {
    format!("{:x}", Sha256::digest(format!("csrf:{token}").as_bytes()))
}

fn cookie_token(headers: &HeaderMap, https: bool) -> Option<String> {
    let name = if https { SECURE_COOKIE } else { COOKIE };
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_owned())
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Response> {
        let token = cookie_token(&parts.headers, app.https());
        let member = match &token {
            Some(token) => {
                crate::operations::staff::authenticate(&app.store, app.principals.limits(), token)
                    .await
                    .map_err(|e| Failure::from(e).into_response())?
            }
            None => None,
        };
        match (member, token) {
            (Some(member), Some(token)) => {
                // A POST from another site's page is refused before its form is even read.
                let cross_site = parts
                    .headers
                    .get("sec-fetch-site")
                    .is_some_and(|v| v.as_bytes() == b"cross-site");
                if parts.method == axum::http::Method::POST && cross_site {
                    return Err(Failure::Shown(
                        StatusCode::FORBIDDEN,
                        "Запрос пришёл с чужого сайта".into(),
                    )
                    .into_response());
                }
                Ok(Signed { member, token })
            }
            _ => Err(Redirect::to("/dashboard/sign-in").into_response()),
        }
    }
}

impl OptionalFromRequestParts<AppState> for Signed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &AppState,
    ) -> Result<Option<Self>, Response> {
        match <Signed as FromRequestParts<AppState>>::from_request_parts(parts, app).await {
            Ok(signed) => Ok(Some(signed)),
            Err(response) if response.status() == StatusCode::SEE_OTHER => Ok(None),
            Err(response) => Err(response),
        }
    }
}

/// The cookie that signs a browser in, and the one that signs it out.
fn sign_in_cookie(app: &AppState, token: &str) -> HeaderValue {
    let (name, secure) = if app.https() {
        (SECURE_COOKIE, "; Secure")
    } else {
        (COOKIE, "")
    };
    HeaderValue::from_str(&format!(
        "{name}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"
    ))
    .expect("a token is ASCII")
}

fn sign_out_cookie(app: &AppState) -> HeaderValue {
    let (name, secure) = if app.https() {
        (SECURE_COOKIE, "; Secure")
    } else {
        (COOKIE, "")
    };
    HeaderValue::from_str(&format!(
        "{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"
    ))
    .expect("ASCII")
}

/// Why a page could not be shown: a message for the person, with its status.
#[derive(Debug)]
pub enum Failure {
    Shown(StatusCode, String),
}

impl From<OperationError> for Failure {
    fn from(error: OperationError) -> Failure {
        let (status, _) = error.status_and_code();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = match &error {
            OperationError::Forbidden(message) | OperationError::InvalidRequest(message) => {
                message.clone()
            }
            OperationError::NotFound(_) => "Не найдено".into(),
            OperationError::InvalidCredentials | OperationError::Unauthorized => {
                "Неверная почта или пароль".into()
            }
            OperationError::TooManyRequests(secs) => {
                format!("Слишком много попыток; повторите через {secs} с")
            }
            OperationError::MailUnavailable => {
                "Письмо не отправлено: почтовый сервер недоступен; повторите позже".into()
            }
            OperationError::KeyInUse => "Этот запрос ещё выполняется; обновите страницу".into(),
            _ => {
                tracing::warn!(%error, "a dashboard page failed");
                "Что-то пошло не так; повторите чуть позже".into()
            }
        };
        Failure::Shown(status, message)
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(error: crate::store::StoreError) -> Failure {
        Failure::from(OperationError::from(error))
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let Failure::Shown(status, message) = self;
        let content = html! {
            section.panel {
                h1 { "Не получилось" }
                p.error role="alert" { (message) }
                p { a href="/dashboard" { "В кабинет" } }
            }
        };
        let mut response = page("Ошибка", None, Mode::Test, Section::None, content);
        *response.status_mut() = status;
        response
    }
}

pub type PageResult = Result<Response, Failure>;

/// Which part of the dashboard a page is, for the menu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    None,
    Overview,
    Payments,
    Events,
    Webhooks,
    Staff,
}

/// A whole page: the menu (for a signed-in member), the mode switch, the content; with the
/// pages' policy.
pub fn page(
    title: &str,
    signed: Option<&Signed>,
    mode: Mode,
    section: Section,
    content: Markup,
) -> Response {
    let menu = [
        (Section::Overview, "/dashboard", "Обзор"),
        (Section::Payments, "/dashboard/payments", "Платежи"),
        (Section::Events, "/dashboard/events", "События"),
        (Section::Webhooks, "/dashboard/webhooks", "Вебхуки"),
        (Section::Staff, "/dashboard/staff", "Команда"),
    ];
    let here = menu
        .iter()
        .find(|(s, _, _)| *s == section)
        .map_or("/dashboard", |(_, path, _)| path);
    let markup = html! {
        (DOCTYPE)
        html lang="ru" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " — кабинет магазина" }
                link rel="icon" href="data:,";
                link rel="stylesheet" href="/dashboard/dashboard.css";
            }
            body data-mode=(mode.as_str()) {
                header.top {
                    div.brand {
                        "Кабинет магазина"
                        @if let Some(signed) = signed {
                            " · " span.shop-name { (signed.member.shop_name) }
                        }
                    }
                    @if let Some(signed) = signed {
                        nav aria-label="Разделы" {
                            @for (s, path, name) in menu {
                                a href=(mode.href(path)) aria-current=[(s == section).then_some("page")] { (name) }
                            }
                        }
                        div.who {
                            span { (signed.member.email) " (" (signed.member.role.title()) ")" }
                            form method="post" action="/dashboard/sign-out" {
                                input type="hidden" name="csrf" value=(signed.csrf());
                                button.link type="submit" { "Выйти" }
                            }
                        }
                    }
                }
                @if signed.is_some() {
                    nav.modes aria-label="Режим" {
                        a href=(Mode::Test.href(here)) aria-current=[(mode == Mode::Test).then_some("page")] { "Тестовые деньги" }
                        a href=(Mode::Live.href(here)) aria-current=[(mode == Mode::Live).then_some("page")] { "Настоящие деньги" }
                    }
                }
                main { (content) }
            }
        }
    };
    let mut response = markup.into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    response
}

/// A form's hidden fields every `POST` of a page carries: the CSRF token and the mode.
pub fn hidden(signed: &Signed, mode: Mode) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(signed.csrf());
        input type="hidden" name="mode" value=(mode.as_str());
    }
}

/// Kopecks as the staff read them: `1 234,50 ₽`.
pub fn rub(kopecks: i64) -> String {
    checkout_shared::format_rub(kopecks)
}

/// Moscow time, as the staff read it.
pub fn when(ms: i64) -> String {
    use time::macros::format_description;
    let moscow = time::UtcOffset::from_hms(3, 0, 0).expect("UTC+3");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map(|t| {
            t.to_offset(moscow)
                .format(format_description!(
                    "[day].[month].[year] [hour]:[minute]:[second]"
                ))
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// A posted form as a handler takes it: its fields, or why the body is not one.
pub type Posted =
    Result<axum::Form<HashMap<String, String>>, axum::extract::rejection::FormRejection>;

/// A form's fields, or a clear page for a body that is not one.
pub fn form_fields(form: Posted) -> Result<HashMap<String, String>, Failure> {
    form.map(|f| f.0).map_err(|_| {
        Failure::Shown(
            StatusCode::BAD_REQUEST,
            "Форма пришла неполной; обновите страницу и повторите".into(),
        )
    })
}

/// A redirect after a `POST` (303: the browser then asks with `GET`).
pub fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}
