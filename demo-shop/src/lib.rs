//! The demo shop: a shop's own server, a separate process with its own SQLite database, that
//! uses the checkout only through its public API and its secret key.
//!
//! - [`storefront`]: catalogue, cart, the order page that mounts the checkout's widget;
//! - [`back_office`]: orders, payment states, refunds;
//! - [`orders`]: what the shop does with the checkout, each step safe to repeat;
//! - [`checkout_api`]: the checkout's API, every POST under an idempotency key of the shop's;
//! - [`webhooks`]: the receiver of the checkout's events, idempotent through its inbox (the
//!   checkout's own protocol crate, over the shop's database);
//! - [`store`]: the shop's database; [`catalogue`]: what it sells; [`pages`], [`error`].

pub mod back_office;
pub mod catalogue;
pub mod checkout_api;
pub mod error;
pub mod orders;
pub mod pages;
pub mod staff;
pub mod store;
pub mod storefront;
pub mod webhooks;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use clap::Parser;
use tower_http::set_header::SetResponseHeaderLayer;
use tracing_subscriber::EnvFilter;
use url::Url;

use crate::checkout_api::CheckoutApi;
use crate::store::Store;

/// Every setting is an environment variable, also accepted as the matching `--flag`.
#[derive(Debug, Parser)]
#[command(
    name = "demo-shop",
    version,
    about = "The demo shop that uses the checkout"
)]
pub struct Config {
    /// Where the shop listens (port 0 picks a free one).
    #[arg(long, env = "SHOP_ADDR", default_value = "127.0.0.1:3001")]
    pub addr: SocketAddr,
    /// The shop's own database.
    #[arg(
        long,
        env = "SHOP_DATABASE_URL",
        default_value = "sqlite://demo-shop.db"
    )]
    pub database_url: String,
    /// The checkout server, as the shop's server and the shopper's browser both reach it.
    #[arg(long, env = "CHECKOUT_URL", default_value = "http://127.0.0.1:3000/")]
    pub checkout_url: Url,
    /// The shop's credentials, as `checkout-server shop add` prints them (a demo checkout
    /// writes its demo shop's to `CHECKOUT_DEMO_SHOP_FILE`).
    #[arg(long, env = "SHOP_CREDENTIALS_FILE")]
    pub credentials_file: PathBuf,
    /// Where `GET /metrics` (Prometheus text format: the inbox's deliveries by outcome) is
    /// served; off unless set.
    #[arg(long, env = "SHOP_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// The staff's password for the back office, as its Argon2id hash (PHC string, from
    /// `demo-shop hash-password`). Unset: the back office is closed.
    #[arg(long, env = "SHOP_STAFF_PASSWORD_HASH", hide_env_values = true)]
    pub staff_password_hash: Option<String>,
    /// Where shoppers reach the shop (unset: `http://` and the address it listens on).
    #[arg(long, env = "SHOP_PUBLIC_URL")]
    pub public_url: Option<Url>,
}

/// What every handler can reach.
#[derive(Clone)]
pub struct Shop {
    pub store: Store,
    pub checkout: Arc<CheckoutApi>,
    /// The protocol the inbox runs each event through (its keys: the webhook ids).
    pub inbox_protocol: checkout_idempotency::Protocol,
    /// The staff password's Argon2id hash; `None`: the back office is closed.
    pub staff_password_hash: Option<String>,
    /// The staff sign-in's limits on wrong passwords, and its Argon2id turns.
    pub staff_guard: Arc<staff::Guard>,
    /// Where shoppers reach this shop (`http://127.0.0.1:3001`): the checkout's full payment page
    /// sends them back to the order page there.
    pub public_url: Url,
}

/// How long the inbox remembers an event: far beyond the checkout's retry schedule (a day).
pub const INBOX_RETENTION: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

pub fn router(shop: Shop) -> Router {
    let origin = shop.checkout.base().origin().ascii_serialization();
    let policy = pages::content_security_policy(&origin);
    Router::new()
        .route("/", get(storefront::catalogue_page))
        .route("/orders", post(storefront::place_order))
        .route("/orders/{order_id}", get(storefront::order_page))
        .route(
            "/orders/{order_id}/checkout-session",
            post(storefront::retry_session),
        )
        .route("/orders/{order_id}/confirm", post(storefront::confirm))
        .route("/admin", get(back_office::page))
        .route("/admin/login", get(staff::login_page).post(staff::login))
        .route("/admin/logout", post(staff::logout))
        .route(
            "/admin/orders/{order_id}/refunds",
            post(back_office::refund),
        )
        .route(
            "/admin/orders/{order_id}/confirm",
            post(back_office::confirm),
        )
        .route(webhooks::ROUTE, post(webhooks::receive))
        .route("/assets/shop.js", get(shop_js))
        .route("/assets/shop.css", get(shop_css))
        .fallback(|| async { error::ShopError::NotFound })
        .with_state(shop)
        .layer(axum::middleware::from_fn(staff::same_origin_posts_only))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_str(&policy).expect("the policy is ASCII"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
}

async fn shop_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../assets/shop.js"),
    )
}

async fn shop_css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../assets/shop.css"),
    )
}

pub fn now_ms() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000_000
}

/// Wraps the shop's router: the seam a test build uses to inject faults (never the shipped one).
pub type Wrap = Box<dyn FnOnce(Router) -> Router + Send>;

/// Opens the database, reads the credentials, listens, serves until SIGINT/SIGTERM.
pub async fn run(config: Config, wrap: Option<Wrap>) -> Result<(), String> {
    let store = Store::open(&config.database_url)
        .await
        .map_err(|e| format!("cannot open the database {}: {e}", config.database_url))?;
    let checkout = CheckoutApi::new(config.checkout_url.clone(), config.credentials_file)
        .map_err(|e| format!("cannot read the shop's credentials: {e}"))?;
    if let Some(addr) = config.metrics_addr {
        serve_metrics(addr).await?;
    }
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let public_url = match config.public_url.clone() {
        Some(url) => url,
        None => Url::parse(&format!("http://{addr}/")).map_err(|e| e.to_string())?,
    };
    let shop = Shop {
        store,
        checkout: Arc::new(checkout),
        inbox_protocol: checkout_idempotency::Protocol::new(INBOX_RETENTION),
        staff_password_hash: config.staff_password_hash.clone(),
        staff_guard: Arc::default(),
        public_url,
    };
    tracing::info!(
        checkout = %config.checkout_url,
        "listening on http://{addr}"
    );
    let router = match wrap {
        Some(wrap) => wrap(router(shop)),
        None => router(shop),
    };
    // The client's address: the staff sign-in limits wrong passwords per address.
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown())
    .await
    .map_err(|e| e.to_string())
}

/// The exporter (the process's one recorder) and `GET /metrics` on an address of its own.
async fn serve_metrics(addr: SocketAddr) -> Result<(), String> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot record metrics: {e}"))?;
    metrics::describe_counter!(
        webhooks::DELIVERIES_METRIC,
        "Webhook deliveries to the inbox by outcome: applied, duplicate (absorbed: nothing changed), in_use, refused"
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    );
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(())
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        tokio::select! { _ = interrupt => {}, _ = terminate.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// The `demo-shop` command.
pub fn main() -> ExitCode {
    main_with(None)
}

/// The same program, its router wrapped (a test build's faults).
pub fn main_with(wrap: Option<Wrap>) -> ExitCode {
    // The one command besides serving: `demo-shop hash-password` (the password on stdin).
    if std::env::args().nth(1).as_deref() == Some("hash-password") {
        return staff::hash_password_command();
    }
    let config = match Config::try_parse() {
        Ok(config) => config,
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            let text = error.to_string();
            let line = text.lines().next().unwrap_or("invalid setting");
            eprintln!("demo-shop: {}", line.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo-shop: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config, wrap)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo-shop: {error}");
            ExitCode::FAILURE
        }
    }
}
