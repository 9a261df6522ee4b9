//! `GET /receipts` (JSON, newest first; `?payment_id=`, `?limit=` up to 10 000, and the next
//! page by `?starting_after=` the `next_page` of the last), `GET /health`, `GET /metrics`
//! (Prometheus). The receipts and the metrics ask for `Authorization: Bearer RECEIPTS_TOKEN`
//! (its SHA-256 compared in constant time); `/health` is open.

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::store::Store;

#[derive(Clone)]
pub struct App {
    pub store: Store,
    pub metrics: PrometheusHandle,
    pub token: TokenDigest,
}

/// The SHA-256 of the token asked for; `None`: none is asked (a loopback address only).
#[derive(Clone, Copy)]
pub struct TokenDigest(Option<[u8; 32]>);

impl TokenDigest {
    pub fn of(token: Option<&str>) -> TokenDigest {
        TokenDigest(token.map(|t| Sha256::digest(t.as_bytes()).into()))
    }

    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = self.0 else { return true };
        let Some(sent) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        else {
            return false;
        };
        let sent: [u8; 32] = Sha256::digest(sent.trim().as_bytes()).into();
        sent.iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

pub fn router(app: App) -> Router {
    let token = app.token;
    let guarded = Router::new()
        .route("/receipts", get(receipts))
        .route(
            "/metrics",
            get(|State(app): State<App>| async move { app.metrics.render() }),
        )
        .layer(middleware::from_fn(
            move |request: Request, next: Next| async move {
                if token.admits(request.headers()) {
                    next.run(request).await
                } else {
                    let mut refused = problem(
                        StatusCode::UNAUTHORIZED,
                        "send Authorization: Bearer with the receipts' token (RECEIPTS_TOKEN)",
                    );
                    refused
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                    refused
                }
            },
        ));
    guarded
        .route("/health", get(|| async { Json(json!({ "status": "ok" })) }))
        .with_state(app)
}

#[derive(Deserialize)]
struct ReceiptsQuery {
    payment_id: Option<String>,
    starting_after: Option<String>,
    limit: Option<i64>,
}

const MAX_LIMIT: i64 = 10_000;

async fn receipts(
    State(app): State<App>,
    query: Result<Query<ReceiptsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return problem(
            StatusCode::BAD_REQUEST,
            "payment_id is text, limit a number",
        );
    };
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("limit must be from 1 to {MAX_LIMIT}"),
        );
    }
    // One more than asked: whether there is a next page.
    let listed = app
        .store
        .receipts(
            query.payment_id.as_deref(),
            query.starting_after.as_deref(),
            limit + 1,
        )
        .await;
    let totals = app.store.totals().await;
    match (listed, totals) {
        (Ok(mut receipts), Ok(totals)) => {
            let has_more = receipts.len() as i64 > limit;
            receipts.truncate(limit as usize);
            let next_page = receipts
                .last()
                .filter(|_| has_more)
                .map(|r| r.receipt_id.clone());
            Json(json!({
                "receipts": receipts,
                "has_more": has_more,
                "next_page": next_page,
                "totals": totals,
            }))
            .into_response()
        }
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, "listing receipts failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the receipts' database is not answering",
            )
        }
    }
}

fn problem(status: StatusCode, detail: &str) -> Response {
    (
        status,
        [("content-type", "application/problem+json")],
        json!({ "title": status.canonical_reason(), "status": status.as_u16(), "detail": detail })
            .to_string(),
    )
        .into_response()
}
