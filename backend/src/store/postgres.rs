//! PostgreSQL, the production store that several server instances share.
//!
//! A duplicate's claim blocks on the original's uncommitted key row (the primary key's
//! speculative insertion waits for it). `lock_timeout`, set once per connection, bounds that
//! wait: past it the duplicate gets `409` + `Retry-After`; if the original commits first, the
//! duplicate replays its answer.
//!
//! Every statement costs the database about the same here, so a keyed request sends only what
//! it needs: `BEGIN`, the claim (which also tells a replay), the change, the answer, `COMMIT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgPoolOptions, PgRow};
use sqlx::query::Query;
use sqlx::{PgExecutor, PgPool, Postgres, Row as _, Transaction};

use super::row::{Arg, ReadRow, Row, RowError};
use super::{ConnectError, StoreError};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

#[derive(Clone, Debug)]
pub struct PgStore {
    pub pool: PgPool,
    /// Transactions waiting for a connection of the pool now.
    pub waiting: Arc<AtomicU64>,
}

pub async fn connect(
    url: &str,
    pool_size: u32,
    lock_timeout: Duration,
) -> Result<PgStore, ConnectError> {
    // The claim's wait bound is the session's; a claimed transaction lifts it for itself
    // (CLAIM_KEY), and COMMIT or ROLLBACK brings it back. No statement per transaction for it.
    let set_lock_timeout = format!("SET lock_timeout = '{}ms'", lock_timeout.as_millis().max(1));
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(move |conn, _| {
            let statement = set_lock_timeout.clone();
            Box::pin(async move {
                sqlx::Executor::execute(conn, statement.as_str()).await?;
                Ok(())
            })
        })
        .connect(url)
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(PgStore {
        pool,
        waiting: Arc::default(),
    })
}

impl PgStore {
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let begun = self.pool.begin().await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        begun.map_err(classify)
    }
}

// -- statements --------------------------------------------------------------------------------

fn bind<'q>(
    mut query: Query<'q, Postgres, PgArguments>,
    args: &[Arg<'q>],
) -> Query<'q, Postgres, PgArguments> {
    for arg in args {
        query = match *arg {
            Arg::Int(n) => query.bind(n),
            Arg::Text(s) => query.bind(s),
            Arg::OptText(s) => query.bind(s),
        };
    }
    query
}

pub async fn fetch_all<'c, T>(
    conn: impl PgExecutor<'c>,
    sql: &str,
    args: &[Arg<'_>],
    read: ReadRow<T>,
) -> Result<Vec<T>, StoreError> {
    let rows = bind(sqlx::query(sql), args)
        .fetch_all(conn)
        .await
        .map_err(classify)?;
    rows.iter()
        .map(|row| read(row).map_err(StoreError::Other))
        .collect()
}

pub async fn execute<'c>(
    conn: impl PgExecutor<'c>,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<u64, StoreError> {
    bind(sqlx::query(sql), args)
        .execute(conn)
        .await
        .map(|done| done.rows_affected())
        .map_err(classify)
}

impl Row for PgRow {
    fn opt_int(&self, column: &str) -> Result<Option<i64>, RowError> {
        Ok(self.try_get(column)?)
    }

    fn opt_text(&self, column: &str) -> Result<Option<String>, RowError> {
        Ok(self.try_get(column)?)
    }
}

pub fn classify(error: sqlx::Error) -> StoreError {
    let kind = match &error {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("55P03") => StoreError::Busy, // lock_not_available: lock_timeout hit
            Some("40001" | "40P01") => StoreError::Retry, // serialization, deadlock
            // connection lost, server shutting down
            Some(code) if code.starts_with("08") || code.starts_with("57P") => {
                StoreError::Unavailable
            }
            _ => StoreError::Other,
        },
        sqlx::Error::PoolTimedOut => StoreError::Busy,
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => {
            StoreError::Unavailable
        }
        _ => StoreError::Other,
    };
    kind(error.into())
}

/// A failed `COMMIT`. Only a few answers say the transaction surely rolled back: a lost
/// serialization race or deadlock (class 40) and a constraint checked at commit (class 23).
/// Anything else (the connection broke, the server is shutting down or crashed, a synchronous
/// standby's wait was cancelled) leaves the outcome unknown: it may have committed.
pub fn classify_commit(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Database(db)
            if db
                .code()
                .is_some_and(|code| code.starts_with("40") || code.starts_with("23")) =>
        {
            classify(error)
        }
        _ => StoreError::InDoubt(error.into()),
    }
}
