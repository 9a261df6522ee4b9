//! Where the money and the keys are kept: one API over SQLite or PostgreSQL, chosen by
//! `DATABASE_URL`. Each method is one statement, written once for both databases (arguments
//! bound to `$n`, rows read by column name, see `row.rs`); the SQL is in `sql.rs` (shared) and in
//! the database's own module (what differs).

mod postgres;
mod row;
pub mod sql;
mod sqlite;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use checkout_idempotency::{
    Claim, Classify, Failure, Finish, KeyRecord, KeyStore, KeyTx, StoredResponse, Work,
};
use sqlx::{Postgres, Transaction};

pub use postgres::PgStore;
pub use row::Template;
use row::{Arg, ReadRow, Row, RowError};
pub use sqlite::{SqliteStore, SqliteTx, WriterStats};

/// The claim as SQLite spells it (for a benchmark that runs the server's own statements).
pub fn sqlite_claim_key() -> &'static str {
    &sqlite::CLAIM_KEY
}

/// The outbox's insert as SQLite spells it (its `seq` is the next one under the one writer).
pub fn sqlite_insert_event() -> &'static str {
    sqlite::INSERT_EVENT
}

/// The server's migrations, in order, as SQL text (for a benchmark that builds the same schema
/// outside the server: it can never fall behind a new migration).
pub fn sqlite_migrations() -> impl Iterator<Item = &'static str> {
    sqlite::MIGRATOR.iter().map(|migration| &*migration.sql)
}

/// The same, as PostgreSQL's.
pub fn postgres_migrations() -> impl Iterator<Item = &'static str> {
    postgres::MIGRATOR.iter().map(|migration| &*migration.sql)
}

/// The claim as PostgreSQL spells it.
pub fn postgres_claim_key() -> &'static str {
    &postgres::CLAIM_KEY
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A lock or a connection was not had within its bound. On a key claim this means the
    /// first request with that key is still executing.
    #[error("the database is busy: {0}")]
    Busy(BoxError),
    /// The transaction lost a serialization race and may simply be run again.
    #[error("transaction must be retried: {0}")]
    Retry(BoxError),
    #[error("the database is unavailable: {0}")]
    Unavailable(BoxError),
    /// `COMMIT` was sent and no answer came back (the connection broke): the transaction may
    /// or may not have committed. Only the key can tell, so a retry must reuse it.
    #[error("the outcome of COMMIT is unknown: {0}")]
    InDoubt(BoxError),
    #[error("database error: {0}")]
    Other(BoxError),
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
            StoreError::Unavailable(_)
            | StoreError::InDoubt(_)
            | StoreError::Other(_)
            | StoreError::LostClaim => Failure::Fatal,
        }
    }
}

/// Why the store could not be opened at start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Database(#[from] sqlx::Error),
    #[error("{0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(
        "the file {} is in use by another checkout-server process (one process per SQLite file)",
        file.display()
    )]
    InUse { file: PathBuf },
    #[error("{0}")]
    Config(String),
}

/// How the store is opened.
#[derive(Clone, Copy, Debug)]
pub struct StoreSettings {
    /// PostgreSQL connections of this instance.
    pub pool_size: u32,
    /// How long a claim waits on PostgreSQL for an in-flight holder of its key.
    pub lock_timeout: Duration,
    /// Units of work per SQLite commit at most (1: a commit per request).
    pub sqlite_batch: usize,
    /// Hold a SQLite file for this process alone (a server); an operator's command that only
    /// adds a row beside a running server does not.
    pub exclusive: bool,
    /// SQLite: the most the file may grow to, in KiB; past it writes are refused (`503`), and
    /// nothing of a refused request is kept. `None`: as large as the disk allows.
    pub sqlite_max_size_kib: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct OutboxBacklog {
    pub depth: i64,
    pub oldest_created_at_ms: Option<i64>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct PoolUsage {
    pub in_use: u64,
    pub waiting: u64,
}

#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

/// One open write transaction, lent to a unit of work by [`KeyStore::transaction`].
pub enum Tx {
    /// The SQLite writer's connection, inside the unit's savepoint of the current batch.
    Sqlite(SqliteTx),
    Postgres(Transaction<'static, Postgres>),
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

/// Who an account belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountKind {
    Shopper,
    Shop,
    System,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::Shopper => "shopper",
            AccountKind::Shop => "shop",
            AccountKind::System => "system",
        }
    }

    fn parse(text: &str) -> Result<AccountKind, RowError> {
        match text {
            "shopper" => Ok(AccountKind::Shopper),
            "shop" => Ok(AccountKind::Shop),
            "system" => Ok(AccountKind::System),
            other => Err(format!("unknown account kind {other}").into()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct AccountRow {
    pub account_id: String,
    pub kind: AccountKind,
    /// With the credits not folded into it yet.
    pub balance: i64,
    pub currency: String,
}

impl AccountRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(AccountRow {
            account_id: row.text("account_id")?,
            kind: AccountKind::parse(&row.text("kind")?)?,
            balance: row.int("balance")?,
            currency: row.text("currency")?,
        })
    }
}

#[derive(Clone, Debug)]
pub struct ShopRow {
    pub shop_id: String,
    pub account_id: String,
    pub name: String,
    pub webhook_url: Option<String>,
    pub signing_secret: String,
}

impl ShopRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(ShopRow {
            shop_id: row.text("shop_id")?,
            account_id: row.text("account_id")?,
            name: row.text("name")?,
            webhook_url: row.opt_text("webhook_url")?,
            signing_secret: row.text("signing_secret")?,
        })
    }
}

/// An event in the outbox, as stored.
#[derive(Clone, Debug)]
pub struct EventRow {
    pub event_id: String,
    pub seq: i64,
    pub shop_account_id: String,
    pub event_type: String,
    pub subject_id: String,
    /// The JSON body, exactly as it is sent and signed.
    pub body: String,
    pub created_at: i64,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub delivered_at: Option<i64>,
    /// The lease of the attempt in flight, if any.
    pub lease_id: Option<String>,
}

impl EventRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(EventRow {
            event_id: row.text("event_id")?,
            seq: row.int("seq")?,
            shop_account_id: row.text("shop_account_id")?,
            event_type: row.text("type")?,
            subject_id: row.text("subject_id")?,
            body: row.text("body")?,
            created_at: row.int("created_at")?,
            status: row.text("status")?,
            attempts: row.int("attempts")?,
            next_attempt_at: row.int("next_attempt_at")?,
            last_error: row.opt_text("last_error")?,
            delivered_at: row.opt_int("delivered_at")?,
            lease_id: row.opt_text("lease_id")?,
        })
    }
}

/// A session that lapsed unpaid, as the shop hears of it.
#[derive(Clone, Debug)]
pub struct ExpiredSession {
    pub session_id: String,
    pub shop_account_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub expires_at: i64,
}

/// A payment after a refund was added to it.
#[derive(Clone, Debug)]
pub struct Refunded {
    pub refunded_total: i64,
    pub shopper_account_id: String,
    pub order_id: String,
    pub currency: String,
}

/// How one delivery attempt of an event ended.
#[derive(Clone, Debug)]
pub enum EventSettled {
    Delivered,
    /// To be tried again this long from now (by the database's clock).
    RetryAfter {
        pause_ms: i64,
        error: String,
    },
    Dead {
        error: String,
    },
}

/// An event to write in the transaction of the change it tells of.
pub struct NewEvent<'a> {
    pub event_id: &'a str,
    pub shop_account_id: &'a str,
    pub event_type: &'a str,
    pub subject_id: &'a str,
    pub body: &'a str,
    pub created_at: i64,
}

#[derive(Clone, Debug)]
pub struct SessionRow {
    pub session_id: String,
    pub shop_account_id: String,
    pub shop_name: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    /// JSON array of line items.
    pub items: String,
    pub status: String,
    pub payment_id: Option<String>,
    pub expires_at: i64,
}

impl SessionRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(SessionRow {
            session_id: row.text("session_id")?,
            shop_account_id: row.text("shop_account_id")?,
            shop_name: row.text("shop_name")?,
            order_id: row.text("order_id")?,
            amount: row.int("amount")?,
            currency: row.text("currency")?,
            description: row.opt_text("description")?,
            items: row.text("items")?,
            status: row.text("status")?,
            payment_id: row.opt_text("payment_id")?,
            expires_at: row.int("expires_at")?,
        })
    }
}

pub struct NewSession<'a> {
    pub session_id: &'a str,
    pub shop_account_id: &'a str,
    pub order_id: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub description: Option<&'a str>,
    pub items: &'a str,
    pub expires_at: i64,
    pub created_at: i64,
}

/// What [`Tx::take_session`] took: the session's terms, as its shop set them.
#[derive(Clone, Debug)]
pub struct TakenSession {
    pub shop_account_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
}

#[derive(Clone, Debug)]
pub struct PaymentRow {
    pub payment_id: String,
    pub checkout_session_id: Option<String>,
    pub shopper_account_id: String,
    pub shop_account_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    /// The shopper's balance right after the payment.
    pub balance_after: i64,
    pub created_at: i64,
    pub refunded: i64,
}

impl PaymentRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(PaymentRow {
            payment_id: row.text("payment_id")?,
            checkout_session_id: row.opt_text("checkout_session_id")?,
            shopper_account_id: row.text("shopper_account_id")?,
            shop_account_id: row.text("shop_account_id")?,
            order_id: row.text("order_id")?,
            amount: row.int("amount")?,
            currency: row.text("currency")?,
            balance_after: row.int("balance_after")?,
            created_at: row.int("created_at")?,
            refunded: row.int("refunded")?,
        })
    }
}

#[derive(Clone, Debug)]
pub struct RefundRow {
    pub refund_id: String,
    pub payment_id: String,
    pub amount: i64,
    pub refunded_total_after: i64,
    /// The shop's balance right after the refund.
    pub balance_after: i64,
    pub created_at: i64,
}

/// One row of [`sql::PAYMENT_WITH_REFUNDS`]: the payment, and one of its refunds if any.
fn read_payment_and_refund(row: &dyn Row) -> Result<(PaymentRow, Option<RefundRow>), RowError> {
    let payment = PaymentRow::read(row)?;
    let refund = match row.opt_text("refund_id")? {
        Some(refund_id) => Some(RefundRow {
            refund_id,
            payment_id: payment.payment_id.clone(),
            amount: row.int("refund_amount")?,
            refunded_total_after: row.int("refunded_total_after")?,
            balance_after: row.int("refund_balance_after")?,
            created_at: row.int("refund_created_at")?,
        }),
        None => None,
    };
    Ok((payment, refund))
}

fn read_key(row: &dyn Row) -> Result<KeyRecord, RowError> {
    let response = match (
        row.text("status")?.as_str(),
        row.opt_int("response_status")?,
        row.opt_text("response_body")?,
    ) {
        ("done", Some(status), Some(body)) => Some(StoredResponse {
            // The column only ever holds statuses the server sent.
            status: u16::try_from(status).unwrap_or(500),
            body,
        }),
        _ => None,
    };
    Ok(KeyRecord {
        request_hash: row.text("request_hash")?,
        request_body: row.opt_text("request_body")?,
        response,
        created_at_ms: row.int("created_at")?,
    })
}

pub struct NewPayment<'a> {
    pub payment_id: &'a str,
    pub checkout_session_id: &'a str,
    pub shopper_account_id: &'a str,
    pub shop_account_id: &'a str,
    pub order_id: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub balance_after: i64,
}

pub struct NewRefund<'a> {
    pub refund_id: &'a str,
    pub payment_id: &'a str,
    pub amount: i64,
    pub refunded_total_after: i64,
    pub balance_after: i64,
}

/// A future borrowing the transaction it runs in, for [`Store::write`].
pub type TxFuture<'t, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 't>>;

impl Store {
    /// Opens `database_url` (`sqlite:` or `postgres:`), creating a SQLite file if missing, and
    /// runs the migrations.
    pub async fn connect(
        database_url: &str,
        settings: StoreSettings,
    ) -> Result<Store, ConnectError> {
        if database_url.starts_with("sqlite:") {
            Ok(Store::Sqlite(
                sqlite::connect(database_url, &settings).await?,
            ))
        } else if database_url.starts_with("postgres:") || database_url.starts_with("postgresql:") {
            Ok(Store::Postgres(
                postgres::connect(database_url, settings.pool_size, settings.lock_timeout).await?,
            ))
        } else {
            Err(ConnectError::Config(
                "DATABASE_URL must start with sqlite: or postgres:".into(),
            ))
        }
    }

    /// A write that is not keyed: `f` runs inside one transaction, which commits if it
    /// returns `Ok`.
    pub async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut Tx) -> TxFuture<'t, T> + Send + 'static,
    {
        self.transaction(Write(f)).await
    }

    /// A read outside any transaction: SQLite's readers or PostgreSQL's pool.
    async fn read<T: Send + 'static>(
        &self,
        sql: &'static str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Vec<T>, StoreError> {
        match self {
            Store::Sqlite(store) => store.read(sql, args, read).await,
            Store::Postgres(store) => postgres::fetch_all(&store.pool, sql, args, read).await,
        }
    }

    /// `(account_id, currency)` of the account holding this token hash.
    /// `(account_id, currency, kind)` of the account holding this token or secret key hash.
    pub async fn account_by_token_hash(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, String, AccountKind)>, StoreError> {
        let rows = self
            .read(
                sql::ACCOUNT_BY_TOKEN_HASH,
                &[Arg::Text(token_hash)],
                |row| {
                    Ok((
                        row.text("account_id")?,
                        row.text("currency")?,
                        AccountKind::parse(&row.text("kind")?)?,
                    ))
                },
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    /// A checkout session with its shop's name.
    pub async fn session(&self, session_id: &str) -> Result<Option<SessionRow>, StoreError> {
        let rows = self
            .read(sql::SESSION, &[Arg::Text(session_id)], SessionRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    pub async fn shop(&self, shop_id: &str) -> Result<Option<ShopRow>, StoreError> {
        let rows = self
            .read(sql::SHOP, &[Arg::Text(shop_id)], ShopRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    pub async fn account(&self, account_id: &str) -> Result<Option<AccountRow>, StoreError> {
        let rows = self
            .read(sql::ACCOUNT, &[Arg::Text(account_id)], AccountRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    /// The payment with its refunds, read by one statement, so that both come from one snapshot
    /// even while refunds are being made: `refunded` always equals the refunds' sum. Only for
    /// the payment's shopper or shop.
    pub async fn payment_with_refunds(
        &self,
        account_id: &str,
        payment_id: &str,
    ) -> Result<Option<(PaymentRow, Vec<RefundRow>)>, StoreError> {
        let rows = self
            .read(
                sql::PAYMENT_WITH_REFUNDS,
                &[Arg::Text(payment_id), Arg::Text(account_id)],
                read_payment_and_refund,
            )
            .await?;
        let Some((payment, _)) = rows.first() else {
            return Ok(None);
        };
        let payment = payment.clone();
        let refunds = rows.into_iter().filter_map(|(_, refund)| refund).collect();
        Ok(Some((payment, refunds)))
    }

    pub async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        let rows = self
            .read(sql::OUTBOX_BACKLOG, &[], |row| {
                Ok(OutboxBacklog {
                    depth: row.int("depth")?,
                    oldest_created_at_ms: row.opt_int("oldest")?,
                })
            })
            .await?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }

    /// Connections busy and requests waiting for one, now.
    pub fn pool_usage(&self) -> PoolUsage {
        match self {
            Store::Sqlite(store) => store.usage(),
            Store::Postgres(store) => PoolUsage {
                in_use: u64::from(store.pool.size()).saturating_sub(store.pool.num_idle() as u64),
                waiting: store.waiting.load(std::sync::atomic::Ordering::Relaxed),
            },
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.read(sql::PING, &[], |row| row.int("one")).await?;
        Ok(())
    }

    pub async fn shop_of_account(&self, account_id: &str) -> Result<Option<ShopRow>, StoreError> {
        let rows = self
            .read(
                sql::SHOP_OF_ACCOUNT,
                &[Arg::Text(account_id)],
                ShopRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Leases up to `limit` due events to this worker for `lease_ms` under `lease_id`, at most
    /// `per_shop` of any one shop in flight, in a short transaction of its own. Time is the
    /// database's (see [`Template`]).
    pub async fn claim_due_events(
        &self,
        lease_ms: i64,
        lease_id: &str,
        per_shop: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        let lease_id = lease_id.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                let statement = tx.template(&sql::CLAIM_DUE_EVENTS);
                let mut events = tx
                    .fetch_all(
                        statement,
                        &[
                            Arg::Int(lease_ms),
                            Arg::Text(&lease_id),
                            Arg::Int(per_shop),
                            Arg::Int(limit),
                        ],
                        EventRow::read,
                    )
                    .await?;
                events.sort_by_key(|e| e.seq);
                Ok(events)
            })
        })
        .await
    }

    /// Records how the attempt under `lease_id` ended: delivered, to be retried, or dead. An
    /// attempt whose lease was taken away (a redelivery request) records nothing.
    pub async fn settle_event(
        &self,
        event_id: &str,
        lease_id: &str,
        settled: EventSettled,
    ) -> Result<(), StoreError> {
        let (event_id, lease_id) = (event_id.to_owned(), lease_id.to_owned());
        self.write(move |tx| {
            Box::pin(async move {
                let (event, lease) = (Arg::Text(&event_id), Arg::Text(&lease_id));
                match settled {
                    EventSettled::Delivered => {
                        let statement = tx.template(&sql::EVENT_DELIVERED);
                        tx.execute(statement, &[event, lease]).await?
                    }
                    EventSettled::RetryAfter { pause_ms, error } => {
                        let statement = tx.template(&sql::EVENT_RETRY_AT);
                        tx.execute(
                            statement,
                            &[event, lease, Arg::Int(pause_ms), Arg::Text(&error)],
                        )
                        .await?
                    }
                    EventSettled::Dead { error } => {
                        tx.execute(sql::EVENT_DEAD, &[event, lease, Arg::Text(&error)])
                            .await?
                    }
                };
                Ok(())
            })
        })
        .await
    }

    /// A shop's events, newest first, before `before_seq`.
    pub async fn shop_events(
        &self,
        shop_account_id: &str,
        before_seq: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        self.read(
            sql::SHOP_EVENTS,
            &[
                Arg::Text(shop_account_id),
                Arg::Int(before_seq),
                Arg::Int(limit),
            ],
            EventRow::read,
        )
        .await
    }

    pub async fn shop_event(
        &self,
        shop_account_id: &str,
        event_id: &str,
    ) -> Result<Option<EventRow>, StoreError> {
        let rows = self
            .read(
                sql::SHOP_EVENT,
                &[Arg::Text(event_id), Arg::Text(shop_account_id)],
                EventRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Puts one of the shop's events back in the queue with a fresh schedule: due now, or as
    /// soon as an attempt in flight has ended.
    pub async fn redeliver_event(
        &self,
        shop_account_id: &str,
        event_id: &str,
    ) -> Result<Option<EventRow>, StoreError> {
        let (shop, event) = (shop_account_id.to_owned(), event_id.to_owned());
        self.write(move |tx| {
            Box::pin(async move {
                let statement = tx.template(&sql::REDELIVER_EVENT);
                tx.fetch_optional(
                    statement,
                    &[Arg::Text(&event), Arg::Text(&shop)],
                    EventRow::read,
                )
                .await
            })
        })
        .await
    }

    /// Sets (or clears) a shop's webhook URL, in a transaction of its own (see
    /// [`Tx::set_webhook_url`]).
    pub async fn set_shop_webhook_url(
        &self,
        shop_id: &str,
        webhook_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let (shop_id, webhook_url) = (shop_id.to_owned(), webhook_url.map(str::to_owned));
        self.write(move |tx| {
            Box::pin(async move { tx.set_webhook_url(&shop_id, webhook_url.as_deref()).await })
        })
        .await
    }

    /// Deletes at most `batch` keys created before `created_before_ms`, in a transaction of its
    /// own (short, so that SQLite's one writer is never held for long); returns how many.
    pub async fn sweep_expired_keys(
        &self,
        created_before_ms: i64,
        batch: i64,
    ) -> Result<u64, StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                let statement = tx.template(&sql::SWEEP_EXPIRED_KEYS);
                tx.execute(statement, &[Arg::Int(created_before_ms), Arg::Int(batch)])
                    .await
            })
        })
        .await
    }
}

impl KeyStore for Store {
    type Tx = Tx;
    type Error = StoreError;

    fn reads_before_claim(&self) -> bool {
        matches!(self, Store::Sqlite(_))
    }

    async fn stored_key(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let rows = self
            .read(
                sql::STORED_KEY,
                &[Arg::Text(scope), Arg::Text(key)],
                read_key,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    /// PostgreSQL: one transaction on one pooled connection (`BEGIN` with the claim's lock
    /// timeout, the work, `COMMIT` or `ROLLBACK`). SQLite: a savepoint in the writer's current
    /// batch, answered after the batch's commit.
    async fn transaction<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<Tx>,
    {
        match self {
            Store::Sqlite(store) => store.transaction(work).await,
            Store::Postgres(store) => {
                let mut tx = Tx::Postgres(store.begin().await?);
                let finish = work.run(&mut tx).await;
                let Tx::Postgres(tx) = tx else {
                    unreachable!("a PostgreSQL store lends only PostgreSQL transactions");
                };
                match finish {
                    Ok(Finish::Commit(output)) => {
                        tx.commit().await.map_err(postgres::classify_commit)?;
                        Ok(output)
                    }
                    Ok(Finish::Rollback(output)) => {
                        let _ = tx.rollback().await;
                        Ok(output)
                    }
                    Err(error) => {
                        let _ = tx.rollback().await;
                        Err(error)
                    }
                }
            }
        }
    }
}

/// [`Store::write`]'s closure as a unit of work.
struct Write<F>(F);

impl<T, F> Work<Tx> for Write<F>
where
    T: Send + 'static,
    F: for<'t> FnOnce(&'t mut Tx) -> TxFuture<'t, T> + Send + 'static,
{
    type Output = T;
    type Error = StoreError;

    async fn run(self, tx: &mut Tx) -> Result<Finish<T>, StoreError> {
        (self.0)(tx).await.map(Finish::Commit)
    }
}

impl KeyTx for Tx {
    type Error = StoreError;

    async fn claim(&mut self, claim: &Claim, expired_before_ms: i64) -> Result<bool, StoreError> {
        let statement = self.spelled(&sqlite::CLAIM_KEY, &postgres::CLAIM_KEY);
        let claimed = self
            .fetch_all(
                statement,
                &[
                    Arg::Text(&claim.scope),
                    Arg::Text(&claim.key),
                    Arg::Text(&claim.claim_id),
                    Arg::Text(&claim.request_hash),
                    Arg::Int(claim.now_ms),
                    Arg::Int(expired_before_ms),
                    Arg::Text(&claim.request_body),
                ],
                |row| row.text("claim_id"),
            )
            .await?;
        Ok(!claimed.is_empty())
    }

    async fn stored_key(
        &mut self,
        scope: &str,
        key: &str,
    ) -> Result<Option<KeyRecord>, StoreError> {
        self.fetch_optional(
            sql::STORED_KEY,
            &[Arg::Text(scope), Arg::Text(key)],
            read_key,
        )
        .await
    }

    async fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let done = self
            .execute(
                sql::COMPLETE_KEY,
                &[
                    Arg::Text(&claim.scope),
                    Arg::Text(&claim.key),
                    Arg::Text(&claim.claim_id),
                    Arg::Int(i64::from(response.status)),
                    Arg::Text(&response.body),
                ],
            )
            .await?;
        if done == 1 {
            Ok(())
        } else {
            Err(StoreError::LostClaim)
        }
    }
}

impl Tx {
    /// A [`Template`] as this transaction's database spells it.
    fn template<'s>(&self, template: &'s Template) -> &'s str {
        match self {
            Tx::Sqlite(_) => template.sqlite(),
            Tx::Postgres(_) => template.postgres(),
        }
    }

    /// The statement as this transaction's database spells it.
    fn spelled<'s>(&self, sqlite: &'s str, postgres: &'s str) -> &'s str {
        match self {
            Tx::Sqlite(_) => sqlite,
            Tx::Postgres(_) => postgres,
        }
    }

    async fn fetch_all<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Vec<T>, StoreError> {
        match self {
            Tx::Sqlite(tx) => tx.fetch_all(sql, args, read),
            Tx::Postgres(tx) => postgres::fetch_all(&mut **tx, sql, args, read).await,
        }
    }

    async fn fetch_optional<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Option<T>, StoreError> {
        Ok(self.fetch_all(sql, args, read).await?.into_iter().next())
    }

    async fn fetch_one<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<T, StoreError> {
        self.fetch_optional(sql, args, read)
            .await?
            .ok_or_else(|| StoreError::Other(format!("no row from {sql}").into()))
    }

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        match self {
            Tx::Sqlite(tx) => tx.execute(sql, args),
            Tx::Postgres(tx) => postgres::execute(&mut **tx, sql, args).await,
        }
    }

    pub async fn insert_account(
        &mut self,
        account_id: &str,
        token_hash: &str,
        kind: AccountKind,
        currency: &str,
        balance: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            sql::INSERT_ACCOUNT,
            &[
                Arg::Text(account_id),
                Arg::Text(token_hash),
                Arg::Text(currency),
                Arg::Int(balance),
                Arg::Int(now_ms),
                Arg::Text(kind.as_str()),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn set_token_hash(
        &mut self,
        account_id: &str,
        token_hash: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            sql::SET_TOKEN_HASH,
            &[Arg::Text(account_id), Arg::Text(token_hash)],
        )
        .await
        .map(|_| ())
    }

    /// Sets (or clears) a shop's webhook URL; its undelivered events follow: to the new
    /// endpoint at once, on a fresh schedule, or kept as `no_endpoint`. `false` if there is no
    /// such shop.
    pub async fn set_webhook_url(
        &mut self,
        shop_id: &str,
        webhook_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let Some(account_id) = self
            .fetch_optional(
                sql::SET_SHOP_WEBHOOK_URL,
                &[Arg::Text(shop_id), Arg::OptText(webhook_url)],
                |row| row.text("account_id"),
            )
            .await?
        else {
            return Ok(false);
        };
        let statement = if webhook_url.is_some() {
            self.template(&sql::EVENTS_TO_NEW_ENDPOINT)
        } else {
            self.template(&sql::EVENTS_WITHOUT_ENDPOINT)
        };
        self.execute(statement, &[Arg::Text(&account_id)]).await?;
        Ok(true)
    }

    pub async fn insert_shop(&mut self, shop: &ShopRow, now_ms: i64) -> Result<(), StoreError> {
        self.execute(
            sql::INSERT_SHOP,
            &[
                Arg::Text(&shop.shop_id),
                Arg::Text(&shop.account_id),
                Arg::Text(&shop.name),
                Arg::OptText(shop.webhook_url.as_deref()),
                Arg::Text(&shop.signing_secret),
                Arg::Int(now_ms),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn shop(&mut self, shop_id: &str) -> Result<Option<ShopRow>, StoreError> {
        self.fetch_optional(sql::SHOP, &[Arg::Text(shop_id)], ShopRow::read)
            .await
    }

    /// `false` when the order has a session already (the unique index decided).
    pub async fn insert_session(&mut self, session: &NewSession<'_>) -> Result<bool, StoreError> {
        let inserted = self
            .fetch_optional(
                sql::INSERT_SESSION,
                &[
                    Arg::Text(session.session_id),
                    Arg::Text(session.shop_account_id),
                    Arg::Text(session.order_id),
                    Arg::Int(session.amount),
                    Arg::Text(session.currency),
                    Arg::OptText(session.description),
                    Arg::Text(session.items),
                    Arg::Int(session.expires_at),
                    Arg::Int(session.created_at),
                ],
                |row| row.text("session_id"),
            )
            .await?;
        Ok(inserted.is_some())
    }

    pub async fn session_of_order(
        &mut self,
        shop_account_id: &str,
        order_id: &str,
    ) -> Result<Option<String>, StoreError> {
        self.fetch_optional(
            sql::SESSION_OF_ORDER,
            &[Arg::Text(shop_account_id), Arg::Text(order_id)],
            |row| row.text("session_id"),
        )
        .await
    }

    pub async fn session(&mut self, session_id: &str) -> Result<Option<SessionRow>, StoreError> {
        self.fetch_optional(sql::SESSION, &[Arg::Text(session_id)], SessionRow::read)
            .await
    }

    /// Marks an open, unexpired session paid by `payment_id`; `None` if it is not one.
    pub async fn take_session(
        &mut self,
        session_id: &str,
        payment_id: &str,
        now_ms: i64,
    ) -> Result<Option<TakenSession>, StoreError> {
        self.fetch_optional(
            sql::TAKE_SESSION,
            &[
                Arg::Text(session_id),
                Arg::Text(payment_id),
                Arg::Int(now_ms),
            ],
            |row| {
                Ok(TakenSession {
                    shop_account_id: row.text("shop_account_id")?,
                    order_id: row.text("order_id")?,
                    amount: row.int("amount")?,
                    currency: row.text("currency")?,
                })
            },
        )
        .await
    }

    pub async fn release_session(
        &mut self,
        session_id: &str,
        payment_id: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            sql::RELEASE_SESSION,
            &[Arg::Text(session_id), Arg::Text(payment_id)],
        )
        .await
        .map(|_| ())
    }

    /// The guarded debit: the new balance, or `None` when the balance is short.
    pub async fn debit(
        &mut self,
        account_id: &str,
        amount: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.fetch_optional(
            sql::DEBIT,
            &[Arg::Text(account_id), Arg::Int(amount)],
            |row| row.int("balance"),
        )
        .await
    }

    pub async fn credit(&mut self, account_id: &str, amount: i64) -> Result<i64, StoreError> {
        self.fetch_one(
            sql::CREDIT,
            &[Arg::Text(account_id), Arg::Int(amount)],
            |row| row.int("balance"),
        )
        .await
    }

    /// A shop's credit from a payment, which waits to be folded into its balance: no payment
    /// to a shop ever queues on the shop's balance row.
    pub async fn credit_unfolded(
        &mut self,
        payment_id: &str,
        account_id: &str,
        amount: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            sql::INSERT_UNFOLDED_CREDIT,
            &[
                Arg::Text(payment_id),
                Arg::Text(account_id),
                Arg::Int(amount),
            ],
        )
        .await
        .map(|_| ())
    }

    /// Folds the account's waiting credits into its balance, under the balance row's lock,
    /// and returns the balance: everything committed so far, exactly.
    pub async fn fold_credits(&mut self, account_id: &str) -> Result<i64, StoreError> {
        if let Tx::Postgres(_) = self {
            return self
                .fetch_one(postgres::FOLD_CREDITS, &[Arg::Text(account_id)], |row| {
                    row.int("balance")
                })
                .await;
        }
        let balance = self
            .fetch_one(sqlite::FOLD_CREDITS, &[Arg::Text(account_id)], |row| {
                row.int("balance")
            })
            .await?;
        self.execute(sqlite::DELETE_FOLDED, &[Arg::Text(account_id)])
            .await?;
        Ok(balance)
    }

    /// The account's balance, its waiting credits included.
    pub async fn balance(&mut self, account_id: &str) -> Result<i64, StoreError> {
        self.fetch_one(sql::ACCOUNT, &[Arg::Text(account_id)], |row| {
            row.int("balance")
        })
        .await
    }

    pub async fn insert_ledger(&mut self, entry: &LedgerEntry<'_>) -> Result<(), StoreError> {
        self.execute(
            sql::INSERT_LEDGER,
            &[
                Arg::Text(entry.account_id),
                Arg::Int(entry.amount),
                Arg::Text(entry.kind.as_str()),
                Arg::OptText(entry.claim.map(|c| c.key.as_str())),
                Arg::OptText(entry.claim.map(|c| c.claim_id.as_str())),
                Arg::OptText(entry.payment_id),
                Arg::OptText(entry.refund_id),
                Arg::Int(entry.created_at),
            ],
        )
        .await
        .map(|_| ())
    }

    /// `false` when the session was paid meanwhile (the unique index decided).
    pub async fn insert_payment(
        &mut self,
        claim: &Claim,
        payment: &NewPayment<'_>,
    ) -> Result<bool, StoreError> {
        let inserted = self
            .execute(
                sql::INSERT_PAYMENT,
                &[
                    Arg::Text(payment.payment_id),
                    Arg::Text(payment.checkout_session_id),
                    Arg::Text(payment.shopper_account_id),
                    Arg::Text(payment.shop_account_id),
                    Arg::Text(payment.order_id),
                    Arg::Int(payment.amount),
                    Arg::Text(payment.currency),
                    Arg::Int(payment.balance_after),
                    Arg::Text(&claim.key),
                    Arg::Int(claim.now_ms),
                ],
            )
            .await?;
        Ok(inserted == 1)
    }

    pub async fn payment_of_shop(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        self.fetch_optional(
            sql::PAYMENT_OF_SHOP,
            &[Arg::Text(payment_id), Arg::Text(shop_account_id)],
            PaymentRow::read,
        )
        .await
    }

    /// The payment's new refunded total, its shopper, order and currency, or `None` when
    /// `amount` exceeds what remains (or the payment is not this shop's).
    pub async fn add_refunded(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<Option<Refunded>, StoreError> {
        self.fetch_optional(
            sql::ADD_REFUNDED,
            &[
                Arg::Text(payment_id),
                Arg::Text(shop_account_id),
                Arg::Int(amount),
            ],
            |row| {
                Ok(Refunded {
                    refunded_total: row.int("refunded")?,
                    shopper_account_id: row.text("shopper_account_id")?,
                    order_id: row.text("order_id")?,
                    currency: row.text("currency")?,
                })
            },
        )
        .await
    }

    pub async fn undo_refunded(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            sql::UNDO_REFUNDED,
            &[
                Arg::Text(payment_id),
                Arg::Text(shop_account_id),
                Arg::Int(amount),
            ],
        )
        .await
        .map(|_| ())
    }

    /// Marks up to `batch` sessions that lapsed unpaid before `now_ms` as expired.
    pub async fn expire_sessions(
        &mut self,
        now_ms: i64,
        batch: i64,
    ) -> Result<Vec<ExpiredSession>, StoreError> {
        let statement = self.template(&sql::EXPIRE_SESSIONS);
        self.fetch_all(statement, &[Arg::Int(now_ms), Arg::Int(batch)], |row| {
            Ok(ExpiredSession {
                session_id: row.text("session_id")?,
                shop_account_id: row.text("shop_account_id")?,
                order_id: row.text("order_id")?,
                amount: row.int("amount")?,
                currency: row.text("currency")?,
                expires_at: row.int("expires_at")?,
            })
        })
        .await
    }

    /// Writes an event into the outbox, in this transaction: it commits with the change.
    pub async fn insert_event(&mut self, event: &NewEvent<'_>) -> Result<(), StoreError> {
        let statement = self.spelled(sqlite::INSERT_EVENT, postgres::INSERT_EVENT);
        self.execute(
            statement,
            &[
                Arg::Text(event.event_id),
                Arg::Text(event.shop_account_id),
                Arg::Text(event.event_type),
                Arg::Text(event.subject_id),
                Arg::Text(event.body),
                Arg::Int(event.created_at),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn insert_refund(
        &mut self,
        claim: &Claim,
        refund: &NewRefund<'_>,
    ) -> Result<(), StoreError> {
        self.execute(
            sql::INSERT_REFUND,
            &[
                Arg::Text(refund.refund_id),
                Arg::Text(refund.payment_id),
                Arg::Int(refund.amount),
                Arg::Int(refund.refunded_total_after),
                Arg::Int(refund.balance_after),
                Arg::Text(&claim.key),
                Arg::Int(claim.now_ms),
            ],
        )
        .await
        .map(|_| ())
    }
}
