//! PostgreSQL's connections, pooled. sqlx's own pool pings every connection given back to it, a
//! round trip per unit of work that nothing asked for: a keyed payment, one read and one
//! statement, cost the server four round trips, and the database as many wake-ups. Here a
//! connection given back costs nothing unless something about it is unfinished:
//!
//! - a transaction left open (its caller went away, or failed on its way out) is rolled back at
//!   once, by a task of its own, before anyone may borrow the connection: its locks must not
//!   wait for the next borrower;
//! - a connection whose statement failed without the database's answer (the link broke, the
//!   server went away) is closed, never lent again.
//!
//! Before it is lent again a connection has its answers still on their way read (a statement
//! whose caller went away; no round trip when there are none), and one idle for a second is
//! pinged, as before. One past its lifetime, or idle for ten minutes, is closed instead (and
//! the idle ones are looked for every minute), as sqlx's pool did.

use std::borrow::Cow;
use std::time::Duration;

use deadpool::Runtime;
use deadpool::managed::{
    self, Metrics, Object, PoolError, QueueMode, RecycleError, RecycleResult, TimeoutType, WeakPool,
};
use sqlx::postgres::{PgConnectOptions, PgTransactionManager};
use sqlx::{Connection as _, Executor as _, PgConnection, TransactionManager as _};

use super::classify;
use crate::store::{ConnectError, StoreError};

/// A pooled connection idle this long is pinged before it is lent.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// How long a pooled connection is lent again before it is closed and replaced: after a
/// failover, or a pooler's restart, the connections spread again (sqlx's pool did the same).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// A pooled connection idle this long is closed: a quiet server holds none of the database's
/// backends for nothing (sqlx's pool did the same).
const IDLE_LIMIT: Duration = Duration::from_secs(10 * 60);

/// How often the pool closes the idle connections past their lifetime or [`IDLE_LIMIT`] (one
/// about to be lent is looked at then).
const CLOSE_RETIRED_EVERY: Duration = Duration::from_secs(60);

/// How long a unit of work waits for a connection (then `Busy`), and a new connection for
/// PostgreSQL's answer.
const WAIT: Duration = Duration::from_secs(5);

pub type Pool = managed::Pool<Connections>;

/// How the pool opens and readies its connections.
pub struct Connections {
    options: PgConnectOptions,
    /// Sent once on each new connection (the session's lock timeout), if any.
    on_connect: Option<String>,
    /// See [`CONNECTION_LIFETIME`].
    lifetime: Duration,
}

pub fn pool(
    url: &str,
    size: u32,
    on_connect: Option<String>,
    lifetime: Duration,
) -> Result<Pool, ConnectError> {
    let options: PgConnectOptions = url.parse()?;
    let pool = managed::Pool::builder(Connections {
        options,
        on_connect,
        lifetime,
    })
    .max_size(size as usize)
    .wait_timeout(Some(WAIT))
    .create_timeout(Some(WAIT))
    .recycle_timeout(Some(WAIT))
    // The connection given back last is lent first: the busy ones stay warm, and only those
    // idle long enough to need a ping are left to the quiet times.
    .queue_mode(QueueMode::Lifo)
    .runtime(Runtime::Tokio1)
    .build()
    .map_err(|error| ConnectError::Config(error.to_string()))?;
    tokio::spawn(close_retired(pool.weak()));
    Ok(pool)
}

/// Closes the pool's idle connections that are retired, every [`CLOSE_RETIRED_EVERY`], until
/// the pool is gone.
async fn close_retired(pool: WeakPool<Connections>) {
    let mut every = tokio::time::interval(CLOSE_RETIRED_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let connections = pool.manager();
        pool.retain(|_, metrics| !connections.retired(&metrics));
    }
}

impl Connections {
    /// Past its lifetime, or idle too long: closed rather than lent again.
    fn retired(&self, metrics: &Metrics) -> bool {
        metrics.age() >= self.lifetime || metrics.last_used() >= IDLE_LIMIT
    }
}

impl managed::Manager for Connections {
    type Type = PgConnection;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<PgConnection, sqlx::Error> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        if let Some(statement) = &self.on_connect {
            conn.execute(statement.as_str()).await?;
        }
        Ok(conn)
    }

    async fn recycle(
        &self,
        conn: &mut PgConnection,
        metrics: &Metrics,
    ) -> RecycleResult<sqlx::Error> {
        if self.retired(metrics) {
            return Err(RecycleError::message("retired"));
        }
        // Reads what a statement dropped half-way left on the wire (an error in it fails the
        // recycling, and the connection is closed); nothing to send or read, no round trip.
        conn.flush().await?;
        if PgTransactionManager::get_transaction_depth(conn) > 0 {
            return Err(RecycleError::message("given back inside a transaction"));
        }
        if metrics.last_used() >= IDLE_BEFORE_PING {
            conn.ping().await?;
        }
        Ok(())
    }
}

/// A connection lent by the pool, given back when dropped (see the module's comment for what
/// that does).
pub struct Lent {
    object: Option<Object<Connections>>,
    /// A statement failed without the database's answer: the connection is closed, not given
    /// back.
    broken: bool,
}

impl Lent {
    /// A connection of `pool`, waiting for one at most [`WAIT`] (then `Busy`).
    pub async fn of(pool: &Pool) -> Result<Lent, StoreError> {
        let object = pool.get().await.map_err(|error| match error {
            PoolError::Backend(error) => classify(error),
            PoolError::Timeout(TimeoutType::Wait) => StoreError::Busy(error.into()),
            PoolError::Timeout(_) | PoolError::Closed => StoreError::Unavailable(error.into()),
            error => StoreError::Other(error.into()),
        })?;
        Ok(Lent {
            object: Some(object),
            broken: false,
        })
    }

    pub fn conn(&mut self) -> &mut PgConnection {
        self.object
            .as_deref_mut()
            .expect("a lent connection is held until dropped")
    }

    /// `result`, a statement's on this connection, noting whether its error leaves the
    /// connection unusable: anything but the database's own answer, or an answer that the
    /// session is over (class 08, 57P).
    pub fn note<T>(&mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(error) = &result {
            let answered = match error {
                sqlx::Error::Database(db) => !db
                    .code()
                    .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
                // Rows read whole, then found not to fit: the connection is as it was.
                sqlx::Error::ColumnDecode { .. }
                | sqlx::Error::ColumnNotFound(_)
                | sqlx::Error::Decode(_) => true,
                _ => false,
            };
            self.broken |= !answered;
        }
        result
    }

    /// `BEGIN`, or `statement` in its place.
    pub async fn begin(&mut self, statement: Option<String>) -> Result<(), sqlx::Error> {
        let begun = PgTransactionManager::begin(self.conn(), statement.map(Cow::Owned)).await;
        self.note(begun)
    }

    pub async fn commit(&mut self) -> Result<(), sqlx::Error> {
        let committed = PgTransactionManager::commit(self.conn()).await;
        self.note(committed)
    }

    pub async fn rollback(&mut self) -> Result<(), sqlx::Error> {
        let rolled_back = PgTransactionManager::rollback(self.conn()).await;
        self.note(rolled_back)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(mut object) = self.object.take() else {
            return;
        };
        if self.broken {
            drop(Object::take(object));
            return;
        }
        if PgTransactionManager::get_transaction_depth(&object) == 0 {
            return; // back to the pool, as it was lent
        }
        // Queued, then sent and answered by a task of its own: the caller may be gone.
        PgTransactionManager::start_rollback(&mut object);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if object.flush().await.is_err() {
                        drop(Object::take(object));
                    }
                });
            }
            Err(_) => drop(Object::take(object)),
        }
    }
}
