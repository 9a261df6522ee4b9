//! Where the money and the keys are kept: one API over SQLite or PostgreSQL, chosen by
//! `DATABASE_URL`. Each method is one statement; the SQL is in `sql.rs` (shared) and in the
//! database's own module (what differs).

mod postgres;
mod sql;
mod sqlite;

use std::time::Duration;

use checkout_idempotency::{
    Claim, Classify, Failure, Finish, KeyRecord, KeyStore, KeyTx, StoredResponse, Work,
};
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
    /// Completing a key updated no row: the claim was taken over (it expired mid-transaction)
    /// or never held. The transaction rolls back rather than answer without its key.
    #[error("the claim of an idempotency key was lost before it completed")]
    LostClaim,
}

impl Classify for StoreError {
    fn failure(&self) -> Failure {
        match self {
            StoreError::Busy(_) => Failure::Busy,
            StoreError::Retry(_) => Failure::Retry,
            StoreError::Unavailable(_) | StoreError::Other(_) | StoreError::LostClaim => {
                Failure::Fatal
            }
        }
    }
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

/// A key's row, as the protocol's [`KeyRecord`].
#[derive(Clone, Debug, sqlx::FromRow)]
struct KeyRow {
    request_hash: String,
    status: String,
    response_status: Option<i64>,
    response_body: Option<String>,
    created_at: i64,
}

impl From<KeyRow> for KeyRecord {
    fn from(row: KeyRow) -> KeyRecord {
        let response = match (row.status.as_str(), row.response_status, row.response_body) {
            ("done", Some(status), Some(body)) => Some(StoredResponse {
                // The column only ever holds statuses the server sent.
                status: u16::try_from(status).unwrap_or(500),
                body,
            }),
            _ => None,
        };
        KeyRecord {
            request_hash: row.request_hash,
            response,
            created_at_ms: row.created_at,
        }
    }
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
    pub claim: Option<&'a Claim>,
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

/// One row of [`sql::PAYMENT_WITH_REFUNDS`]: the payment, and one of its refunds if any.
#[derive(Debug, sqlx::FromRow)]
struct PaymentRefundRow {
    #[sqlx(flatten)]
    payment: PaymentRow,
    refund_id: Option<String>,
    refund_amount: Option<i64>,
    refunded_total_after: Option<i64>,
    refund_balance_after: Option<i64>,
    refund_created_at: Option<i64>,
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

    /// The payment with its refunds, read by one statement, so that both come from one snapshot
    /// even while refunds are being made: `refunded` always equals the refunds' sum.
    pub async fn payment_with_refunds(
        &self,
        account_id: &str,
        payment_id: &str,
    ) -> Result<Option<(PaymentRow, Vec<RefundRow>)>, StoreError> {
        let rows: Vec<PaymentRefundRow> = on_pool!(self, pool => sqlx::query_as(sql::PAYMENT_WITH_REFUNDS)
            .bind(payment_id).bind(account_id).fetch_all(pool).await)?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let payment = first.payment.clone();
        let refunds = rows
            .into_iter()
            .filter_map(|row| {
                Some(RefundRow {
                    refund_id: row.refund_id?,
                    payment_id: row.payment.payment_id,
                    amount: row.refund_amount?,
                    refunded_total_after: row.refunded_total_after?,
                    balance_after: row.refund_balance_after?,
                    created_at: row.refund_created_at?,
                })
            })
            .collect();
        Ok(Some((payment, refunds)))
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query(sql::PING).execute(pool).await.map(|_| ()))
    }

    /// Deletes at most `batch` keys created before `created_before_ms`, in a transaction of its
    /// own (short, so that SQLite's one writer is never held for long); returns how many.
    pub async fn sweep_expired_keys(
        &self,
        created_before_ms: i64,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let deleted = on_tx!(&mut tx, conn => sqlx::query(sql::SWEEP_EXPIRED_KEYS)
            .bind(created_before_ms).bind(batch)
            .execute(conn).await.map(|r| r.rows_affected()))?;
        tx.commit().await?;
        Ok(deleted)
    }
}

impl KeyStore for Store {
    type Tx = Tx;
    type Error = StoreError;

    async fn stored_key(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<KeyRow> = on_pool!(self, pool => sqlx::query_as(sql::STORED_KEY).bind(scope).bind(key).fetch_optional(pool).await)?;
        Ok(row.map(KeyRecord::from))
    }

    /// One transaction on one connection: `BEGIN` (SQLite: `IMMEDIATE`; PostgreSQL: with the
    /// claim's lock timeout), the work, then `COMMIT` or `ROLLBACK`.
    async fn transaction<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<Tx>,
    {
        let mut tx = self.begin_keyed().await?;
        match work.run(&mut tx).await {
            Ok(Finish::Commit(output)) => {
                tx.commit().await?;
                Ok(output)
            }
            Ok(Finish::Rollback(output)) => {
                tx.rollback().await;
                Ok(output)
            }
            Err(error) => {
                tx.rollback().await;
                Err(error)
            }
        }
    }
}

impl KeyTx for Tx {
    type Error = StoreError;

    async fn claim(&mut self, claim: &Claim, expired_before_ms: i64) -> Result<bool, StoreError> {
        let claimed: Option<String> = on_tx!(self, conn, statement = CLAIM_KEY => sqlx::query_scalar(statement)
            .bind(&claim.scope).bind(&claim.key).bind(&claim.claim_id)
            .bind(&claim.request_hash).bind(claim.now_ms).bind(expired_before_ms)
            .fetch_optional(conn).await)?;
        Ok(claimed.is_some())
    }

    async fn stored_key(
        &mut self,
        scope: &str,
        key: &str,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<KeyRow> = on_tx!(self, conn => sqlx::query_as(sql::STORED_KEY).bind(scope).bind(key).fetch_optional(conn).await)?;
        Ok(row.map(KeyRecord::from))
    }

    async fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let done = on_tx!(self, conn => sqlx::query(sql::COMPLETE_KEY)
            .bind(&claim.scope).bind(&claim.key).bind(&claim.claim_id)
            .bind(i64::from(response.status)).bind(&response.body)
            .execute(conn).await.map(|r| r.rows_affected()))?;
        if done == 1 {
            Ok(())
        } else {
            Err(StoreError::LostClaim)
        }
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
        claim: &Claim,
        payment: &NewPayment<'_>,
    ) -> Result<Charged, StoreError> {
        match self {
            Tx::Postgres(tx) => {
                let (balance, inserted): (Option<i64>, i64) = sqlx::query_as(postgres::CHARGE)
                    .bind(payment.payment_id)
                    .bind(&claim.scope)
                    .bind(payment.amount)
                    .bind(payment.order_id)
                    .bind(payment.currency)
                    .bind(&claim.key)
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
                    .bind(&claim.scope).bind(payment.amount).bind(payment.order_id)
                    .fetch_optional(conn).await)?;
                let Some(balance) = debited else {
                    return Ok(Charged::NotDebited);
                };
                let inserted = on_tx!(self, conn => sqlx::query(sql::INSERT_PAYMENT)
                    .bind(payment.payment_id).bind(&claim.scope).bind(payment.order_id)
                    .bind(payment.amount).bind(payment.currency).bind(balance)
                    .bind(&claim.key).bind(claim.now_ms)
                    .execute(conn).await.map(|r| r.rows_affected()))?;
                if inserted == 0 {
                    return Ok(Charged::OrderTaken);
                }
                self.insert_ledger(&LedgerEntry {
                    account_id: &claim.scope,
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
            .bind(entry.claim.map(|c| c.key.as_str())).bind(entry.claim.map(|c| c.claim_id.as_str()))
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
        claim: &Claim,
        refund: &NewRefund<'_>,
    ) -> Result<(), StoreError> {
        on_tx!(self, conn => sqlx::query(sql::INSERT_REFUND)
            .bind(refund.refund_id).bind(refund.payment_id).bind(refund.amount)
            .bind(refund.refunded_total_after).bind(refund.balance_after)
            .bind(&claim.key).bind(claim.now_ms)
            .execute(conn).await.map(|_| ()))
    }
}
