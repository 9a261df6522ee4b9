//! What an operator watches: every metric's name and how it is recorded, through the `metrics`
//! facade (a no-op unless an exporter is installed). A leaf: anyone may call it (the store's
//! group commit, the workers, the HTTP layer), and it knows nothing of theirs. `GET /metrics` is
//! served by `api::metrics`, on `CHECKOUT_METRICS_ADDR` only.

use std::time::Duration;

/// Latency buckets (seconds): a replay answers in well under a millisecond, a payment over
/// PostgreSQL in a few, and the timeout is 30 s.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];
/// Group-commit batch sizes (units per SQLite commit), up to the batch limit.
pub const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0, 1000.0];

/// The histogram of request latencies.
pub const REQUEST_DURATION: &str = "checkout_request_duration_seconds";
/// The histogram of units per SQLite commit.
pub const GROUP_COMMIT_UNITS: &str = "checkout_sqlite_group_commit_units";

/// A keyed request, by route and how its key settled it (`first`, `replay`, `conflict`,
/// `mismatch`).
pub fn keyed_request(route: &str, outcome: &'static str) {
    metrics::counter!(
        "checkout_keyed_requests_total",
        "route" => route.to_owned(),
        "outcome" => outcome,
    )
    .increment(1);
}

/// A payment or refund refused as its outcome (stored, replayed as such), by problem `code`.
pub fn decline(code: &str) {
    metrics::counter!("checkout_declines_total", "code" => code.to_owned()).increment(1);
}

/// Any request, answered: its latency by route, idempotency outcome (`unkeyed` for the rest)
/// and status class.
pub fn request_answered(route: &str, outcome: Option<&'static str>, status: u16, took: Duration) {
    let outcome = outcome.unwrap_or("unkeyed");
    let class = match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics::histogram!(
        REQUEST_DURATION,
        "route" => route.to_owned(),
        "outcome" => outcome,
        "status" => class,
    )
    .record(took.as_secs_f64());
}

/// One SQLite commit, shared by `units` requests' units of work.
pub fn group_commit(units: usize) {
    metrics::histogram!(GROUP_COMMIT_UNITS).record(units as f64);
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

/// A shop's webhook endpoint disabled by the checkout after failing for days.
pub fn endpoint_disabled() {
    metrics::counter!("checkout_webhook_endpoints_disabled_total").increment(1);
}

/// The database as it is now, set when scraped: pool use, and the outbox's backlog.
pub fn database_now(in_use: u64, waiting: u64) {
    metrics::gauge!("checkout_db_connections_in_use").set(in_use as f64);
    metrics::gauge!("checkout_db_waiting").set(waiting as f64);
}

pub fn outbox_now(depth: i64, oldest_age_ms: i64) {
    metrics::gauge!("checkout_outbox_depth").set(depth as f64);
    metrics::gauge!("checkout_outbox_oldest_age_seconds").set(oldest_age_ms as f64 / 1000.0);
}

/// Events waiting for the broker's confirm (`CHECKOUT_AMQP_URL`).
pub fn broker_backlog(depth: i64) {
    metrics::gauge!("checkout_broker_backlog").set(depth as f64);
}

/// Events the broker routed to no queue, waiting to be offered again.
pub fn broker_unrouted(depth: i64) {
    metrics::gauge!("checkout_broker_unrouted").set(depth as f64);
}

/// Events the broker confirmed.
pub fn published(count: usize) {
    metrics::counter!("checkout_broker_published_total").increment(count as u64);
}

/// One invariant of the books, as the last periodic check found it.
pub fn invariant_checked(invariant: &'static str, violations: usize) {
    metrics::gauge!("checkout_invariant_violations", "invariant" => invariant)
        .set(violations as f64);
}

/// A periodic check of the invariants finished.
pub fn verified(took: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    metrics::gauge!("checkout_verify_last_run_timestamp_seconds").set(now.as_secs_f64());
    metrics::gauge!("checkout_verify_duration_seconds").set(took.as_secs_f64());
}

/// What each metric means, for the exporter's `# HELP` lines.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "checkout_webhook_endpoints_disabled_total",
        "Shops' webhook endpoints disabled after failing without a success for the set time"
    );
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
    describe_gauge!(
        "checkout_broker_backlog",
        "Events not yet confirmed by the broker (CHECKOUT_AMQP_URL)"
    );
    describe_gauge!(
        "checkout_broker_unrouted",
        "Events the broker routed to no queue (none bound to their type), offered again later"
    );
    describe_counter!(
        "checkout_broker_published_total",
        "Events published to the broker and confirmed by it"
    );
    describe_gauge!(
        "checkout_invariant_violations",
        "Rows breaking each invariant of the books at the last periodic check (CHECKOUT_VERIFY_SECS)"
    );
    describe_gauge!(
        "checkout_verify_last_run_timestamp_seconds",
        Unit::Seconds,
        "When the last periodic check of the invariants finished (Unix time)"
    );
    describe_gauge!(
        "checkout_verify_duration_seconds",
        Unit::Seconds,
        "How long the last periodic check of the invariants took"
    );
}
