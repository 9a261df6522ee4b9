//! The idempotent checkout server: keyed payments and refunds that move money exactly once.
//!
//! Built in floors that only look down (`tests/it/floors.rs` reads the code and holds it so):
//!
//! - leaves: [`ids`], [`clock`], [`metrics`]; [`mail`];
//! - [`store`]: rows and statements by concept, on SQLite or PostgreSQL behind one API;
//! - [`operations`]: what the checkout does, below HTTP: each keyed operation runs inside the
//!   framework-free protocol of `checkout-idempotency`; one error type,
//!   [`operations::error::OperationError`];
//! - [`workers`]: delivery, publishing, sweeping, verifying, beside the requests;
//! - [`api`]: HTTP: the router, the handlers, the dashboard, the checkout's own pages;
//! - this file ([`run`], [`Seams`]), [`cli`] and [`config`]: the program.
//!
//! The shipped `checkout-server` runs with [`Seams::default`]. Test and benchmark servers (in
//! the e2e, reliability and bench crates) are this same program given hooks or routes through
//! [`Seams`]; nothing of theirs is compiled into this crate.

pub mod api;
pub mod cli;
pub mod clock;
pub mod config;
pub mod ids;
pub mod mail;
pub mod metrics;
pub mod operations;
pub mod store;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use checkout_idempotency::{Hooks, Protocol};

use crate::api::AppState;
use crate::config::Config;
use crate::operations::{demo, shops};
use crate::store::Store;
use crate::workers::{delivery, publisher, sweeper, verifier};

/// What a test or benchmark build adds to the server. The shipped binary runs with the
/// default, which adds nothing.
#[derive(Default)]
pub struct Seams {
    /// Called by the protocol before each claim and before each commit.
    pub hooks: Option<Arc<dyn Hooks>>,
    /// More routes, served beside the API (e.g. a benchmark's).
    pub routes: Option<Router<AppState>>,
    /// Wraps the API's handlers, inside the logging and error layers (e.g. to lose answers).
    pub wrap: Option<Box<dyn FnOnce(Router) -> Router + Send>>,
    /// Called once the broker confirmed a batch of events, before they are marked published
    /// (e.g. to crash right there).
    pub after_broker_confirm: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Called by the SQLite writer after each successful COMMIT (see `AfterSqliteCommit`).
    pub after_sqlite_commit: store::AfterSqliteCommit,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the database {url}: {source}")]
    Database {
        url: String,
        source: store::ConnectError,
    },
    #[error("cannot provision the demo shop: {0}")]
    DemoShop(#[from] shops::ShopError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Serve(std::io::Error),
    #[error("{0}")]
    Mail(String),
    #[error("CHECKOUT_PUBLIC_ORIGIN: {0}")]
    PublicOrigin(String),
}

/// Connects, migrates, serves until SIGTERM or Ctrl-C, then lets in-flight requests finish.
pub async fn run(config: Config, seams: Seams) -> Result<(), StartError> {
    // The address first: the database's connections take local ports too, and must not take
    // the one this server was given.
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| StartError::Listen {
            addr: config.addr,
            source,
        })?;
    let settings = store::StoreSettings {
        after_sqlite_commit: seams.after_sqlite_commit.clone(),
        ..config.store_settings()
    };
    let store = Store::connect(&config.database_url, settings)
        .await
        .map_err(|source| StartError::Database {
            url: config.database_url_redacted(),
            source,
        })?;
    let addr = listener.local_addr().map_err(StartError::Serve)?;
    let mailer = match &config.smtp_url {
        Some(url) => Some(Arc::new(
            mail::Mailer::new(url, &config.mail_from).map_err(StartError::Mail)?,
        )),
        None => {
            tracing::warn!(
                "CHECKOUT_SMTP_URL is not set: live shoppers cannot sign up or recover (no codes can be mailed)"
            );
            None
        }
    };

    if !config.demo && config.public_origin.host_str() == Some("localhost") {
        tracing::warn!(
            "CHECKOUT_PUBLIC_ORIGIN is {}: passkeys work only for a browser on this machine; set it to the checkout's public origin (https://pay.example.ru)",
            config.public_origin
        );
    }
    if config.demo {
        demo::provision_shop(
            &store,
            config.demo_shop_file.as_deref(),
            config.demo_shop_webhook_url.as_ref().map(|u| u.as_str()),
            &config.demo_shop_origins(),
        )
        .await?;
    }
    let deliveries = Arc::new(tokio::sync::Notify::new());
    let sweeper = sweeper::spawn(
        store.clone(),
        config.key_ttl(),
        config.sweep_every(),
        config.sign_in_limits(),
        deliveries.clone(),
    );
    let delivery = delivery::spawn(
        store.clone(),
        workers::delivery::DeliverySettings {
            alert: mailer.clone(),
            ..config.delivery()
        },
        deliveries.clone(),
    );
    let publisher = config.amqp_url.clone().map(|url| {
        publisher::spawn(
            store.clone(),
            publisher::PublisherSettings {
                url,
                poll: Duration::from_millis(config.webhook_poll_ms),
                after_confirm: seams.after_broker_confirm.clone(),
            },
        )
    });
    let verifier = config
        .verify_secs
        .map(|secs| verifier::spawn(store.clone(), Duration::from_secs(secs)));
    let mut protocol = Protocol::new(config.key_ttl()).with_lock_timeout(config.lock_timeout());
    if let Some(hooks) = seams.hooks {
        protocol = protocol.with_hooks(hooks);
    }
    let app = AppState {
        store,
        protocol,
        principals: Arc::new(operations::authentication::PrincipalCache::new(
            config.sign_in_limits(),
        )),
        demo: config.demo,
        session_ttl: config.session_ttl(),
        deliveries,
        site: Arc::new(api::assets::Site::open(&config.static_dir)),
        limits: Arc::new(api::limits::Limits::new(config.limits())),
        mailer,
        passkeys: Arc::new(
            operations::passkeys::RelyingParty::new(&config.public_origin)
                .map_err(StartError::PublicOrigin)?,
        ),
        public_origin: config.public_origin.clone(),
    };
    app.site.warm();
    // The abuse limiters forget the keys idle for a window, every minute.
    let limits = app.limits.clone();
    let forgetting = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_secs(60));
        loop {
            ticks.tick().await;
            limits.forget_idle();
        }
    });
    if let Some(metrics_addr) = config.metrics_addr {
        api::metrics::serve(metrics_addr, app.store.clone())
            .await
            .map_err(|source| StartError::Listen {
                addr: metrics_addr,
                source,
            })?;
    }
    let router = api::router(app, seams.routes, seams.wrap);

    tracing::info!(
        database = %config.database_url_redacted(),
        demo = config.demo,
        "listening on http://{addr}"
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await
    .map_err(StartError::Serve)?;
    sweeper.abort();
    forgetting.abort();
    delivery.abort();
    for worker in [verifier, publisher].into_iter().flatten() {
        worker.abort();
    }
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
