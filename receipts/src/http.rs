//! `GET /receipts` (JSON, newest first; `?payment_id=`, `?limit=` up to 10 000, and the next
//! page by `?starting_after=` the `next_page` of the last), `GET /health`, `GET /metrics`
//! (Prometheus).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use crate::store::Store;

#[derive(Clone)]
pub struct App {
    pub store: Store,
    pub metrics: PrometheusHandle,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/receipts", get(receipts))
        .route("/health", get(|| async { Json(json!({ "status": "ok" })) }))
        .route(
            "/metrics",
            get(|State(app): State<App>| async move { app.metrics.render() }),
        )
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
