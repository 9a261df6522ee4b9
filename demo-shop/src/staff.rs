//! Who may use the back office, and from where. The staff sign in with the one operator
//! password of the shop's settings (`SHOP_STAFF_PASSWORD_HASH`, an Argon2id hash made by
//! `demo-shop hash-password`; the password itself is never stored). A sign-in is a random token
//! in an HttpOnly, `SameSite=Strict` cookie, kept in the database only as its SHA-256, with a
//! CSRF token that every back office form carries. And no `POST` from another site is taken at
//! all: the browser says where a request came from (`Sec-Fetch-Site`, `Origin`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::Form;
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use sha2::{Digest, Sha256};

use crate::error::ShopError;
use crate::pages::{Section, layout};
use crate::{Shop, now_ms};

/// The cookie that carries a staff sign-in over plain http (the demo on one machine).
pub const COOKIE: &str = "staff";
/// Over https: host-only (no `Domain`), `Path=/`, `Secure`, so that no subdomain or plain-http
/// page can set one in its place, and the browser sends it only over https.
pub const SECURE_COOKIE: &str = "__Host-staff";

/// The sign-in cookie's name, and what it adds to `Set-Cookie`, as the shop is served.
fn cookie_kind(shop: &Shop) -> (&'static str, &'static str) {
    if shop.public_url.scheme() == "https" {
        (SECURE_COOKIE, "; Secure")
    } else {
        (COOKIE, "")
    }
}
/// How long a sign-in lasts.
const SIGN_IN_TTL_MS: i64 = 12 * 3600 * 1000;

/// The password's hash, made with Argon2id and OWASP's parameters (19 MiB, 2 passes, 1 lane:
/// the `argon2` crate's defaults), as a PHC string.
pub fn hash_password(password: &str) -> Result<String, String> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| e.to_string())
}

/// `demo-shop hash-password`: reads the password (one line) from stdin, prints its hash.
pub fn hash_password_command() -> std::process::ExitCode {
    let mut password = String::new();
    if std::io::stdin().read_line(&mut password).is_err() {
        eprintln!("demo-shop: cannot read the password from stdin");
        return std::process::ExitCode::FAILURE;
    }
    let password = password.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        eprintln!("demo-shop: the password is empty");
        return std::process::ExitCode::FAILURE;
    }
    match hash_password(password) {
        Ok(hash) => {
            println!("{hash}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("demo-shop: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Wrong passwords are counted per client address and in all, over a sliding window; only
/// wrong ones (signing in often is no guessing), and each counted before its check (guesses
/// sent at once are each counted). An address past its allowance waits; the staff at another
/// address does not. Past the allowance in all (guessing from many addresses), everyone waits.
const WINDOW: Duration = Duration::from_secs(60);
const WRONG_PER_ADDRESS: usize = 5;
const WRONG_IN_ALL: usize = 50;

/// The sign-in's wrong-password counts, and its Argon2id turns (one per core, so that a burst
/// of sign-ins cannot take every core and 19 MiB each).
#[derive(Debug)]
pub struct Guard {
    wrong: Mutex<HashMap<IpAddr, Vec<Instant>>>,
    argon2: tokio::sync::Semaphore,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            wrong: Mutex::default(),
            argon2: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
        }
    }
}

impl Guard {
    /// Counts an attempt from `address` as wrong until it is known right (`Err`: how long the
    /// address must wait).
    fn attempt(&self, address: IpAddr) -> Result<Instant, Duration> {
        let now = Instant::now();
        let mut wrong = self.wrong.lock().unwrap_or_else(|e| e.into_inner());
        wrong.retain(|_, times| {
            times.retain(|t| now.duration_since(*t) < WINDOW);
            !times.is_empty()
        });
        let in_all = wrong.values().map(Vec::len).sum::<usize>();
        let here = wrong.get(&address).map_or(&[][..], Vec::as_slice);
        let wait_for = |oldest: Option<&Instant>| {
            oldest.map_or(WINDOW, |t| WINDOW.saturating_sub(now.duration_since(*t)))
        };
        if here.len() >= WRONG_PER_ADDRESS {
            return Err(wait_for(here.iter().min()));
        }
        if in_all >= WRONG_IN_ALL {
            return Err(wait_for(wrong.values().flatten().min()));
        }
        wrong.entry(address).or_default().push(now);
        Ok(now)
    }

    /// The attempt was right: it does not count.
    fn was_right(&self, address: IpAddr, at: Instant) {
        let mut wrong = self.wrong.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(times) = wrong.get_mut(&address)
            && let Some(i) = times.iter().position(|t| *t == at)
        {
            times.swap_remove(i);
        }
    }
}

/// Checks the password against the configured hash, off the async threads (Argon2 is slow on
/// purpose), one per core at a time.
async fn password_matches(guard: &Guard, hash: Option<String>, password: String) -> bool {
    let Some(hash) = hash else { return false };
    let Ok(_turn) = guard.argon2.acquire().await else {
        return false;
    };
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash)
            .map(|parsed| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn token_hash(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

/// A signed-in member of staff, with the CSRF token their forms carry.
#[derive(Clone, Debug)]
pub struct Staff {
    pub csrf: String,
    token_hash: String,
}

impl Staff {
    /// The form's `csrf` is this sign-in's: a form from this back office, not a forged one.
    // The shop's one error type, as every handler returns it; its size is the checkout's
    // problem it may carry.
    #[allow(clippy::result_large_err)]
    pub fn check(&self, form: &HashMap<String, String>) -> Result<(), ShopError> {
        let sent = form.get("csrf").map(String::as_str).unwrap_or("");
        let same = sent.len() == self.csrf.len()
            && sent
                .bytes()
                .zip(self.csrf.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(ShopError::Forbidden(
                "Форма устарела или пришла не из бэк-офиса: обновите страницу".into(),
            ))
        }
    }
}

/// Not signed in: a page asks for the password (a form's `POST` is refused outright).
pub struct SignInFirst(Method);

impl IntoResponse for SignInFirst {
    fn into_response(self) -> Response {
        if self.0 == Method::GET {
            Redirect::to("/admin/login").into_response()
        } else {
            ShopError::Forbidden("Войдите в бэк-офис, чтобы сделать это".into()).into_response()
        }
    }
}

impl FromRequestParts<Shop> for Staff {
    type Rejection = SignInFirst;

    async fn from_request_parts(parts: &mut Parts, shop: &Shop) -> Result<Staff, SignInFirst> {
        let refuse = || SignInFirst(parts.method.clone());
        let token = cookie(&parts.headers, cookie_kind(shop).0).ok_or_else(refuse)?;
        let token_hash = token_hash(&token);
        match shop.store.staff_session(&token_hash, now_ms()).await {
            Ok(Some(csrf)) => Ok(Staff { csrf, token_hash }),
            _ => Err(refuse()),
        }
    }
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

/// `GET /admin/login`.
pub async fn login_page(State(shop): State<Shop>) -> Markup {
    sign_in_page(shop.staff_password_hash.is_some(), None)
}

fn sign_in_page(open: bool, error: Option<&str>) -> Markup {
    layout(
        "Вход в бэк-офис",
        Section::BackOffice,
        html! {
            section.panel {
                h1 { "Вход в бэк-офис" }
                @if !open {
                    p.error role="alert" {
                        "Бэк-офис закрыт: пароль персонала не задан (SHOP_STAFF_PASSWORD_HASH; его делает "
                        code { "demo-shop hash-password" } ")."
                    }
                } @else {
                    @if let Some(error) = error { p.error role="alert" { (error) } }
                    form.login method="post" action="/admin/login" {
                        label {
                            "Пароль персонала "
                            input type="password" name="password" autocomplete="current-password" required autofocus;
                        }
                        button.primary type="submit" { "Войти" }
                    }
                }
            }
        },
    )
}

/// The client's address as this server sees it (unknown: served without connection info).
pub struct ClientAddress(IpAddr);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddress(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |info| info.0.ip()),
        ))
    }
}

/// `POST /admin/login`: the password, then a sign-in cookie.
pub async fn login(
    State(shop): State<Shop>,
    ClientAddress(address): ClientAddress,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, ShopError> {
    let password = form.get("password").cloned().unwrap_or_default();
    let attempt = match shop.staff_guard.attempt(address) {
        Ok(attempt) => attempt,
        Err(wait) => {
            let seconds = wait.as_secs().max(1);
            tracing::warn!(%address, "staff sign-in refused: too many wrong passwords");
            let said =
                format!("Слишком много неверных попыток: подождите {seconds} с и попробуйте снова");
            let page = sign_in_page(shop.staff_password_hash.is_some(), Some(&said));
            return Ok((
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, seconds.to_string())],
                page,
            )
                .into_response());
        }
    };
    if !password_matches(
        &shop.staff_guard,
        shop.staff_password_hash.clone(),
        password,
    )
    .await
    {
        tracing::warn!(%address, "a wrong staff password");
        let page = sign_in_page(shop.staff_password_hash.is_some(), Some("Неверный пароль"));
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    }
    shop.staff_guard.was_right(address, attempt);
    let (token, csrf) = (random_token(), random_token());
    let now = now_ms();
    shop.store
        .open_staff_session(&token_hash(&token), &csrf, now, now + SIGN_IN_TTL_MS)
        .await?;
    let (name, secure) = cookie_kind(&shop);
    let cookie = format!(
        "{name}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
        SIGN_IN_TTL_MS / 1000
    );
    let mut response = Redirect::to("/admin").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a cookie is ASCII"),
    );
    Ok(response)
}

/// `POST /admin/logout`.
pub async fn logout(
    State(shop): State<Shop>,
    staff: Staff,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, ShopError> {
    staff.check(&form)?;
    shop.store.close_staff_session(&staff.token_hash).await?;
    let mut response = Redirect::to("/admin/login").into_response();
    let (name, secure) = cookie_kind(&shop);
    let cleared = format!("{name}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cleared).expect("a cookie is ASCII"),
    );
    Ok(response)
}

/// No `POST` that another site made the browser send: `Sec-Fetch-Site` must say the request
/// came from this very origin (or from the person, typing), and an `Origin`, if sent, must be
/// this host's. A client that sends neither (a server, a test's HTTP client) is no browser a
/// page could steer. The checkout's webhooks come from its server and are signed: let through.
pub async fn same_origin_posts_only(request: Request, next: Next) -> Response {
    if request.method() != Method::POST || request.uri().path() == crate::webhooks::ROUTE {
        return next.run(request).await;
    }
    let headers = request.headers();
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    let from_elsewhere =
        matches!(fetch_site, Some(site) if site != "same-origin" && site != "none");
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let foreign_origin = match (origin, host) {
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, rest)| rest) != Some(host),
        (Some(_), None) => true,
        _ => false,
    };
    if from_elsewhere || foreign_origin {
        tracing::warn!(?fetch_site, ?origin, path = %request.uri().path(), "a cross-site POST was refused");
        return ShopError::Forbidden(
            "Запрос пришёл с другого сайта и отклонён: действия в магазине делаются только с его страниц"
                .into(),
        )
        .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_kept_only_as_its_argon2id_hash() {
        let hash = hash_password("кофе-и-зерно").unwrap();
        assert!(
            hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{hash}"
        );
        assert!(!hash.contains("кофе"));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let guard = Guard::default();
        let matches = |hash: Option<String>, password: &str| {
            runtime.block_on(password_matches(&guard, hash, password.into()))
        };
        assert!(matches(Some(hash.clone()), "кофе-и-зерно"));
        assert!(!matches(Some(hash), "кофе"));
        assert!(!matches(None, ""));
    }
}
