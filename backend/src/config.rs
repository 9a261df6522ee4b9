//! The server's settings: each an environment variable, also accepted as a `--flag`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{ArgAction, Parser, builder::BoolishValueParser};

#[derive(Clone, Debug, Parser)]
#[command(
    name = "checkout-server",
    version,
    about = "The idempotent checkout server"
)]
pub struct Config {
    /// `sqlite://FILE` (created if missing) or `postgres://…`; migrations run at start.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://checkout.db")]
    pub database_url: String,

    /// Address to listen on; port 0 picks a free port.
    #[arg(
        long = "addr",
        alias = "checkout-addr",
        env = "CHECKOUT_ADDR",
        default_value = "127.0.0.1:3000"
    )]
    pub addr: SocketAddr,

    /// Demo mode: `POST /api/demo/session` hands out fresh shoppers holding 1 000,00 ₽.
    #[arg(long = "demo", alias = "checkout-demo", env = "CHECKOUT_DEMO", default_value = "0",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "1")]
    pub demo: bool,

    /// The built widget, served at `/` when the directory exists.
    #[arg(
        long = "static-dir",
        alias = "checkout-static-dir",
        env = "CHECKOUT_STATIC_DIR",
        default_value = "dist"
    )]
    pub static_dir: PathBuf,

    /// How long an idempotency key is kept; after that it is a new key.
    #[arg(long = "key-ttl-secs", alias = "checkout-key-ttl-secs", env = "CHECKOUT_KEY_TTL_SECS",
          default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_ttl_secs: u64,

    /// How often expired keys are deleted.
    #[arg(long = "sweep-secs", alias = "checkout-sweep-secs", env = "CHECKOUT_SWEEP_SECS",
          default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_secs: u64,

    /// How long a duplicate waits for the in-flight original before `409`.
    #[arg(long = "lock-timeout-ms", alias = "checkout-lock-timeout-ms", env = "CHECKOUT_LOCK_TIMEOUT_MS",
          default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub lock_timeout_ms: u64,

    /// Connections to PostgreSQL per server instance; default 4 per CPU core (more only adds
    /// contention in the database). SQLite uses one writer and four readers.
    #[arg(long = "db-pool-size", env = "CHECKOUT_DB_POOL_SIZE",
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub db_pool_size: Option<u32>,
}

impl Config {
    pub fn key_ttl(&self) -> Duration {
        Duration::from_secs(self.key_ttl_secs)
    }

    pub fn sweep_every(&self) -> Duration {
        Duration::from_secs(self.sweep_secs)
    }

    pub fn db_pool_size(&self) -> u32 {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
        self.db_pool_size.unwrap_or(4 * cores)
    }

    pub fn lock_timeout(&self) -> Duration {
        Duration::from_millis(self.lock_timeout_ms)
    }

    /// The database URL without its password, fit for a log line.
    pub fn database_url_redacted(&self) -> String {
        match (self.database_url.find("://"), self.database_url.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end => {
                let credentials = &self.database_url[scheme_end + 3..at];
                match credentials.split_once(':') {
                    Some((user, _)) => format!(
                        "{}{user}:***{}",
                        &self.database_url[..scheme_end + 3],
                        &self.database_url[at..]
                    ),
                    None => self.database_url.clone(),
                }
            }
            _ => self.database_url.clone(),
        }
    }
}
