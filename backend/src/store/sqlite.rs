//! SQLite, the embedded default: one file, WAL, and a single writer connection.
//!
//! SQLite lets one writer in at a time whatever we do; holding that as one pooled connection
//! makes writers queue fairly in the pool (bounded by its acquire timeout) instead of spinning
//! in SQLite's busy handler. Readers use their own connections and never wait for the writer.
//! A duplicate of an in-flight request therefore waits its turn and then replays.

use std::{str::FromStr, sync::LazyLock, time::Duration};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::{StoreError, sql};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// How long a write waits for the single writer connection before the server answers `503`.
const WRITER_WAIT: Duration = Duration::from_secs(10);
const READERS: u32 = 4;

pub static CLAIM_KEY: LazyLock<String> =
    LazyLock::new(|| format!("{} RETURNING claim_id", sql::CLAIM_KEY));

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pub writer: SqlitePool,
    pub reader: SqlitePool,
}

pub async fn connect(url: &str) -> Result<SqliteStore, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a COMMIT the server acknowledged survives even a power cut, not only a crash.
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(WRITER_WAIT);
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(WRITER_WAIT)
        .connect_with(options.clone())
        .await?;
    MIGRATOR.run(&writer).await?;
    let reader = SqlitePoolOptions::new()
        .max_connections(READERS)
        .acquire_timeout(WRITER_WAIT)
        .connect_with(options.read_only(true))
        .await?;
    Ok(SqliteStore { writer, reader })
}

impl SqliteStore {
    /// `IMMEDIATE` takes the write lock up front, so a transaction that reads before it writes
    /// can never fail to upgrade its lock halfway.
    pub async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.writer.begin_with("BEGIN IMMEDIATE").await
    }
}

pub fn classify(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Database(db) => {
            // Extended result codes keep the primary code in the low byte.
            let primary = db
                .code()
                .and_then(|c| c.parse::<i32>().ok())
                .map(|c| c & 0xff);
            match primary {
                Some(5 | 6) => StoreError::Busy(error), // SQLITE_BUSY, SQLITE_LOCKED
                _ => StoreError::Other(error),
            }
        }
        sqlx::Error::PoolTimedOut => StoreError::Busy(error),
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            StoreError::Unavailable(error)
        }
        _ => StoreError::Other(error),
    }
}
