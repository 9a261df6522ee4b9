//! `GET /metrics` (Prometheus text format), on `CHECKOUT_METRICS_ADDR` only, never beside the
//! public API. Gauges that describe the database (outbox depth, pool use) are read when scraped,
//! so a scrape always sees the present.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::clock;
use crate::metrics::{self, BATCH_BUCKETS, GROUP_COMMIT_UNITS, LATENCY_BUCKETS, REQUEST_DURATION};
use crate::store::Store;

/// Installs the exporter (the process's one recorder) and serves `GET /metrics` on `addr`.
pub async fn serve(addr: SocketAddr, store: Store) -> std::io::Result<()> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(REQUEST_DURATION.into()), &LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(GROUP_COMMIT_UNITS.into()), &BATCH_BUCKETS)
        })
        .map_err(std::io::Error::other)?
        .install_recorder()
        .map_err(std::io::Error::other)?;
    metrics::describe();
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
    metrics::database_now(pool.in_use, pool.waiting);
    match store.outbox_backlog().await {
        Ok(backlog) => {
            let age_ms = backlog
                .oldest_created_at_ms
                .map_or(0, |created| (clock::now_ms() - created).max(0));
            metrics::outbox_now(backlog.depth, age_ms);
        }
        Err(error) => tracing::warn!(%error, "metrics: the outbox could not be read"),
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
}
