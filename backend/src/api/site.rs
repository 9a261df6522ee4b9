//! The checkout's own pages and the widget's files (from [`assets`](crate::api::assets)):
//!
//! - `GET /pay/{session_id}`: the payment page (the widget for that session). A shop's page
//!   frames it (`/v1/checkout.js` makes the frame), or sends the shopper to it as a full page.
//!   Only the origins its shop registered may frame it (`frame-ancestors`); the page learns the
//!   origin it may talk to (`?parent=`) only if it is one of them.
//! - `GET /account`: the account window (a live shopper's sign-in), top-level only.
//! - `GET /v1/checkout.js`: the loader a shop's page adds; a versioned name, a short cache.
//! - The widget's code, WebAssembly and styles under content-hashed names: cached for a year
//!   (`immutable`), each sent brotli- or gzip-compressed as the browser accepts.

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use checkout_shared::CheckoutSession;

use crate::api::assets::{self, Site};
use crate::api::extract::SessionIdPath;
use crate::api::state::AppState;
use crate::clock;
use crate::operations::sessions::public_view;
use crate::operations::urls;

#[derive(Debug, Deserialize)]
pub struct PayQuery {
    /// The origin of the page that framed this one, as the loader says it.
    #[serde(default)]
    parent: Option<String>,
}

/// `GET /pay/{session_id}`: the payment page. Framable by the session's shop's registered
/// origins only; it talks (`postMessage`) to its parent only if the parent is one of them. An
/// unknown session's page may be framed by anyone: it only says the session is unknown.
pub async fn pay_page(
    State(app): State<AppState>,
    SessionIdPath(session_id): SessionIdPath,
    Query(query): Query<PayQuery>,
) -> Response {
    let claimed = query.parent.as_deref().and_then(|p| urls::origin(p).ok());
    let (ancestors, parent, session) = match app.store.session(&session_id).await {
        Ok(Some(session)) => {
            let ancestors = if session.shop_origins.is_empty() {
                "'none'".to_owned()
            } else {
                session.shop_origins.join(" ")
            };
            let parent = claimed.filter(|origin| session.shop_origins.contains(origin));
            (
                ancestors,
                parent,
                Some(public_view(session, clock::now_ms())),
            )
        }
        Ok(None) => ("*".to_owned(), claimed, None),
        Err(error) => return crate::operations::error::OperationError::from(error).into_response(),
    };
    page(&app.site, &ancestors, parent.as_deref(), session.as_ref())
}

/// The page, with the parent it may talk to (if any) in a `<meta>` and the session as
/// `GET /api/checkout-sessions/{id}` would answer now (a round trip the widget need not make
/// before it can offer «Оплатить»), both read by the widget.
fn page(
    site: &Site,
    frame_ancestors: &str,
    parent: Option<&str>,
    session: Option<&CheckoutSession>,
) -> Response {
    if site.page().is_empty() {
        return StatusCode::NOT_FOUND.into_response();
    }
    let mut head = String::new();
    if let Some(origin) = parent {
        // An origin as `urls::origin` wrote it; escaped all the same, as any attribute.
        let origin = attribute(origin);
        head += &format!("<meta name=\"checkout-parent\" content=\"{origin}\" />\n");
    }
    if let Some(session) = session {
        // JSON in a data block: `<` escaped, so no text of the shop's can close the element.
        let json = serde_json::to_string(session)
            .unwrap_or_default()
            .replace('<', "\\u003c");
        head +=
            &format!("<script type=\"application/json\" id=\"checkout-session\">{json}</script>\n");
    }
    let html = site
        .page()
        .replacen("</head>", &format!("{head}</head>"), 1);
    let mut response = html_page(html, &site.policy(frame_ancestors));
    response
        .extensions_mut()
        .insert(Framable(frame_ancestors != "'none'"));
    response
}

/// `text` as an HTML attribute's value (between double quotes).
fn attribute(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `GET /account`: the account window, where a live shopper signs in, signs up (the code from
/// the mail) or recovers the account, with a password or a passkey. Top-level only (`frame-
/// ancestors 'none'`): the address bar shows the checkout's origin, and no shop's page can
/// draw over it. No `Cross-Origin-Opener-Policy`: the payment page in a shop's frame that
/// opened it must stay its `opener`, to be handed the sign-in (to this origin only).
pub async fn account_page(State(app): State<AppState>) -> Response {
    let page = app.site.account();
    if page.html().is_empty() {
        return StatusCode::NOT_FOUND.into_response();
    }
    html_page(page.html().to_owned(), &page.policy("'none'"))
}

/// One of the checkout's pages: asked afresh each time (`no-cache`), with its own policy.
fn html_page(html: String, policy: &str) -> Response {
    let mut response = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        html,
    )
        .into_response();
    if let Ok(policy) = HeaderValue::from_str(policy) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    response
}

/// Set on an answer that carries its own `frame-ancestors`: no `X-Frame-Options: DENY` then.
#[derive(Clone, Copy, Debug)]
pub struct Framable(pub bool);

/// Where a shop's page loads the loader from.
pub const LOADER: &str = "/v1/checkout.js";

/// `GET /v1/checkout.js`: the loader, with the checkout's origin written in by the server that
/// sends it. It never guesses it from the page, where any script element may be named like it.
pub async fn loader(State(app): State<AppState>, request: Request) -> Response {
    let asked = request
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| request.headers().get(header::HOST)?.to_str().ok());
    let origin = checkout_origin(&app.public_origin, asked);
    match app.site.loader(&origin) {
        Some(file) => file_response(&app, file, request.uri().path(), request.headers()).await,
        None => not_found(),
    }
}

/// The checkout's origin: the public one; under the development default (`http://localhost`,
/// any port), the one the browser asked (its `Host`: a host and a port, nothing else).
fn checkout_origin(public: &url::Url, asked: Option<&str>) -> String {
    let public_origin = public.origin().ascii_serialization();
    if public.host_str() != Some("localhost") {
        return public_origin;
    }
    asked
        .filter(|host| {
            host.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        })
        .and_then(|host| url::Url::parse(&format!("{}://{host}", public.scheme())).ok())
        .filter(|url| {
            url.path() == "/"
                && url.username().is_empty()
                && url.password().is_none()
                && url.query().is_none()
                && url.fragment().is_none()
        })
        .map(|url| url.origin().ascii_serialization())
        .unwrap_or(public_origin)
}

fn not_found() -> Response {
    crate::api::problem::problem_response(&checkout_shared::Problem::new(
        404,
        checkout_shared::ErrorCode::NotFound,
        "no such resource",
    ))
}

/// Everything else that is not the API: the dev page at `/`, the widget's files.
pub async fn files(State(app): State<AppState>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if path == "/" {
        return dev_page(&app).await;
    }
    match app.site.file(&path) {
        Some(file) => file_response(&app, file, request.uri().path(), request.headers()).await,
        None => not_found(),
    }
}

/// A file of the widget's as asked: compressed as accepted, cached as its name allows.
async fn file_response(
    app: &AppState,
    file: assets::File,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Response {
    let encoding = assets::accepted(headers).filter(|_| assets::compressible(&file.path));
    let from_v1 = path.starts_with("/v1/");
    let name = file
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let content_type = match file.path.extension().and_then(|e| e.to_str()) {
        Some("wasm") => "application/wasm",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("html") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    };
    // Trunk names each build's files by their content: such a name never changes meaning.
    let cache = if assets::is_content_hashed(&name) {
        "public, max-age=31536000, immutable"
    } else {
        "public, max-age=300"
    };
    let body = match encoding {
        // Compressing is work for a blocking thread, not for the server's workers.
        Some(encoding) => {
            let site = app.site.clone();
            match tokio::task::spawn_blocking(move || site.compressed(&file, encoding)).await {
                Ok(bytes) => Body::from(bytes),
                Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
        }
        None => Body::from(file.raw),
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    // A shop may measure what its page downloads from the checkout (the loader's transfer size).
    headers.insert("timing-allow-origin", HeaderValue::from_static("*"));
    // The loader is public and a shop may load it as a module, which browsers fetch in CORS
    // mode. Only the loader: the frame's own files are same-origin, the API answers no origin.
    if from_v1 {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
    }
    if let Some(encoding) = encoding {
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(encoding.name()),
        );
    }
    response
}

/// `/` in demo mode: a new session of the demo shop, and its payment page as a full page (a
/// refresh stays on that purchase; `/` again starts another).
async fn dev_page(app: &AppState) -> Response {
    if crate::api::demo::demo_only(app).is_err() || app.site.page().is_empty() {
        return crate::api::problem::problem_response(&checkout_shared::Problem::new(
            404,
            checkout_shared::ErrorCode::NotFound,
            "no such resource (the demo page needs CHECKOUT_DEMO=1)",
        ));
    }
    match crate::api::demo::demo_session(app, 0).await {
        Ok(session) => {
            axum::response::Redirect::to(&format!("/pay/{}", session.session_id)).into_response()
        }
        Err(error) => error.into_response(),
    }
}
