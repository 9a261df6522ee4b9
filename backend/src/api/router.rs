//! The router and what surrounds every request: body limit, timeout, request id, tracing,
//! security headers, CORS, and problem+json for errors the framework produces itself. The API's
//! routes are one list ([`api_routes`]), which the OpenAPI document is checked against.

use std::{path::Path, time::Duration};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use axum::{Router, middleware};
use base64::Engine;
use checkout_shared::{
    ErrorCode, IDEMPOTENCY_KEY_EXPIRES_HEADER, IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER,
    PROBLEM_CONTENT_TYPE, Problem,
};
use sha2::{Digest, Sha256};
use tower_http::cors::{Any, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::services::ServeDir;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::api::keyed::KeyOutcome;
use crate::api::problem::problem_response;
use crate::api::state::AppState;
use crate::api::{accounts, demo, events, health, keys, openapi, payments, refunds, sessions};

pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;
/// Longer than any transaction should take; a request cut here rolls back, and its retry
/// either replays or runs afresh.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The API, the built widget at `/`, and the layers around them. `routes` and `wrap` are the
/// test and benchmark seams (see [`crate::Seams`]); the shipped server passes neither.
pub fn router(
    app: AppState,
    static_dir: &Path,
    routes: Option<Router<AppState>>,
    wrap: Option<Box<dyn FnOnce(Router) -> Router + Send>>,
) -> Router {
    let mut api = api_routes()
        .into_iter()
        .fold(Router::new(), |api, (_, path, handler)| {
            api.route(path, handler)
        })
        .merge(openapi::docs_page());
    if let Some(routes) = routes {
        api = api.merge(routes);
    }
    let mut api = api.with_state(app);
    if let Some(wrap) = wrap {
        api = wrap(api);
    }
    let api = if static_dir.is_dir() {
        api.fallback_service(ServeDir::new(static_dir).append_index_html_on_directories(true))
    } else {
        api
    };
    // Innermost first: each `layer` wraps everything above it.
    let api = api
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT_BYTES))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .layer(middleware::map_response(problem_for_bare_errors))
        .layer(middleware::from_fn(measured))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    let request_id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("-", MatchedPath::as_str);
                    tracing::info_span!(
                        "request",
                        method = %request.method(),
                        uri = %request.uri(),
                        route,
                        request_id,
                        idempotency = tracing::field::Empty,
                    )
                })
                // One line per request, with its status, latency and idempotency outcome.
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(cross_origin());
    // Outermost, so that every answer has them, the framework's own errors included.
    security_headers(static_dir)
        .into_iter()
        .fold(api, |api, (name, value)| {
            api.layer(SetResponseHeaderLayer::overriding(name, value))
        })
}

/// Every route of the API: method, path, handler. The router is built from this list, and the
/// OpenAPI document is checked against it (`openapi`'s tests), so neither can miss a route.
pub fn api_routes() -> Vec<(&'static str, &'static str, MethodRouter<AppState>)> {
    vec![
        ("POST", "/api/checkout-sessions", post(sessions::create)),
        (
            "GET",
            "/api/checkout-sessions/{session_id}",
            get(sessions::get),
        ),
        ("POST", "/api/payments", post(payments::create)),
        ("GET", "/api/payments/{payment_id}", get(payments::get)),
        (
            "POST",
            "/api/payments/{payment_id}/refunds",
            post(refunds::create),
        ),
        ("GET", "/api/idempotency-keys/{key}", get(keys::status)),
        ("GET", "/api/events", get(events::list)),
        ("GET", "/api/events/{event_id}", get(events::get)),
        (
            "POST",
            "/api/events/{event_id}/redelivery",
            post(events::redeliver),
        ),
        ("GET", "/api/account", get(accounts::get)),
        ("POST", "/api/demo/session", post(demo::create_shopper)),
        (
            "POST",
            "/api/demo/checkout-session",
            post(demo::create_checkout_session),
        ),
        ("GET", "/healthz", get(health::healthz)),
        ("GET", "/api/openapi.json", get(openapi::document)),
    ]
}

/// The widget runs in shops' pages, on their origins: its script, its WebAssembly and the API
/// it calls are open to every origin. Credentials are bearer tokens the page holds, never
/// cookies, so no origin gains anything it could not do with the token itself.
fn cross_origin() -> CorsLayer {
    let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).expect("a header name");
    CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            name(IDEMPOTENCY_KEY_HEADER),
        ])
        .expose_headers([
            header::RETRY_AFTER,
            header::LOCATION,
            header::DATE,
            name(IDEMPOTENT_REPLAYED_HEADER),
            name(IDEMPOTENCY_KEY_EXPIRES_HEADER),
            name("x-request-id"),
        ])
        .max_age(Duration::from_secs(600))
}

/// Counts and times every request by its route (as routed: `/api/payments/{payment_id}`, so
/// that ids never become labels) and its idempotency outcome.
async fn measured(request: Request, next: middleware::Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |path| path.as_str().to_owned());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let outcome = response.extensions().get::<KeyOutcome>().copied();
    if let Some(outcome) = outcome {
        crate::metrics::keyed_request(&route, outcome.as_str());
    }
    crate::metrics::request_answered(
        &route,
        outcome.map(KeyOutcome::as_str),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Errors made outside our handlers (unknown route `404`, `405`, the body limit's `413`, the
/// timeout's `408`) come without a problem body; give them one, so that every error a client
/// sees has the same shape and a `code`.
async fn problem_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_CONTENT_TYPE.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (code, detail) = match status {
        StatusCode::NOT_FOUND => (ErrorCode::NotFound, "no such resource"),
        StatusCode::METHOD_NOT_ALLOWED => (
            ErrorCode::MethodNotAllowed,
            "this method is not allowed here",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            ErrorCode::PayloadTooLarge,
            "the request body is larger than 1 MiB",
        ),
        StatusCode::REQUEST_TIMEOUT => (
            ErrorCode::RequestTimeout,
            "the request took too long; retry it with the same key",
        ),
        s if s.is_server_error() => (ErrorCode::InternalError, "internal error"),
        _ => (ErrorCode::InvalidRequest, "the request is invalid"),
    };
    let mut problem_answer = problem_response(&Problem::new(status.as_u16(), code, detail));
    // Keep the request id and any other header the layers set.
    for (name, value) in response.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem_answer
                .headers_mut()
                .insert(name.clone(), value.clone());
        }
    }
    problem_answer
}

/// A strict policy for the widget's pages: scripts, styles and connections from this origin
/// only, WebAssembly allowed to compile, no framing. The bearer token in `sessionStorage` is only
/// as safe as the page's script policy. Trunk's build loads the widget with one inline module
/// script; its SHA-256 (read from the built `index.html` at start) is the only inline script
/// allowed.
fn security_headers(static_dir: &Path) -> Vec<(HeaderName, HeaderValue)> {
    let index = std::fs::read_to_string(static_dir.join("index.html")).unwrap_or_default();
    let inline_scripts: String = inline_scripts(&index)
        .map(|script| {
            let digest = Sha256::digest(script.as_bytes());
            format!(
                " 'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        })
        .collect();
    let policy = format!(
        "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'{inline_scripts}; \
         style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    );
    vec![
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_str(&policy).expect("the policy is ASCII"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ]
}

/// The contents of `<script>` elements that have no `src`, exactly as written.
fn inline_scripts(html: &str) -> impl Iterator<Item = &str> {
    html.split("<script").skip(1).filter_map(|rest| {
        let (attributes, rest) = rest.split_once('>')?;
        let (content, _) = rest.split_once("</script>")?;
        (!attributes.contains("src=")).then_some(content)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use utoipa::OpenApi;

    #[test]
    fn only_inline_scripts_are_hashed() {
        let html = r#"<head><script type="module" nonce="x">import init from '/a.js';init();</script>
            <script src="/b.js"></script><script>
</script></head>"#;
        let found: Vec<_> = inline_scripts(html).collect();
        assert_eq!(found, ["import init from '/a.js';init();", "\n"]);
    }

    #[test]
    fn the_document_lists_every_route_the_router_serves_and_nothing_else() {
        let document = serde_json::to_value(crate::api::openapi::ApiDoc::openapi()).unwrap();
        let mut documented = BTreeSet::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<(String, String)> = api_routes()
            .into_iter()
            .map(|(method, path, _)| (method.to_owned(), path.to_owned()))
            .collect();
        assert_eq!(documented, served);
    }
}
