//! What an operator watches, in the Prometheus text format. Everything is recorded through the
//! `metrics` facade (a no-op unless the exporter is installed), with every name in this file;
//! `GET /metrics` is served on `CHECKOUT_METRICS_ADDR` only, never beside the public API.
//!
//! Gauges that describe the database (outbox depth, pool use) are read when scraped, so a
//! scrape always sees the present.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::clock;
use crate::keyed::KeyOutcome;
use crate::store::Store;

/// Latency buckets (seconds): a replay answers in well under a millisecond, a payment over
/// PostgreSQL in a few, and the timeout is 30 s.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];
/// Group-commit batch sizes (units per SQLite commit), up to the batch limit.
const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0, 1000.0];

/// A keyed request, by route and how its key settled it.
pub fn keyed_request(route: &str, outcome: KeyOutcome) {
    metrics::counter!(
        "checkout_keyed_requests_total",
        "route" => route.to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(1);
}

/// A payment or refund refused as its outcome (stored, replayed as such), by problem `code`.
pub fn decline(code: &str) {
    metrics::counter!("checkout_declines_total", "code" => code.to_owned()).increment(1);
}

/// Any request, answered: its latency by route, idempotency outcome (`unkeyed` for the rest)
/// and status class.
pub fn request_answered(route: &str, outcome: Option<KeyOutcome>, status: u16, took: Duration) {
    let outcome = outcome.map_or("unkeyed", KeyOutcome::as_str);
    let class = match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics::histogram!(
        "checkout_request_duration_seconds",
        "route" => route.to_owned(),
        "outcome" => outcome,
        "status" => class,
    )
    .record(took.as_secs_f64());
}

/// One SQLite commit, shared by `units` requests' units of work.
pub fn group_commit(units: usize) {
    metrics::histogram!("checkout_sqlite_group_commit_units").record(units as f64);
}

/// Expired idempotency keys deleted by the sweeper.
pub fn keys_swept(count: u64) {
    metrics::counter!("checkout_keys_swept_total").increment(count);
}

/// How a webhook delivery attempt ended.
#[derive(Clone, Copy, Debug)]
pub enum Delivery {
    Delivered,
    Retry,
    Dead,
}

pub fn delivery(result: Delivery) {
    let result = match result {
        Delivery::Delivered => "delivered",
        Delivery::Retry => "retry",
        Delivery::Dead => "dead",
    };
    metrics::counter!("checkout_webhook_deliveries_total", "result" => result).increment(1);
}

/// Installs the exporter (the process's one recorder) and serves `GET /metrics` on `addr`.
pub async fn serve(addr: SocketAddr, store: Store) -> std::io::Result<()> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("checkout_request_duration_seconds".into()),
            &LATENCY_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(
                    "checkout_sqlite_group_commit_units".into(),
                ),
                &BATCH_BUCKETS,
            )
        })
        .map_err(std::io::Error::other)?
        .install_recorder()
        .map_err(std::io::Error::other)?;
    describe();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    let router = Router::new()
        .route("/metrics", get(scrape))
        .with_state((handle, store));
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the metrics listener stopped");
        }
    });
    Ok(())
}

async fn scrape(State((handle, store)): State<(PrometheusHandle, Store)>) -> impl IntoResponse {
    let pool = store.pool_usage();
    metrics::gauge!("checkout_db_connections_in_use").set(pool.in_use as f64);
    metrics::gauge!("checkout_db_waiting").set(pool.waiting as f64);
    match store.outbox_backlog().await {
        Ok(backlog) => {
            let age_ms = backlog
                .oldest_created_at_ms
                .map_or(0, |created| (clock::now_ms() - created).max(0));
            metrics::gauge!("checkout_outbox_depth").set(backlog.depth as f64);
            metrics::gauge!("checkout_outbox_oldest_age_seconds").set(age_ms as f64 / 1000.0);
        }
        Err(error) => tracing::warn!(%error, "metrics: the outbox could not be read"),
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "checkout_keyed_requests_total",
        "Keyed POSTs by route and idempotency outcome (first, replay, conflict, mismatch)"
    );
    describe_counter!(
        "checkout_declines_total",
        "Payments and refunds refused as their outcome, by problem code (first executions)"
    );
    describe_histogram!(
        "checkout_request_duration_seconds",
        Unit::Seconds,
        "Request latency by route, idempotency outcome and status class"
    );
    describe_gauge!(
        "checkout_db_connections_in_use",
        "Database connections busy now (SQLite: readers in use plus the writer when busy)"
    );
    describe_gauge!(
        "checkout_db_waiting",
        "Requests waiting for the database now (PostgreSQL: for a pool connection; SQLite: queued for the writer)"
    );
    describe_histogram!(
        "checkout_sqlite_group_commit_units",
        "Units of work sharing one SQLite commit"
    );
    describe_counter!(
        "checkout_keys_swept_total",
        "Expired idempotency keys deleted"
    );
    describe_gauge!(
        "checkout_outbox_depth",
        "Events not yet delivered (pending)"
    );
    describe_gauge!(
        "checkout_outbox_oldest_age_seconds",
        Unit::Seconds,
        "Age of the oldest pending event (0 when none)"
    );
    describe_counter!(
        "checkout_webhook_deliveries_total",
        "Webhook delivery attempts by result (delivered, retry, dead)"
    );
}
