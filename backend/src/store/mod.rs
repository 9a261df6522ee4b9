//! Where the money and the keys are kept: one API over SQLite or PostgreSQL, chosen by
//! `DATABASE_URL`. The store is its own floor: it knows rows and statements, never HTTP,
//! metrics or the operations above it.
//!
//! By concept, each file holding its rows and its statements for both databases (arguments bound
//! to `$n`, rows read by column name, see `row.rs`; a [`Template`] where a word differs):
//! [`keys`], [`accounts`] (and shops), [`sessions`], [`payments`] (and refunds, with the
//! ledger), [`events`] (the outbox). `sqlite.rs` and `postgres/` hold only what the drivers do
//! differently: SQLite's one writer thread with group commit and its readers, PostgreSQL's pool.

pub mod accounts;
pub mod deposits;
pub mod email_codes;
pub mod endpoints;
pub mod events;
pub mod invariants;
pub mod keys;
pub mod passkeys;
pub mod payments;
mod postgres;
pub mod reports;
mod row;
pub mod sessions;
mod sqlite;
pub mod staff;

pub use postgres::CONNECTION_LIFETIME;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use checkout_idempotency::{Classify, Failure, Finish, Work};

pub use accounts::{AccountKind, AccountRow, ShopRow, ShopperLogin, TokenHolder};
pub use deposits::NewDeposit;
pub use events::{
    AttemptSeen, EndedAttempt, EventRow, EventSettled, LeaseRequest, NewEvent, OutboxBacklog, Turn,
    UnpublishedEvent,
};
pub use payments::{
    EntryKind, LedgerEntry, NewPayment, NewRefund, Payer, PaymentAtOnce, PaymentChange,
    PaymentOutlook, PaymentRow, RefundRow, Refunded,
};
pub use postgres::{PgStore, PgTx, Pooling, compose_with_deferred};
use row::{Arg, ReadRow};
pub use row::{Template, replace_placeholders};
pub use sessions::{ExpiredSession, NewSession, SessionRow, TakenSession};
pub use sqlite::{SqliteStore, SqliteTx, WriterStats};

/// The server's migrations, in order, as SQL text (for a benchmark that builds the same schema
/// outside the server: it can never fall behind a new migration).
pub fn sqlite_migrations() -> impl Iterator<Item = &'static str> {
    sqlite::MIGRATOR.iter().map(|migration| &*migration.sql)
}

/// The same, as PostgreSQL's.
pub fn postgres_migrations() -> impl Iterator<Item = &'static str> {
    postgres::MIGRATOR.iter().map(|migration| &*migration.sql)
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
    Store(#[from] StoreError),
    #[error("{0}")]
    Config(String),
}

/// A test's seam in the SQLite writer, called after each `COMMIT` that succeeded, before any
/// unit of the batch is answered: `Err` stands for a `COMMIT` that reported an I/O error (its
/// data may be on disk all the same), a panic for a writer thread that dies right there.
#[derive(Clone, Default)]
pub struct AfterSqliteCommit(pub Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>);

impl std::fmt::Debug for AfterSqliteCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "AfterSqliteCommit(set)"
        } else {
            "AfterSqliteCommit(none)"
        })
    }
}

/// How the store is opened.
#[derive(Clone, Debug)]
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
    /// PostgreSQL: straight, or through a pooler in transaction mode.
    pub pooling: Pooling,
    /// PostgreSQL: how long a pooled connection is lent again before it is closed and
    /// replaced ([`CONNECTION_LIFETIME`] but in a test).
    pub connection_lifetime: Duration,
    /// A test's seam (see [`AfterSqliteCommit`]); none in the shipped server.
    pub after_sqlite_commit: AfterSqliteCommit,
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
    Postgres(PgTx),
}

/// A future borrowing the transaction it runs in, for [`Store::write`].
pub type TxFuture<'t, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 't>>;

pub const PING: &str = "SELECT CAST(1 AS BIGINT) AS one";

impl Store {
    /// PostgreSQL: one transaction on one pooled connection (`BEGIN` with the claim's lock
    /// timeout, the work, `COMMIT` or `ROLLBACK`). SQLite: a savepoint in the writer's current
    /// batch, answered after the batch's commit.
    pub async fn run<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<Tx>,
    {
        match self {
            Store::Sqlite(store) => store.transaction(work).await,
            Store::Postgres(store) => {
                let mut tx = Tx::Postgres(store.transaction().await?);
                let finish = work.run(&mut tx).await;
                let Tx::Postgres(tx) = tx else {
                    unreachable!("a PostgreSQL store lends only PostgreSQL transactions");
                };
                match finish {
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
    }

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
                postgres::connect(
                    database_url,
                    settings.pool_size,
                    settings.lock_timeout,
                    settings.pooling,
                    settings.connection_lifetime,
                )
                .await?,
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
        self.run(Write(f)).await
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
            Store::Postgres(store) => store.read(sql, args, read).await,
        }
    }

    /// Runs the migrations of the database at `url` (over a direct connection, never through a
    /// pooler in transaction mode); the schema's version after them.
    pub async fn migrate(database_url: &str) -> Result<i64, ConnectError> {
        if database_url.starts_with("sqlite:") {
            sqlite::migrate_file(database_url).await
        } else {
            postgres::migrate(database_url).await
        }
    }

    /// Connections busy and requests waiting for one, now.
    pub fn pool_usage(&self) -> PoolUsage {
        match self {
            Store::Sqlite(store) => store.usage(),
            Store::Postgres(store) => store.usage(),
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.read(PING, &[], |row| row.int("one")).await?;
        Ok(())
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
            Tx::Postgres(tx) => tx.fetch_all(sql, args, read).await,
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
            Tx::Postgres(tx) => tx.execute(sql, args).await,
        }
    }
}
