//! The server's settings: each an environment variable, also accepted as a `--flag`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{ArgAction, Args, Parser, Subcommand, builder::BoolishValueParser};

use crate::store::StoreSettings;

/// The command line: the settings, and what to do (serve, unless told otherwise).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "checkout-server",
    version,
    about = "The idempotent checkout server"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Shops: merchant accounts that create checkout sessions and refund.
    Shop {
        #[command(subcommand)]
        action: ShopCommand,
    },
    /// Live shoppers: their money comes only from the operator.
    Shopper {
        #[command(subcommand)]
        action: ShopperCommand,
    },
    /// Runs the database's migrations and prints the schema's version. The server runs them
    /// itself at start, except behind a pooler in transaction mode (`CHECKOUT_DB_POOLER`): then
    /// run this first, with `DATABASE_URL` naming PostgreSQL itself.
    Migrate,
    /// Checks every invariant of the books (each transfer sums to zero, balances equal their
    /// ledger, one payment per session, one event per change…) in one consistent read-only
    /// snapshot, beside a running server and without blocking it. Prints each invariant, the
    /// rows it covered and the ids breaking it; exits 0 when all hold, 1 when one is broken,
    /// 2 when the check could not run.
    Verify {
        /// One JSON object instead of the report.
        #[arg(long)]
        json: bool,
    },
}

/// Test money or live money, as an operator names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Test,
    Live,
}

impl Mode {
    pub fn livemode(self) -> bool {
        self == Mode::Live
    }
}

#[derive(Clone, Debug, Subcommand)]
pub enum ShopperCommand {
    /// Deposits live money to a live shopper, from the funding account, keyed: the same key
    /// again is the same deposit (printed again), another amount under it is refused. Prints
    /// one JSON line: the deposit and the shopper's balance.
    Deposit {
        /// The shopper's account id (`acc_…`, from `shopper show`); its e-mail must be confirmed.
        #[arg(long, required_unless_present = "email", conflicts_with = "email")]
        account: Option<String>,
        /// Or the shopper's e-mail: it names an account only once the shopper has confirmed it
        /// with the code mailed to it (an unconfirmed one is refused, nothing moves).
        #[arg(long)]
        email: Option<String>,
        /// In kopecks: 150000 is 1 500,00 ₽.
        #[arg(long)]
        amount: i64,
        /// This deposit's idempotency key (a UUID is ideal); resend it with the same key.
        #[arg(long)]
        key: String,
    },
    /// Prints a live shopper's account and balance as one JSON line.
    Show {
        #[arg(long)]
        email: String,
    },
}

#[derive(Clone, Debug, Subcommand)]
pub enum ShopCommand {
    /// Adds a shop and prints, once, one JSON line with its secrets in each mode:
    /// {"shop_id": …, "test": {"secret_key": "sk_test_…", "signing_secret": "whsec_…"},
    /// "live": {"secret_key": "sk_live_…", "signing_secret": "whsec_…"}}.
    Add {
        /// The name shoppers see.
        #[arg(long)]
        name: String,
        /// Where its events are sent: an https URL (http only to a loopback address, for
        /// demos and tests).
        #[arg(long)]
        webhook_url: Option<String>,
        /// An origin of the shop's pages (`https://shop.example`) that may frame its payment
        /// pages; repeat it for each. None: its payment page works as a full page only.
        #[arg(long = "origin")]
        origins: Vec<String>,
    },
    /// Sets the origins whose pages may frame the shop's payment pages (replacing the ones it
    /// had), or clears them.
    SetOrigins {
        /// The shop's id (`shop_…`).
        #[arg(long)]
        shop: String,
        /// An origin (`https://shop.example`); repeat it for each.
        #[arg(
            long = "origin",
            required_unless_present = "clear",
            conflicts_with = "clear"
        )]
        origins: Vec<String>,
        /// No origin: the payment page cannot be framed (its full page still works).
        #[arg(long)]
        clear: bool,
    },
    /// Sets or clears a shop's webhook URL. Events it has not received yet (waiting for
    /// delivery, or kept while it had none) go to the new URL at once.
    SetWebhook {
        /// The shop's id (`shop_…`, as `shop add` printed it).
        #[arg(long)]
        shop: String,
        /// The new endpoint: https (http only to a loopback address).
        #[arg(long, conflicts_with = "clear", required_unless_present = "clear")]
        url: Option<String>,
        /// No endpoint: events are kept (`no_endpoint`) until the shop has one again.
        #[arg(long)]
        clear: bool,
        /// Only this mode's endpoint (each mode's events are signed with its own secret);
        /// unset: both.
        #[arg(long, value_enum)]
        mode: Option<Mode>,
    },
    /// A new secret key for one mode, printed once as one JSON line; the old one stops working
    /// at once on every instance, or after `--overlap`. Also how a shop made before modes gets
    /// its live key.
    RollKey {
        #[arg(long)]
        shop: String,
        #[arg(long, value_enum)]
        mode: Mode,
        /// How long the old key keeps working beside the new one (`1h`, `30m`; at most 7
        /// days); unset: it stops now.
        #[arg(long, value_parser = overlap)]
        overlap: Option<Duration>,
    },
    /// A new signing secret for one mode's events, printed once as one JSON line; the old one
    /// stops signing at once or, with `--overlap`, signs beside it until then (each event then
    /// carries both signatures, so the shop's endpoint verifies with either).
    RollWebhookSecret {
        #[arg(long)]
        shop: String,
        #[arg(long, value_enum)]
        mode: Mode,
        /// How long the old secret signs beside the new one (`24h`; at most 7 days); unset:
        /// it stops now.
        #[arg(long, value_parser = overlap)]
        overlap: Option<Duration>,
    },
    /// Mails an invitation to the shop's dashboard (`/dashboard`) to an address: the link in it
    /// sets the member's password. How a shop gets its first owner; owners invite the rest.
    Invite {
        #[arg(long)]
        shop: String,
        #[arg(long)]
        email: String,
        /// `owner` (keys, endpoints, staff), `staff` (refunds, resends) or `viewer`.
        #[arg(long, default_value = "owner", value_parser = ["owner", "staff", "viewer"])]
        role: String,
    },
}

/// The longest overlap of a rolled secret: a week (as Stripe's longest).
const MAX_OVERLAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// An overlap: a duration (`24h`, `30m`, `0s`) of at most a week.
fn overlap(text: &str) -> Result<Duration, String> {
    let overlap = humantime::parse_duration(text)
        .map_err(|e| format!("an overlap is a duration such as 1h or 30m ({e})"))?;
    if overlap > MAX_OVERLAP {
        return Err("an overlap is at most 7 days (168h)".into());
    }
    Ok(overlap)
}

#[derive(Clone, Debug, Args)]
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

    /// Demo mode: provisions the demo shop (on test keys) and `POST /api/demo/checkout-session`.
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
    /// contention in the database). SQLite uses one writer and up to four readers.
    #[arg(long = "db-pool-size", env = "CHECKOUT_DB_POOL_SIZE",
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub db_pool_size: Option<u32>,

    /// SQLite: at most this many queued writes share one commit (group commit); 1 commits each
    /// request on its own.
    #[arg(long = "sqlite-batch", env = "CHECKOUT_SQLITE_BATCH", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=1_000))]
    pub sqlite_batch: u16,

    /// SQLite: the most the database file may grow to, in KiB (unset: as the disk allows).
    /// Past it, writes are refused with `503` and nothing of a refused request is kept.
    #[arg(long = "sqlite-max-size-kib", env = "CHECKOUT_SQLITE_MAX_SIZE_KIB",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sqlite_max_size_kib: Option<u64>,

    /// How long a new checkout session can be paid.
    #[arg(long = "session-ttl-secs", env = "CHECKOUT_SESSION_TTL_SECS", default_value_t = 1_800,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub session_ttl_secs: u64,

    /// Demo mode: where the demo shop's credentials (a new secret key at every start) are
    /// written, for the demo shop's own process. Readable by the owner only.
    #[arg(long = "demo-shop-file", env = "CHECKOUT_DEMO_SHOP_FILE")]
    pub demo_shop_file: Option<PathBuf>,

    /// Demo mode: where the demo shop receives its webhooks (its process's `/webhooks/checkout`).
    #[arg(long = "demo-shop-webhook-url", env = "CHECKOUT_DEMO_SHOP_WEBHOOK_URL")]
    pub demo_shop_webhook_url: Option<url::Url>,

    /// Demo mode: the origin of the demo shop's pages, which may frame its payment pages
    /// (unset: the origin of the demo shop's webhook URL).
    #[arg(long = "demo-shop-origin", env = "CHECKOUT_DEMO_SHOP_ORIGIN")]
    pub demo_shop_origin: Option<String>,

    /// Webhooks: how long one delivery attempt may take.
    #[arg(long = "webhook-timeout-ms", env = "CHECKOUT_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_timeout_ms: u64,

    /// Webhooks: the pause after the first failed attempt (then ×3 each time, up to 4 h).
    #[arg(long = "webhook-first-retry-ms", env = "CHECKOUT_WEBHOOK_FIRST_RETRY_MS",
          default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_first_retry_ms: u64,

    /// Webhooks: attempts before an event is marked dead (13 from 5 s: about a day).
    #[arg(long = "webhook-attempts", env = "CHECKOUT_WEBHOOK_ATTEMPTS", default_value_t = 13,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub webhook_attempts: u32,

    /// Webhooks: how often each instance looks for due events.
    #[arg(long = "webhook-poll-ms", env = "CHECKOUT_WEBHOOK_POLL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_poll_ms: u64,

    /// Webhooks: attempts in flight at once to any one shop, across all instances (the claim
    /// takes turns between shops, so a shop whose endpoint hangs holds at most this many).
    #[arg(long = "webhook-per-shop", env = "CHECKOUT_WEBHOOK_PER_SHOP", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub webhook_per_shop: u32,

    /// Webhooks: attempts in flight at once per instance, to all shops.
    #[arg(long = "webhook-in-flight", env = "CHECKOUT_WEBHOOK_IN_FLIGHT", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub webhook_in_flight: u32,

    /// Webhooks: an endpoint failing this long without one success is disabled (its owners are
    /// told; enabled again, it gets what it missed): `5d`, `12h`.
    #[arg(long = "webhook-disable-after", env = "CHECKOUT_WEBHOOK_DISABLE_AFTER",
          default_value = "5d", value_parser = humantime::parse_duration)]
    pub webhook_disable_after: Duration,

    /// Where `GET /metrics` (Prometheus text format) is served: an address of its own, off
    /// unless set, so that it is never public by accident.
    #[arg(long = "metrics-addr", env = "CHECKOUT_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// A live shopper's sign-in ends after this long unused.
    #[arg(long = "shopper-idle-secs", env = "CHECKOUT_SHOPPER_IDLE_SECS", default_value_t = 1_800,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub shopper_idle_secs: u64,

    /// A live shopper's sign-in ends this long after it was made, used or not.
    #[arg(long = "shopper-session-secs", env = "CHECKOUT_SHOPPER_SESSION_SECS",
          default_value_t = 43_200, value_parser = clap::value_parser!(u64).range(1..))]
    pub shopper_session_secs: u64,

    /// The window the attempt limits below count in (they come back evenly over it).
    #[arg(long = "limit-window-secs", env = "CHECKOUT_LIMIT_WINDOW_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub limit_window_secs: u64,

    /// Per window at one account (e-mail), per instance: mails asked for (sign-up, recovery),
    /// and wrong guesses at its password or code from one address (ten times this from all).
    #[arg(long = "sign-in-per-account", env = "CHECKOUT_SIGN_IN_PER_ACCOUNT", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sign_in_per_account: u32,

    /// Sign-in and sign-up attempts per window from one client address, per instance.
    #[arg(long = "sign-in-per-address", env = "CHECKOUT_SIGN_IN_PER_ADDRESS", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sign_in_per_address: u32,

    /// Test shoppers made per window from one client address, per instance.
    #[arg(long = "test-shoppers-per-address", env = "CHECKOUT_TEST_SHOPPERS_PER_ADDRESS",
          default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub test_shoppers_per_address: u32,

    /// Keyed requests one principal may have executing at once on an instance (more: `429`).
    #[arg(long = "keys-in-progress", env = "CHECKOUT_KEYS_IN_PROGRESS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub keys_in_progress: u32,

    /// `transaction` when `DATABASE_URL` names a pooler in transaction mode (PgBouncer's
    /// `pool_mode = transaction`): no named prepared statements, the lock timeout in each
    /// `BEGIN`, no migrations at start (`checkout-server migrate` does them, directly).
    #[arg(long = "db-pooler", env = "CHECKOUT_DB_POOLER", default_value = "none")]
    pub db_pooler: DbPooler,

    /// RabbitMQ (`amqp://user:password@host:5672/%2f`), or the nodes of a cluster comma-separated
    /// (each connection tries the next): the outbox's events are also published there, to the
    /// topic exchange `checkout.events`, confirmed by the broker. Unset: no broker.
    #[arg(long = "amqp-url", env = "CHECKOUT_AMQP_URL")]
    pub amqp_url: Option<String>,

    /// Where mail to shoppers goes (the codes that prove their e-mail): `smtp://host:25`,
    /// `smtp://user:password@host:587?tls=required`, `smtps://user:password@host`. Never
    /// logged. Unset: live shoppers cannot sign up or recover (`503 mail_unavailable`).
    #[arg(long = "smtp-url", env = "CHECKOUT_SMTP_URL")]
    pub smtp_url: Option<String>,

    /// Who the mail is from.
    #[arg(
        long = "mail-from",
        env = "CHECKOUT_MAIL_FROM",
        default_value = "Оплата заказов <no-reply@checkout.localhost>"
    )]
    pub mail_from: String,

    /// The checkout's public origin, as shoppers' browsers reach it (`https://pay.example.ru`):
    /// the passkeys' relying party (its host is their RP ID; a passkey works on no other site).
    /// `http://localhost` (the default) accepts any port: for development and tests.
    #[arg(
        long = "public-origin",
        env = "CHECKOUT_PUBLIC_ORIGIN",
        default_value = "http://localhost"
    )]
    pub public_origin: url::Url,

    /// Checks the books' invariants every this many seconds (as `checkout-server verify`
    /// does), exporting `checkout_invariant_violations{invariant}`; unset: never.
    #[arg(long = "verify-secs", env = "CHECKOUT_VERIFY_SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub verify_secs: Option<u64>,

    /// `text` (the default) or `json`: one JSON object per line, for log pipelines.
    #[arg(
        long = "log-format",
        env = "CHECKOUT_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DbPooler {
    /// PostgreSQL itself (or a pooler in session mode).
    None,
    /// A pooler in transaction mode.
    Transaction,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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

    pub fn sign_in_limits(&self) -> crate::operations::authentication::SignInLimits {
        crate::operations::authentication::SignInLimits {
            idle: Duration::from_secs(self.shopper_idle_secs),
            absolute: Duration::from_secs(self.shopper_session_secs),
        }
    }

    pub fn limits(&self) -> crate::api::limits::LimitSettings {
        crate::api::limits::LimitSettings {
            window: Duration::from_secs(self.limit_window_secs),
            sign_in_per_account: self.sign_in_per_account,
            sign_in_per_address: self.sign_in_per_address,
            test_shoppers_per_address: self.test_shoppers_per_address,
            keys_in_progress: self.keys_in_progress,
        }
    }

    pub fn session_ttl(&self) -> Duration {
        Duration::from_secs(self.session_ttl_secs)
    }

    /// Demo mode: the origins whose pages may frame the demo shop's payment pages.
    pub fn demo_shop_origins(&self) -> Vec<String> {
        match (&self.demo_shop_origin, &self.demo_shop_webhook_url) {
            (Some(origin), _) => vec![origin.clone()],
            (None, Some(url)) => vec![url.origin().ascii_serialization()],
            (None, None) => Vec::new(),
        }
    }

    pub fn delivery(&self) -> crate::workers::delivery::DeliverySettings {
        crate::workers::delivery::DeliverySettings {
            timeout: Duration::from_millis(self.webhook_timeout_ms),
            first_retry: Duration::from_millis(self.webhook_first_retry_ms),
            attempts: self.webhook_attempts,
            poll: Duration::from_millis(self.webhook_poll_ms),
            in_flight: self.webhook_in_flight as usize,
            per_shop: self.webhook_per_shop as usize,
            disable_after: self.webhook_disable_after,
            alert: None,
        }
    }

    /// How the server opens its store: holding a SQLite file exclusively.
    pub fn store_settings(&self) -> StoreSettings {
        StoreSettings {
            pool_size: self.db_pool_size(),
            lock_timeout: self.lock_timeout(),
            sqlite_batch: usize::from(self.sqlite_batch),
            exclusive: true,
            sqlite_max_size_kib: self.sqlite_max_size_kib,
            pooling: match self.db_pooler {
                DbPooler::None => crate::store::Pooling::Direct,
                DbPooler::Transaction => crate::store::Pooling::Transaction,
            },
            connection_lifetime: crate::store::CONNECTION_LIFETIME,
            after_sqlite_commit: Default::default(),
        }
    }

    /// The database URL without its credentials, fit for a log line: the password in the
    /// user-info part and every query parameter that can carry a secret are replaced by `***`.
    pub fn database_url_redacted(&self) -> String {
        redact_url(&self.database_url)
    }
}

/// Query parameters (libpq and sqlx spellings) whose values are secrets.
const SECRET_PARAMETERS: [&str; 4] = ["password", "sslpassword", "passfile", "sslkey"];

fn redact_url(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        // Not a URL we can take apart: say only which kind of database it names.
        let scheme = text.split(':').next().unwrap_or("");
        return format!("{scheme}:<unparsable URL, not shown>");
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let secret = SECRET_PARAMETERS.contains(&name.to_ascii_lowercase().as_str());
                let value = if secret {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn no_credential_form_survives_redaction() {
        for (url, secret) in [
            ("postgres://checkout:s3cret@db:5432/checkout", "s3cret"),
            (
                "postgres://db/checkout?user=checkout&password=s3cret",
                "s3cret",
            ),
            (
                "postgres://db/checkout?PassWord=s3cret&sslmode=require",
                "s3cret",
            ),
            (
                "postgresql://u@db/c?sslpassword=s3cret&sslkey=/keys/s3cret.key",
                "s3cret",
            ),
            ("postgres://u:p%40ss@db/c", "p%40ss"),
            ("postgres://u:s3cret@db:notaport/c", "s3cret"),
        ] {
            let redacted = redact_url(url);
            assert!(!redacted.contains(secret), "{url} → {redacted}");
        }
        assert_eq!(
            redact_url("postgres://checkout:s3cret@db/checkout?sslmode=require"),
            "postgres://checkout:***@db/checkout?sslmode=require"
        );
        assert_eq!(redact_url("sqlite://checkout.db"), "sqlite://checkout.db");
    }
}
