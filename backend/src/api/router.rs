//! The router and what surrounds every request: body limit, timeout, request id, tracing,
//! security headers, and problem+json for errors the framework produces itself. The API's
//! routes are one list ([`api_routes`]), which the OpenAPI document is checked against; the
//! checkout's own pages and the widget's files are [`site`](crate::api::site)'s.
//!
//! No CORS: a browser calls the API only from the checkout's own pages (the payment page, on
//! this origin); shops call it from their servers.

use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use axum::{Router, middleware};
use checkout_shared::{ErrorCode, PROBLEM_CONTENT_TYPE, Problem};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::api::keyed_requests::KeyOutcome;
use crate::api::problem::problem_response;
use crate::api::site::{self, Framable};
use crate::api::state::AppState;
use crate::api::{
    accounts, dashboard, demo, endpoints, events, health, idempotency_keys, openapi, passkeys,
    payments, refunds, sessions, shoppers,
};

pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;
/// Longer than any transaction should take; a request cut here rolls back, and its retry
/// either replays or runs afresh.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The API, the payment page, the widget's files, and the layers around them. `routes` and
/// `wrap` are the test and benchmark seams (see [`crate::Seams`]); the shipped server passes
/// neither.
pub fn router(
    app: AppState,
    routes: Option<Router<AppState>>,
    wrap: Option<Box<dyn FnOnce(Router) -> Router + Send>>,
) -> Router {
    let mut api = api_routes()
        .into_iter()
        .fold(Router::new(), |api, (_, path, handler)| {
            api.route(path, handler)
        })
        .merge(openapi::docs_page())
        .route("/pay/{session_id}", get(site::pay_page))
        .route("/account", get(site::account_page))
        .merge(dashboard::routes())
        .route(site::LOADER, get(site::loader))
        .fallback(site::files);
    if let Some(routes) = routes {
        api = api.merge(routes);
    }
    let policy = HeaderValue::from_str(&app.site.policy("'none'")).expect("the policy is ASCII");
    let https = app.https();
    let mut api = api.with_state(app);
    if let Some(wrap) = wrap {
        api = wrap(api);
    }
    // Innermost first: each `layer` wraps everything above it.
    api.layer(RequestBodyLimitLayer::new(BODY_LIMIT_BYTES))
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
        // Outermost, so that every answer has them, the framework's own errors included.
        .layer(middleware::map_response(move |response| {
            security_headers(response, policy.clone(), https)
        }))
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
        (
            "GET",
            "/api/idempotency-keys/{key}",
            get(idempotency_keys::status),
        ),
        ("GET", "/api/events", get(events::list)),
        ("GET", "/api/events/{event_id}", get(events::get)),
        ("POST", "/api/events/recovery", post(events::recover)),
        (
            "POST",
            "/api/events/{event_id}/redelivery",
            post(events::redeliver),
        ),
        (
            "GET",
            "/api/events/{event_id}/attempts",
            get(endpoints::attempts),
        ),
        ("GET", "/api/webhook-endpoint", get(endpoints::get)),
        ("POST", "/api/webhook-endpoint", post(endpoints::update)),
        (
            "POST",
            "/api/webhook-endpoint/signing-secret",
            post(endpoints::roll_secret),
        ),
        (
            "POST",
            "/api/webhook-endpoint/test-event",
            post(endpoints::test_event),
        ),
        ("GET", "/api/account", get(accounts::get)),
        (
            "POST",
            "/api/test/shoppers",
            post(shoppers::create_test_shopper),
        ),
        ("POST", "/api/shoppers", post(shoppers::sign_up)),
        (
            "POST",
            "/api/shoppers/confirm",
            post(shoppers::confirm_sign_up),
        ),
        (
            "POST",
            "/api/shoppers/recovery",
            post(shoppers::request_recovery),
        ),
        (
            "POST",
            "/api/shoppers/recovery/confirm",
            post(shoppers::recover),
        ),
        ("POST", "/api/shoppers/sign-in", post(shoppers::sign_in)),
        ("POST", "/api/shoppers/sign-out", post(shoppers::sign_out)),
        (
            "POST",
            "/api/shoppers/passkeys/registration",
            post(passkeys::begin_registration),
        ),
        ("GET", "/api/shoppers/passkeys", get(passkeys::list)),
        ("POST", "/api/shoppers/passkeys", post(passkeys::register)),
        (
            "POST",
            "/api/shoppers/passkeys/authentication",
            post(passkeys::begin_sign_in),
        ),
        (
            "POST",
            "/api/shoppers/passkeys/sign-in",
            post(passkeys::sign_in),
        ),
        (
            "POST",
            "/api/demo/session",
            post(shoppers::create_demo_shopper),
        ),
        (
            "POST",
            "/api/demo/checkout-session",
            post(demo::create_checkout_session),
        ),
        ("GET", "/healthz", get(health::healthz)),
        ("GET", "/api/openapi.json", get(openapi::document)),
    ]
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
    // A problem already, or a page made for a person (the dashboard's error pages).
    let has_body = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| {
            v.as_bytes().starts_with(PROBLEM_CONTENT_TYPE.as_bytes())
                || v.as_bytes().starts_with(b"text/html")
        });
    if !(status.is_client_error() || status.is_server_error()) || has_body {
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

/// Every answer: a strict content security policy (the checkout's pages' own, framed by no one,
/// unless the answer set its own: the payment page), `nosniff`, no referrer, and
/// `X-Frame-Options: DENY` except on a page that may be framed; `no-store` unless it says how it
/// may be cached (the API's answers carry tokens and balances: no cache keeps them); HSTS when
/// the checkout is served over https.
async fn security_headers(mut response: Response, policy: HeaderValue, https: bool) -> Response {
    let framable = response.extensions().get::<Framable>().is_some_and(|f| f.0);
    let headers = response.headers_mut();
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    if https {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000; includeSubDomains"),
        );
    }
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !framable {
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use utoipa::OpenApi;

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
