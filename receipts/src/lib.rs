//! `receipts`: fiscal receipts from the checkout's events on RabbitMQ, exactly once in effect.
//!
//! Floors, each looking only down: [`receipt`] (what a receipt is, read off an event) →
//! [`store`] (the inbox and the receipts, SQLite or PostgreSQL) → [`consumer`] (the broker, the
//! protocol from `checkout-idempotency`, ack after commit) and [`http`] (`GET /receipts`) →
//! this file (settings and start).

pub mod consumer;
pub mod http;
pub mod receipt;
pub mod store;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

pub use consumer::{ConsumerSettings, Seams};

#[derive(Parser, Debug)]
#[command(
    name = "receipts",
    about = "Fiscal receipts from the checkout's events on RabbitMQ"
)]
pub struct Config {
    /// The broker, e.g. amqp://guest:guest@127.0.0.1:5672/%2f, or the nodes of a cluster
    /// comma-separated (each connection tries the next)
    #[arg(long, env = "RECEIPTS_AMQP_URL")]
    pub amqp_url: String,
    /// sqlite://FILE (created if missing) or postgres://…
    #[arg(
        long,
        env = "RECEIPTS_DATABASE_URL",
        default_value = "sqlite://receipts.db"
    )]
    pub database_url: String,
    /// Where `GET /receipts` answers.
    #[arg(long, env = "RECEIPTS_ADDR", default_value = "127.0.0.1:8090")]
    pub addr: SocketAddr,
    /// The bearer token `GET /receipts` and `GET /metrics` ask for (receipts name what was
    /// bought, and for how much). Required unless `RECEIPTS_ADDR` is a loopback address.
    #[arg(long, env = "RECEIPTS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The quorum queue (shared by every consumer of the same name) and its inbox's scope.
    #[arg(long, env = "RECEIPTS_QUEUE", default_value = "receipts")]
    pub queue: String,
    /// Unacknowledged messages the broker hands this consumer at once.
    #[arg(long, env = "RECEIPTS_PREFETCH", default_value_t = consumer::DEFAULT_PREFETCH)]
    pub prefetch: u16,
}

pub fn main() -> ExitCode {
    main_with(Seams::default())
}

/// The program with test seams (see `checkout-faults`).
pub fn main_with(seams: Seams) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin=warn")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let config = Config::parse();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(serve(config, seams)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("receipts: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config, seams: Seams) -> Result<(), String> {
    match (&config.token, config.addr.ip().is_loopback()) {
        (Some(token), _) if token.len() < 16 => {
            return Err("RECEIPTS_TOKEN must be at least 16 characters".into());
        }
        (None, false) => {
            return Err(format!(
                "RECEIPTS_TOKEN is not set: {} is reachable from other machines, and the receipts \
                 would be open to all of them",
                config.addr
            ));
        }
        (None, true) => tracing::warn!(
            "RECEIPTS_TOKEN is not set: GET /receipts and /metrics answer anyone on this machine"
        ),
        (Some(_), _) => {}
    }
    let store = store::Store::open(&config.database_url)
        .await
        .map_err(|e| redact(&e.to_string(), &config.database_url))?;
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot record metrics: {e}"))?;
    metrics::describe_counter!(
        consumer::MESSAGES_METRIC,
        "Messages taken from the broker, by outcome: issued, duplicate (absorbed by the inbox), dead_lettered, requeued"
    );
    metrics::describe_counter!(
        consumer::REDELIVERED_METRIC,
        "Messages the broker marked redelivered"
    );
    metrics::describe_histogram!(
        consumer::LAG_METRIC,
        "Seconds from the money moving to its receipt"
    );
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let settings = ConsumerSettings {
        amqp_url: config.amqp_url,
        queue: config.queue,
        prefetch: config.prefetch,
    };
    tracing::info!(queue = settings.queue, "listening on http://{addr}");
    tokio::spawn(consumer::run(store.clone(), settings, seams));
    let token = http::TokenDigest::of(config.token.as_deref());
    axum::serve(
        listener,
        http::router(http::App {
            store,
            metrics,
            token,
        }),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| e.to_string())
}

/// An error about the database, without the password its URL may carry.
fn redact(message: &str, url: &str) -> String {
    match url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        Some(password) if !password.is_empty() => message.replace(&password, "***"),
        _ => message.to_owned(),
    }
}
