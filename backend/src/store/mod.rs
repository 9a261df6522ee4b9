//! Where the money and the keys are kept: one API over SQLite or PostgreSQL, chosen by
//! `DATABASE_URL`. Each method is one statement; the SQL is in `sql.rs` (shared) and in the
//! database's own module (what differs).

mod postgres;
mod sql;
mod sqlite;

use std::time::Duration;

use sqlx::{Postgres, Sqlite, Transaction};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A lock or a connection was not had within its bound. On a key claim this means the
    /// first request with that key is still executing.
    #[error("the database is busy: {0}")]
    Busy(sqlx::Error),
    /// The transaction lost a serialization race and may simply be run again.
    #[error("transaction must be retried: {0}")]
    Retry(sqlx::Error),
    #[error("the database is unavailable: {0}")]
    Unavailable(sqlx::Error),
    #[error("database error: {0}")]
    Other(sqlx::Error),
}

#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

/// One open write transaction. Dropped without [`Tx::commit`], it rolls back.
pub enum Tx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// Runs the same statement code on whichever database a [`Tx`] holds, classifying errors the
/// way that database reports them.
macro_rules! on_tx {
    ($tx:expr, $conn:ident => $body:expr) => {
        match $tx {
            Tx::Sqlite(tx) => {
                let $conn = &mut **tx;
                $body.map_err(sqlite::classify)
            }
            Tx::Postgres(tx) => {
                let $conn = &mut **tx;
                $body.map_err(postgres::classify)
            }
        }
    };
    // `$sql` names a statement that each database module spells its own way.
    ($tx:expr, $conn:ident, $sql:ident = $item:ident => $body:expr) => {
        match $tx {
            Tx::Sqlite(tx) => {
                let ($conn, $sql) = (&mut **tx, &*sqlite::$item);
                $body.map_err(sqlite::classify)
            }
            Tx::Postgres(tx) => {
                let ($conn, $sql) = (&mut **tx, &*postgres::$item);
                $body.map_err(postgres::classify)
            }
        }
    };
}

/// The same for reads outside a transaction, on the store's read pool.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite(store) => {
                let $pool = &store.reader;
                $body.map_err(sqlite::classify)
            }
            Store::Postgres(store) => {
                let $pool = &store.pool;
                $body.map_err(postgres::classify)
            }
        }
    };
}

/// A key as stored: what its first request was and, once done, the answer to replay.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct StoredKey {
    pub request_hash: String,
    pub status: String,
    pub response_status: Option<i64>,
    pub response_body: Option<String>,
    pub created_at: i64,
}

/// Who a key belongs to and which claim of it this transaction holds.
#[derive(Clone, Debug)]
pub struct Claim<'a> {
    pub account_id: &'a str,
    pub key: &'a str,
    pub claim_id: String,
    pub request_hash: &'a str,
    pub now_ms: i64,
}

#[derive(Clone, Copy, Debug)]
pub enum EntryKind {
    Opening,
    Payment,
    Refund,
}

impl EntryKind {
    fn as_str(self) -> &'static str {
        match self {
            EntryKind::Opening => "opening",
            EntryKind::Payment => "payment",
            EntryKind::Refund => "refund",
        }
    }
}

#[derive(Clone, Debug)]
pub struct LedgerEntry<'a> {
    pub account_id: &'a str,
    /// Signed kopecks: a debit is negative.
    pub amount: i64,
    pub kind: EntryKind,
    pub claim: Option<&'a Claim<'a>>,
    pub payment_id: Option<&'a str>,
    pub refund_id: Option<&'a str>,
    pub created_at: i64,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct AccountRow {
    pub account_id: String,
    pub balance: i64,
    pub currency: String,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PaymentRow {
    pub payment_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub balance_after: i64,
    pub created_at: i64,
    pub refunded: i64,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct RefundRow {
    pub refund_id: String,
    pub payment_id: String,
    pub amount: i64,
    pub refunded_total_after: i64,
    pub balance_after: i64,
    pub created_at: i64,
}

pub struct NewPayment<'a> {
    pub payment_id: &'a str,
    pub order_id: &'a str,
    pub amount: i64,
    pub currency: &'a str,
}

/// What a payment's guarded debit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charged {
    /// Debited, with the payment row and its ledger entry written: the new balance.
    Debited { balance: i64 },
    /// Nothing moved: the balance is short or the order is already paid.
    NotDebited,
    /// Another payment of this order committed after our check: roll back and look again.
    OrderTaken,
}

pub struct NewRefund<'a> {
    pub refund_id: &'a str,
    pub payment_id: &'a str,
    pub amount: i64,
    pub refunded_total_after: i64,
    pub balance_after: i64,
}

impl Store {
    /// Connects to `database_url` (`sqlite:` or `postgres:`), creating a SQLite file if missing,
    /// and runs the migrations.
    pub async fn connect(
        database_url: &str,
        pool_size: u32,
        lock_timeout: Duration,
    ) -> Result<Store, sqlx::Error> {
        if database_url.starts_with("sqlite:") {
            Ok(Store::Sqlite(sqlite::connect(database_url).await?))
        } else if database_url.starts_with("postgres:") || database_url.starts_with("postgresql:") {
            Ok(Store::Postgres(
                postgres::connect(database_url, pool_size, lock_timeout).await?,
            ))
        } else {
            Err(sqlx::Error::Configuration(
                "DATABASE_URL must start with sqlite: or postgres:".into(),
            ))
        }
    }

    /// A write transaction whose key claim waits at most the lock timeout.
    pub async fn begin_keyed(&self) -> Result<Tx, StoreError> {
        match self {
            Store::Sqlite(s) => s.begin().await.map(Tx::Sqlite).map_err(sqlite::classify),
            Store::Postgres(s) => s
                .begin_keyed()
                .await
                .map(Tx::Postgres)
                .map_err(postgres::classify),
        }
    }

    pub async fn begin(&self) -> Result<Tx, StoreError> {
        match self {
            Store::Sqlite(s) => s.begin().await.map(Tx::Sqlite).map_err(sqlite::classify),
            Store::Postgres(s) => s
                .begin()
                .await
                .map(Tx::Postgres)
                .map_err(postgres::classify),
        }
    }

    pub async fn stored_key(
        &self,
        account_id: &str,
        key: &str,
    ) -> Result<Option<StoredKey>, StoreError> {
        on_pool!(self, pool => sqlx::query_as(sql::STORED_KEY).bind(account_id).bind(key).fetch_optional(pool).await)
    }

    /// `(account_id, currency)` of the account holding this token hash.
    pub async fn account_by_token_hash(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        on_pool!(self, pool => sqlx::query_as(sql::ACCOUNT_BY_TOKEN_HASH).bind(token_hash).fetch_optional(pool).await)
    }

    pub async fn account(&self, account_id: &str) -> Result<Option<AccountRow>, StoreError> {
        on_pool!(self, pool => sqlx::query_as(sql::ACCOUNT).bind(account_id).fetch_optional(pool).await)
    }

    pub async fn payment(
        &self,
        account_id: &str,
        payment_id: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        on_pool!(self, pool => sqlx::query_as(sql::PAYMENT).bind(payment_id).bind(account_id).fetch_optional(pool).await)
    }

    pub async fn refunds_of(&self, payment_id: &str) -> Result<Vec<RefundRow>, StoreError> {
        on_pool!(self, pool => sqlx::query_as(sql::REFUNDS_OF_PAYMENT).bind(payment_id).fetch_all(pool).await)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query(sql::PING).execute(pool).await.map(|_| ()))
    }

    /// Deletes the keys created before `created_before_ms`; returns how many.
    pub async fn sweep_expired_keys(&self, created_before_ms: i64) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let deleted = on_tx!(&mut tx, conn => sqlx::query(sql::SWEEP_EXPIRED_KEYS).bind(created_before_ms).execute(conn).await.map(|r| r.rows_affected()))?;
        tx.commit().await?;
        Ok(deleted)
    }
}

impl Tx {
    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(tx) => tx.commit().await.map_err(sqlite::classify),
            Tx::Postgres(tx) => tx.commit().await.map_err(postgres::classify),
        }
    }

    /// Rolls back now rather than when the connection is next used.
    pub async fn rollback(self) {
        let _ = match self {
            Tx::Sqlite(tx) => tx.rollback().await,
            Tx::Postgres(tx) => tx.rollback().await,
        };
    }

    /// Claims the key for this transaction: `true` if it is ours (new, or expired and taken
    /// over), `false` if a live key holds it. Waits for an in-flight holder at most the lock
    /// timeout, then fails with [`StoreError::Busy`].
    pub async fn claim_key(
        &mut self,
        claim: &Claim<'_>,
        expired_before_ms: i64,
    ) -> Result<bool, StoreError> {
        let claimed: Option<String> = on_tx!(self, conn, statement = CLAIM_KEY => sqlx::query_scalar(statement)
            .bind(claim.account_id).bind(claim.key).bind(&claim.claim_id)
            .bind(claim.request_hash).bind(claim.now_ms).bind(expired_before_ms)
            .fetch_optional(conn).await)?;
        Ok(claimed.is_some())
    }

    pub async fn stored_key(
        &mut self,
        account_id: &str,
        key: &str,
    ) -> Result<Option<StoredKey>, StoreError> {
        on_tx!(self, conn => sqlx::query_as(sql::STORED_KEY).bind(account_id).bind(key).fetch_optional(conn).await)
    }

    /// Stores the answer under the claimed key and marks it done.
    pub async fn complete_key(
        &mut self,
        claim: &Claim<'_>,
        status: u16,
        body: &str,
    ) -> Result<(), StoreError> {
        let done = on_tx!(self, conn => sqlx::query(sql::COMPLETE_KEY)
            .bind(claim.account_id).bind(claim.key).bind(&claim.claim_id)
            .bind(i64::from(status)).bind(body)
            .execute(conn).await.map(|r| r.rows_affected()))?;
        debug_assert_eq!(done, 1, "a claimed key is completed exactly once");
        Ok(())
    }

    pub async fn insert_account(
        &mut self,
        account_id: &str,
        token_hash: &str,
        currency: &str,
        balance: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        on_tx!(self, conn => sqlx::query(sql::INSERT_ACCOUNT)
            .bind(account_id).bind(token_hash).bind(currency).bind(balance).bind(now_ms)
            .execute(conn).await.map(|_| ()))
    }

    /// A payment's guarded debit, its payment row and its ledger entry.
    pub async fn charge(
        &mut self,
        claim: &Claim<'_>,
        payment: &NewPayment<'_>,
    ) -> Result<Charged, StoreError> {
        match self {
            Tx::Postgres(tx) => {
                let (balance, inserted): (Option<i64>, i64) = sqlx::query_as(postgres::CHARGE)
                    .bind(payment.payment_id)
                    .bind(claim.account_id)
                    .bind(payment.amount)
                    .bind(payment.order_id)
                    .bind(payment.currency)
                    .bind(claim.key)
                    .bind(&claim.claim_id)
                    .bind(claim.now_ms)
                    .fetch_one(&mut **tx)
                    .await
                    .map_err(postgres::classify)?;
                Ok(match (balance, inserted) {
                    (None, _) => Charged::NotDebited,
                    (Some(_), 0) => Charged::OrderTaken,
                    (Some(balance), _) => Charged::Debited { balance },
                })
            }
            // SQLite runs one writer at a time, so three statements cost no lock time; it
            // has no data-modifying CTEs either.
            Tx::Sqlite(_) => {
                let debited: Option<i64> = on_tx!(self, conn => sqlx::query_scalar(sql::DEBIT_FOR_ORDER)
                    .bind(claim.account_id).bind(payment.amount).bind(payment.order_id)
                    .fetch_optional(conn).await)?;
                let Some(balance) = debited else {
                    return Ok(Charged::NotDebited);
                };
                let inserted = on_tx!(self, conn => sqlx::query(sql::INSERT_PAYMENT)
                    .bind(payment.payment_id).bind(claim.account_id).bind(payment.order_id)
                    .bind(payment.amount).bind(payment.currency).bind(balance)
                    .bind(claim.key).bind(claim.now_ms)
                    .execute(conn).await.map(|r| r.rows_affected()))?;
                if inserted == 0 {
                    return Ok(Charged::OrderTaken);
                }
                self.insert_ledger(&LedgerEntry {
                    account_id: claim.account_id,
                    amount: -payment.amount,
                    kind: EntryKind::Payment,
                    claim: Some(claim),
                    payment_id: Some(payment.payment_id),
                    refund_id: None,
                    created_at: claim.now_ms,
                })
                .await?;
                Ok(Charged::Debited { balance })
            }
        }
    }

    pub async fn credit(&mut self, account_id: &str, amount: i64) -> Result<i64, StoreError> {
        on_tx!(self, conn => sqlx::query_scalar(sql::CREDIT).bind(account_id).bind(amount).fetch_one(conn).await)
    }

    pub async fn balance(&mut self, account_id: &str) -> Result<i64, StoreError> {
        let row: AccountRow = on_tx!(self, conn => sqlx::query_as(sql::ACCOUNT).bind(account_id).fetch_one(conn).await)?;
        Ok(row.balance)
    }

    pub async fn insert_ledger(&mut self, entry: &LedgerEntry<'_>) -> Result<(), StoreError> {
        on_tx!(self, conn => sqlx::query(sql::INSERT_LEDGER)
            .bind(entry.account_id).bind(entry.amount).bind(entry.kind.as_str())
            .bind(entry.claim.map(|c| c.key)).bind(entry.claim.map(|c| c.claim_id.as_str()))
            .bind(entry.payment_id).bind(entry.refund_id).bind(entry.created_at)
            .execute(conn).await.map(|_| ()))
    }

    pub async fn paid_order(
        &mut self,
        account_id: &str,
        order_id: &str,
    ) -> Result<Option<String>, StoreError> {
        on_tx!(self, conn => sqlx::query_scalar(sql::PAID_ORDER).bind(account_id).bind(order_id).fetch_optional(conn).await)
    }

    pub async fn payment(
        &mut self,
        account_id: &str,
        payment_id: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        on_tx!(self, conn => sqlx::query_as(sql::PAYMENT).bind(payment_id).bind(account_id).fetch_optional(conn).await)
    }

    /// The payment's new refunded total, or `None` when `amount` exceeds what remains (or the
    /// payment is not this account's).
    pub async fn add_refunded(
        &mut self,
        account_id: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<Option<i64>, StoreError> {
        on_tx!(self, conn => sqlx::query_scalar(sql::ADD_REFUNDED).bind(payment_id).bind(account_id).bind(amount).fetch_optional(conn).await)
    }

    pub async fn insert_refund(
        &mut self,
        claim: &Claim<'_>,
        refund: &NewRefund<'_>,
    ) -> Result<(), StoreError> {
        on_tx!(self, conn => sqlx::query(sql::INSERT_REFUND)
            .bind(refund.refund_id).bind(refund.payment_id).bind(refund.amount)
            .bind(refund.refunded_total_after).bind(refund.balance_after)
            .bind(claim.key).bind(claim.now_ms)
            .execute(conn).await.map(|_| ()))
    }
}
