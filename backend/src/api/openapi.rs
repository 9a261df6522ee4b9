//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` annotations and the
//! wire types of `checkout-shared`, served at `GET /api/openapi.json`, with a human page
//! (Swagger UI, vendored: nothing is fetched from elsewhere) at `/api/docs`.

use axum::Json;
use axum::Router;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, PathsBuilder, Ref, RefOr, Required};
use utoipa::{Modify, OpenApi};
use utoipa_swagger_ui::SwaggerUi;

use crate::api::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Idempotent checkout",
        description = "Keyed payments and refunds that run once however often they are sent, and events to the shop delivered at least once (Standard Webhooks).\n\nEvery POST that moves money or makes a session takes an `Idempotency-Key` header: the first request with a key runs; a retry with the same key and body gets the stored answer (`Idempotent-Replayed: true`); the same key with another body is `422 idempotency_key_reused`; a retry while the first still runs is `409 idempotency_key_in_use`. Every answer about a kept key says when it will be forgotten (`Idempotency-Key-Expires`). Errors are RFC 9457 problem+json with a stable `code` (the `ErrorCode` schema lists them all).",
    ),
    paths(
        crate::api::sessions::create,
        crate::api::sessions::get,
        crate::api::payments::create,
        crate::api::payments::get,
        crate::api::refunds::create,
        crate::api::idempotency_keys::status,
        crate::api::events::list,
        crate::api::events::get,
        crate::api::events::redeliver,
        crate::api::events::recover,
        crate::api::accounts::get,
        crate::api::shoppers::create_test_shopper,
        crate::api::shoppers::sign_up,
        crate::api::shoppers::confirm_sign_up,
        crate::api::shoppers::request_recovery,
        crate::api::shoppers::recover,
        crate::api::shoppers::sign_in,
        crate::api::shoppers::sign_out,
        crate::api::passkeys::begin_registration,
        crate::api::passkeys::register,
        crate::api::passkeys::list,
        crate::api::passkeys::begin_sign_in,
        crate::api::passkeys::sign_in,
        crate::api::shoppers::create_demo_shopper,
        crate::api::demo::create_checkout_session,
        crate::api::endpoints::get,
        crate::api::endpoints::update,
        crate::api::endpoints::roll_secret,
        crate::api::endpoints::test_event,
        crate::api::endpoints::attempts,
        crate::api::health::healthz,
        document,
    ),
    components(schemas(checkout_shared::ErrorCode, checkout_shared::EventBody)),
    modifiers(&Credentials, &Webhooks, &Links),
    tags(
        (name = "checkout sessions", description = "What a shop asks to be paid"),
        (name = "payments", description = "Shoppers pay sessions; shops refund"),
        (name = "idempotency keys", description = "What became of a key"),
        (name = "events", description = "The shop's events (webhooks) and their delivery"),
        (name = "accounts"),
        (name = "shoppers", description = "Test shoppers (anyone; test money) and live shoppers (sign-up with a code mailed to the address, recovery by a code, sign-in; live money from the operator, only to a confirmed address)"),
        (name = "demo", description = "Demo mode only (`CHECKOUT_DEMO=1`)"),
        (name = "operations"),
    )
)]
pub struct ApiDoc;

/// The two bearer credentials: a shopper's token (the widget's) and a shop's secret key.
struct Credentials;

impl Modify for Credentials {
    fn modify(&self, document: &mut Document) {
        let components = document.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(description.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            "shopper_token",
            bearer("A shopper's token: a test shopper's (`POST /api/test/shoppers`), or a live shopper's sign-in (`POST /api/shoppers/sign-in`; expires, revoked by sign-out)."),
        );
        components.add_security_scheme(
            "shop_secret_key",
            bearer("A shop's secret key in one mode, `sk_test_…` or `sk_live_…`, printed once by `checkout-server shop add`: what it makes and sees is of that mode."),
        );
    }
}

/// What the server sends to a shop's webhook URL: one entry per event type, each a signed POST.
struct Webhooks;

impl Modify for Webhooks {
    fn modify(&self, document: &mut Document) {
        let header = |name: &str, description: &str| {
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(description))
                .schema(Some(
                    utoipa::openapi::ObjectBuilder::new()
                        .schema_type(utoipa::openapi::schema::Type::String),
                ))
                .build()
        };
        let mut paths = PathsBuilder::new();
        for (event, what) in [
            (
                "payment.succeeded",
                "A payment of one of the shop's sessions; `data` is the payment, with the session's `items` and `description` (what a receipt lists).",
            ),
            (
                "refund.succeeded",
                "A refund the shop made; `data` is the refund with its `order_id` and `refunded_total`.",
            ),
            (
                "checkout_session.expired",
                "A session that lapsed unpaid; `data` is the session.",
            ),
        ] {
            let operation = OperationBuilder::new()
                .summary(Some(event))
                .description(Some(format!(
                    "{what} Sent per Standard Webhooks, at least once (retried with capped backoff and jitter until a `2xx`, then marked dead after the schedule), in order per payment. Verify the signature and the timestamp, then apply the event once: the `webhook-id` is the same on every retry, so record it in an inbox in the same transaction as the effect."
                )))
                .parameter(header("webhook-id", "The event id `evt_…`: stable across retries."))
                .parameter(header("webhook-timestamp", "Unix seconds when this attempt was signed; refuse old ones (replays)."))
                .parameter(header("webhook-signature", "`v1,<base64 HMAC-SHA256>` of `{webhook-id}.{webhook-timestamp}.{body}` with the shop's signing secret (`whsec_…`)."))
                .request_body(Some(
                    RequestBodyBuilder::new()
                        .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("EventBody"))).build())
                        .required(Some(Required::True))
                        .build(),
                ))
                .response("200", ResponseBuilder::new().description("Received (any `2xx`): never sent again"))
                .response("default", ResponseBuilder::new().description("Anything else, or no answer within the timeout: sent again later"))
                .build();
            paths = paths.path(event, PathItem::new(HttpMethod::Post, operation));
        }
        document.webhooks = Some(paths.build());
    }
}

/// How one answer leads to the next request (OpenAPI links): a new session can be paid and
/// read, a payment refunded and read. Clients and schema-driven tests follow them.
struct Links;

impl Modify for Links {
    fn modify(&self, document: &mut Document) {
        let link =
            |operation: &str, parameter: Option<(&str, &str)>, body: Option<serde_json::Value>| {
                let mut link = LinkBuilder::new().operation_id(operation);
                if let Some((name, value)) = parameter {
                    link = link.parameter(name, value);
                }
                if let Some(body) = body {
                    link = link.request_body(Some(body));
                }
                link.build()
            };
        let mut add =
            |path: &str, status: &str, name: &str, target: utoipa::openapi::link::Link| {
                let Some(item) = document.paths.paths.get_mut(path) else {
                    return;
                };
                let Some(operation) = item.post.as_mut() else {
                    return;
                };
                if let Some(RefOr::T(response)) = operation.responses.responses.get_mut(status) {
                    response.links.insert(name.to_owned(), RefOr::T(target));
                }
            };
        add(
            "/api/checkout-sessions",
            "201",
            "PaySession",
            link(
                "create_payment",
                None,
                Some(serde_json::json!({ "checkout_session_id": "$response.body#/session_id" })),
            ),
        );
        add(
            "/api/checkout-sessions",
            "201",
            "ReadSession",
            link(
                "get_checkout_session",
                Some(("session_id", "$response.body#/session_id")),
                None,
            ),
        );
        add(
            "/api/payments",
            "201",
            "RefundPayment",
            link(
                "create_refund",
                Some(("payment_id", "$response.body#/payment_id")),
                None,
            ),
        );
        add(
            "/api/payments",
            "201",
            "ReadPayment",
            link(
                "get_payment",
                Some(("payment_id", "$response.body#/payment_id")),
                None,
            ),
        );
    }
}

/// `GET /api/openapi.json`: this document.
#[utoipa::path(
    get, path = "/api/openapi.json", operation_id = "openapi_document", tag = "operations",
    summary = "This OpenAPI document",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json")),
)]
pub async fn document() -> Json<Document> {
    Json(ApiDoc::openapi())
}

/// `/api/docs`: the document as a page to read and try.
pub fn docs_page() -> Router<AppState> {
    // The page reads the document from its route above (given as a URL, not served twice).
    let page =
        SwaggerUi::new("/api/docs").config(utoipa_swagger_ui::Config::from("/api/openapi.json"));
    Router::from(page).with_state(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document as integrators get it, kept beside the code (`backend/openapi.json`): a
    /// change to it is deliberate and seen in review. `CHECKOUT_UPDATE_OPENAPI=1` rewrites it.
    #[test]
    fn the_document_is_the_one_kept_in_the_repository() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
        let now = serde_json::to_string_pretty(&ApiDoc::openapi()).unwrap() + "\n";
        if std::env::var_os("CHECKOUT_UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &now).unwrap();
        }
        let kept = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            kept == now,
            "the OpenAPI document changed; if that is meant, run with CHECKOUT_UPDATE_OPENAPI=1 \
             and commit backend/openapi.json"
        );
    }

    #[test]
    fn the_document_names_every_problem_code_both_credentials_the_key_and_the_webhooks() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(document["openapi"], "3.1.0");
        let codes = &document["components"]["schemas"]["ErrorCode"]["enum"];
        for code in [
            "invalid_request",
            "idempotency_key_reused",
            "idempotency_key_in_use",
            "insufficient_funds",
            "session_already_paid",
            "session_expired",
            "refund_exceeds_payment",
            "order_session_exists",
            "service_unavailable",
        ] {
            assert!(
                codes.as_array().unwrap().iter().any(|c| c == code),
                "{code}"
            );
        }
        let schemes = &document["components"]["securitySchemes"];
        assert_eq!(schemes["shopper_token"]["scheme"], "bearer");
        assert_eq!(schemes["shop_secret_key"]["scheme"], "bearer");
        let pay = &document["paths"]["/api/payments"]["post"];
        assert!(
            pay["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header")
        );
        let created = &pay["responses"]["201"]["headers"];
        assert!(created["Idempotency-Key-Expires"].is_object());
        assert!(created["Idempotent-Replayed"].is_object());
        let webhook = &document["webhooks"]["payment.succeeded"]["post"];
        let headers: Vec<&str> = webhook["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            headers,
            ["webhook-id", "webhook-timestamp", "webhook-signature"]
        );
    }
}
