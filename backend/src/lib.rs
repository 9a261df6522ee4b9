//! The idempotent checkout server: keyed payments and refunds that move money exactly once.
//!
//! - [`idempotency`]: the protocol (claim → guarded change → ledger → stored response → commit);
//! - [`payments`], [`refunds`]: the business steps run inside it, and their handlers;
//! - [`accounts`]: who is calling, balances, demo shoppers;
//! - [`store`]: SQLite or PostgreSQL behind one API;
//! - [`http`]: routes and layers; [`error`]: the problem+json error; [`config`]: settings.

pub mod accounts;
#[cfg(feature = "bench-routes")]
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod faults;
pub mod http;
pub mod idempotency;
pub mod payments;
pub mod refunds;
pub mod store;
pub mod sweeper;

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::store::Store;

/// What every handler can reach.
#[derive(Clone, Debug)]
pub struct AppState {
    pub store: Store,
    pub principals: Arc<accounts::PrincipalCache>,
    pub key_ttl: Duration,
    pub demo: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the database {url}: {source}")]
    Database { url: String, source: sqlx::Error },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Serve(std::io::Error),
}

/// Connects, migrates, serves until SIGTERM or Ctrl-C, then lets in-flight requests finish.
pub async fn run(config: Config) -> Result<(), StartError> {
    let store = Store::connect(
        &config.database_url,
        config.db_pool_size(),
        config.lock_timeout(),
    )
    .await
    .map_err(|source| StartError::Database {
        url: config.database_url_redacted(),
        source,
    })?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| StartError::Listen {
            addr: config.addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(StartError::Serve)?;

    let sweeper = sweeper::spawn(store.clone(), config.key_ttl(), config.sweep_every());
    let app = AppState {
        store,
        principals: Arc::default(),
        key_ttl: config.key_ttl(),
        demo: config.demo,
    };
    let router = http::router(app, &config.static_dir);

    tracing::info!(
        database = %config.database_url_redacted(),
        demo = config.demo,
        "listening on http://{addr}"
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(StartError::Serve)?;
    sweeper.abort();
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
