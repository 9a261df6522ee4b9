//! PostgreSQL, the production store that several server instances share.
//!
//! A duplicate's claim blocks on the original's uncommitted key row (the primary key's
//! speculative insertion waits for it). `lock_timeout` bounds that wait: past it the duplicate
//! gets `409` + `Retry-After`; if the original commits first, the duplicate replays its answer.

use std::{borrow::Cow, sync::LazyLock, time::Duration};

use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};

use super::{StoreError, sql};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Once the key is ours, other locks (the account row under a burst of payments) may be waited
/// for longer than a duplicate waits for the key, but still not forever.
const WORK_LOCK_TIMEOUT: &str = "5s";

/// `set_config` runs in RETURNING, i.e. only once the key is claimed: it lifts the claim's
/// short bound to the work bound without a round trip of its own.
pub static CLAIM_KEY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} RETURNING claim_id, set_config('lock_timeout', '{WORK_LOCK_TIMEOUT}', true)",
        sql::CLAIM_KEY
    )
});

/// A payment's guarded debit, its row and its ledger entry in one statement (one round trip,
/// and the account row is locked for less time). Returns the new balance (NULL: not debited)
/// and whether the payment row went in (0: the order was paid meanwhile, so roll back).
pub const CHARGE: &str = "\
    WITH debit AS ( \
        UPDATE accounts SET balance = balance - $3 \
         WHERE account_id = $2 AND balance >= $3 \
           AND NOT EXISTS (SELECT 1 FROM payments WHERE account_id = $2 AND order_id = $4) \
        RETURNING balance \
    ), payment AS ( \
        INSERT INTO payments (payment_id, account_id, order_id, amount, currency, balance_after, \
                              idempotency_key, created_at) \
        SELECT $1, $2, $4, $3, $5, balance, $6, $8 FROM debit \
        ON CONFLICT (account_id, order_id) DO NOTHING \
        RETURNING payment_id \
    ), entry AS ( \
        INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, \
                            refund_id, created_at) \
        SELECT $2, -$3, 'payment', $6, $7, payment_id, NULL, $8 FROM payment \
    ) \
    SELECT (SELECT balance FROM debit), (SELECT COUNT(*) FROM payment)";

#[derive(Clone, Debug)]
pub struct PgStore {
    pub pool: PgPool,
    /// `BEGIN` and the claim's wait bound, sent as one simple query.
    begin_keyed: Cow<'static, str>,
}

pub async fn connect(
    url: &str,
    pool_size: u32,
    lock_timeout: Duration,
) -> Result<PgStore, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await?;
    MIGRATOR.run(&pool).await?;
    let begin_keyed = format!(
        "BEGIN; SET LOCAL lock_timeout = '{}ms'",
        lock_timeout.as_millis().max(1)
    );
    Ok(PgStore {
        pool,
        begin_keyed: Cow::Owned(begin_keyed),
    })
}

impl PgStore {
    pub async fn begin_keyed(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin_with(self.begin_keyed.clone()).await
    }

    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }
}

pub fn classify(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("55P03") => StoreError::Busy(error), // lock_not_available: lock_timeout hit
            Some("40001" | "40P01") => StoreError::Retry(error), // serialization, deadlock
            Some(code) if code.starts_with("08") || code.starts_with("57P") => {
                StoreError::Unavailable(error) // connection lost, server shutting down
            }
            _ => StoreError::Other(error),
        },
        sqlx::Error::PoolTimedOut => StoreError::Busy(error),
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => {
            StoreError::Unavailable(error)
        }
        _ => StoreError::Other(error),
    }
}
