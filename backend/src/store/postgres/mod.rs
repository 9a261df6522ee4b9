//! PostgreSQL, the production store that several server instances share.
//!
//! A duplicate's claim blocks on the original's uncommitted key row (the primary key's
//! speculative insertion waits for it). `lock_timeout`, set once per connection, bounds that
//! wait: past it the duplicate gets `409` + `Retry-After`; if the original commits first, the
//! duplicate replays its answer.
//!
//! Every statement costs the database about the same here, so a keyed request sends only what
//! it needs: `BEGIN`, the claim (which also tells a replay), the change, the answer, `COMMIT`;
//! and a payment, where it can, one read and one statement outside any transaction
//! ([`PgStore::write_at_once`]).

mod pool;

pub use pool::CONNECTION_LIFETIME;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgExecutor, Postgres, Row as _};

use super::row::{Arg, OwnedArg, ReadRow, Row, RowError, replace_placeholders};
use super::{ConnectError, PoolUsage, StoreError};
use pool::{Lent, Pool};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// Transactions waiting for a connection of the pool now.
    waiting: Arc<AtomicU64>,
    /// `BEGIN` as sent behind a transaction pooler (with the claim's lock timeout, which no
    /// session keeps there); `None`: a plain `BEGIN`, the timeout set once per connection.
    begin_pooled: Option<String>,
}

/// Behind a pooler in transaction mode (PgBouncer's `pool_mode = transaction`) each transaction
/// may run on another server connection, so nothing may outlive one: no named prepared
/// statement (sqlx prepares `sqlx_s_1`, `sqlx_s_2`… per client connection, and two clients'
/// names meet on one server connection: "prepared statement \"sqlx_s_1\" already exists"), no
/// session `SET`, no session advisory lock (the migrator's). The store then sends unnamed
/// statements, each inside a transaction, sets the lock timeout in every `BEGIN`, and leaves
/// migrations to `checkout-server migrate` over a direct connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The server's own pool, straight to PostgreSQL (or a pooler in session mode).
    #[default]
    Direct,
    /// Through a pooler in transaction mode.
    Transaction,
}

pub async fn connect(
    url: &str,
    pool_size: u32,
    lock_timeout: Duration,
    pooling: Pooling,
    connection_lifetime: Duration,
) -> Result<PgStore, ConnectError> {
    // The claim's wait bound is the session's; a claimed transaction lifts it for itself
    // (CLAIM_KEY), and COMMIT or ROLLBACK brings it back. No statement per transaction for it,
    // but behind a transaction pooler, where it travels with each BEGIN.
    let timeout_ms = lock_timeout.as_millis().max(1);
    let set_lock_timeout = match pooling {
        Pooling::Direct => Some(format!("SET lock_timeout = '{timeout_ms}ms'")),
        Pooling::Transaction => None,
    };
    // A connection in steady use is known alive, so only one idle for a while is pinged; one
    // that broke meanwhile fails its first statement (`503`, nothing done) and is closed.
    let pool = pool::pool(url, pool_size, set_lock_timeout, connection_lifetime)?;
    let mut lent = Lent::of(&pool).await?;
    let begin_pooled = match pooling {
        Pooling::Direct => {
            MIGRATOR.run(lent.conn()).await?;
            None
        }
        Pooling::Transaction => {
            schema_is_current(lent.conn()).await?;
            Some(format!("BEGIN; SET LOCAL lock_timeout = '{timeout_ms}ms'"))
        }
    };
    drop(lent);
    Ok(PgStore {
        pool,
        waiting: Arc::default(),
        begin_pooled,
    })
}

/// Runs the migrations over a direct connection (`checkout-server migrate`); the schema's
/// version after them.
pub async fn migrate(url: &str) -> Result<i64, ConnectError> {
    let mut conn: sqlx::PgConnection = sqlx::Connection::connect(url).await?;
    MIGRATOR.run(&mut conn).await?;
    let _ = sqlx::Connection::close(conn).await;
    Ok(latest_migration())
}

fn latest_migration() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Behind a transaction pooler the server does not migrate (the migrator holds a session's
/// advisory lock): it starts only on a schema `checkout-server migrate` brought up to date.
async fn schema_is_current(conn: &mut sqlx::PgConnection) -> Result<(), ConnectError> {
    // A simple query (no arguments, no prepared statement): safe outside a transaction.
    let read = sqlx::Executor::fetch_one(
        conn,
        "SELECT MAX(version) FROM _sqlx_migrations WHERE success",
    )
    .await;
    let applied: Option<i64> = match read {
        Ok(row) => row.try_get(0)?,
        // No bookkeeping table yet: never migrated.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => None,
        Err(error) => return Err(error.into()),
    };
    let needed = latest_migration();
    match applied {
        Some(version) if version >= needed => Ok(()),
        found => Err(ConnectError::Config(format!(
            "the database's schema is at version {}, this server needs {needed}: behind a \
             transaction pooler the server does not migrate; run `checkout-server migrate` with \
             DATABASE_URL naming PostgreSQL itself",
            found.map_or_else(|| "none".to_owned(), |v| v.to_string())
        ))),
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("pool", &self.pool.status())
            .field("begin_pooled", &self.begin_pooled)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A transaction on a pooled connection. Its caller may be dropped at any await (a client
    /// that goes away drops its request's future): the `BEGIN` is then finished by a task of
    /// its own, which drops the transaction it got, and that rolls it back. sqlx 0.8's `begin`
    /// dropped while its `BEGIN` is on the wire leaves the connection inside that transaction
    /// (sqlx issue #4393): the next borrower's autocommit statements ran in it, uncommitted,
    /// and after its first error every statement on the connection failed.
    pub(super) async fn transaction(&self) -> Result<PgTx, StoreError> {
        let _waiting = Waiting::count(&self.waiting);
        let (pool, begin) = (self.pool.clone(), self.begin_pooled.clone());
        let lent = tokio::spawn(async move {
            let mut lent = Lent::of(&pool).await?;
            lent.begin(begin).await.map_err(classify)?;
            Ok::<_, StoreError>(lent)
        })
        .await
        .map_err(|panicked| StoreError::Other(panicked.into()))??;
        Ok(PgTx {
            lent,
            deferred: Vec::new(),
            prepared: self.prepared(),
        })
    }

    /// Connections lent and units of work waiting for one, now.
    pub(super) fn usage(&self) -> PoolUsage {
        let status = self.pool.status();
        PoolUsage {
            in_use: status.size.saturating_sub(status.available) as u64,
            waiting: self.waiting.load(Ordering::Relaxed),
        }
    }

    /// Whether statements are named and kept prepared per connection (not behind a
    /// transaction pooler).
    pub fn prepared(&self) -> bool {
        self.begin_pooled.is_none()
    }

    /// A read outside any unit of work: on any pooled connection; behind a transaction pooler,
    /// in a transaction of its own (an unnamed statement is parsed and run in two exchanges,
    /// which the pooler may give to two server connections unless a transaction holds one).
    pub(super) async fn read<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Vec<T>, StoreError> {
        if self.prepared() {
            let rows = fetch_lent(&mut Lent::of(&self.pool).await?, sql, args, true).await;
            return read_rows(&rows.map_err(classify)?, read);
        }
        let mut tx = self.transaction().await?;
        let rows = tx.fetch_all(sql, args, read).await?;
        tx.lent.commit().await.map_err(classify)?;
        Ok(rows)
    }
}

/// One transaction waiting for a connection, counted for as long as this lives (a dropped
/// caller stops waiting too).
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicU64) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How an autocommit statement ([`PgStore::write_at_once`]) came out.
pub enum AtOnceWrite<T> {
    /// Committed: its rows.
    Committed(Vec<T>),
    /// The database refused it (a constraint, a lock not had within the bound, a lost race, a
    /// standby): nothing of it was written.
    Refused,
}

impl PgStore {
    /// One statement outside any transaction, i.e. its own: all of it commits, or nothing. One
    /// round trip once the connection has it prepared. Only where statements are named and kept
    /// ([`PgStore::prepared`]): an unnamed one is parsed and run in two exchanges, which a
    /// transaction pooler may give to two server connections. A failure that is not the
    /// database's refusal leaves the outcome unknown ([`StoreError::InDoubt`]).
    pub(super) async fn write_at_once<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<AtOnceWrite<T>, StoreError> {
        let written = fetch_lent(&mut Lent::of(&self.pool).await?, sql, args, true).await;
        let rows = match written {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(db)) if refused(db.code().as_deref()) => {
                return Ok(AtOnceWrite::Refused);
            }
            Err(error) => return Err(StoreError::InDoubt(error.into())),
        };
        Ok(AtOnceWrite::Committed(read_rows(&rows, read)?))
    }
}

/// Whether an error a statement got means its implicit transaction rolled back: any error the
/// database answers, but a connection's end (class 08), an operator's intervention (57, e.g. a
/// shutdown that may come after the commit) or an internal error, which leave it unknown.
fn refused(code: Option<&str>) -> bool {
    code.is_some_and(|code| {
        !(code.starts_with("08") || code.starts_with("57") || code.starts_with("XX"))
    })
}

/// A PostgreSQL transaction, with the writes it sends later than asked. A write whose only
/// outcome is a row written or an error (an event into the outbox) need not cost a round trip
/// of its own: it travels in the next statement that must be sent anyway, as a data-modifying
/// `WITH` (the key's stored answer, see [`PgTx::execute_with_deferred`]), or alone just before
/// `COMMIT`. Either way it is in the transaction, and its failure rolls all of it back.
///
/// Dropped before its `COMMIT` or `ROLLBACK`, it is rolled back (see [`pool`]).
pub struct PgTx {
    /// Inside the transaction, its `BEGIN` answered.
    lent: Lent,
    deferred: Vec<(&'static str, Vec<OwnedArg>)>,
    /// Named, cached statements (see [`Pooling`]).
    prepared: bool,
}

impl PgTx {
    pub(super) async fn fetch_all<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Vec<T>, StoreError> {
        let rows = fetch_lent(&mut self.lent, sql, args, self.prepared).await;
        read_rows(&rows.map_err(classify)?, read)
    }

    pub(super) async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let done = execute_raw(self.lent.conn(), sql, args, self.prepared).await;
        self.lent.note(done).map_err(classify)
    }

    /// Sends `sql` later, in this transaction (see above): only for a statement that writes
    /// and whose result nobody reads.
    pub(super) fn defer(&mut self, sql: &'static str, args: &[Arg<'_>]) {
        self.deferred
            .push((sql, args.iter().copied().map(OwnedArg::from).collect()));
    }

    /// Runs `sql` (an `UPDATE`, `INSERT` or `DELETE` without a `WITH` of its own) with the
    /// deferred writes before it in one statement; returns the rows `sql` itself touched. The
    /// writes do not see each other's rows (one snapshot): only writes that need not are
    /// deferred.
    pub(super) async fn execute_with_deferred(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<u64, StoreError> {
        if self.deferred.is_empty() {
            return self.execute(sql, args).await;
        }
        let deferred = std::mem::take(&mut self.deferred);
        let composed = compose_with_deferred(
            sql,
            args.len(),
            &deferred
                .iter()
                .map(|(statement, args)| (*statement, args.len()))
                .collect::<Vec<_>>(),
        );
        let mut all_args: Vec<Arg<'_>> = args.to_vec();
        for (_, statement_args) in &deferred {
            all_args.extend(statement_args.iter().map(OwnedArg::borrow));
        }
        self.execute(&composed, &all_args).await
    }

    pub(super) async fn commit(mut self) -> Result<(), StoreError> {
        for (statement, args) in std::mem::take(&mut self.deferred) {
            let args: Vec<Arg<'_>> = args.iter().map(OwnedArg::borrow).collect();
            self.execute(statement, &args).await?;
        }
        self.lent.commit().await.map_err(classify_commit)
    }

    /// Its connection, for statements sent by the store's own reports (`verify`).
    pub(super) fn conn(&mut self) -> &mut sqlx::PgConnection {
        self.lent.conn()
    }

    pub(super) async fn rollback(mut self) {
        let _ = self.lent.rollback().await;
    }
}

/// `sql` (with `sql_params` placeholders) preceded by the deferred statements (each with its
/// count of placeholders) as data-modifying `WITH`s, their placeholders numbered after the
/// ones before: the text [`PgTx::execute_with_deferred`] sends, its arguments in that order.
pub fn compose_with_deferred(sql: &str, sql_params: usize, deferred: &[(&str, usize)]) -> String {
    let mut composed = String::from("WITH ");
    let mut offset = sql_params;
    for (i, (statement, params)) in deferred.iter().enumerate() {
        if i > 0 {
            composed.push_str(", ");
        }
        composed.push_str(&format!("deferred_{i} AS ("));
        composed.push_str(&replace_placeholders(statement, |n| {
            format!("${}", n + offset)
        }));
        composed.push(')');
        offset += params;
    }
    composed.push(' ');
    composed.push_str(sql);
    composed
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

/// `prepared`: as a named statement kept for the connection's next use; or unnamed (see
/// [`Pooling`]).
pub(super) async fn fetch_all<'c, T>(
    conn: impl PgExecutor<'c>,
    sql: &str,
    args: &[Arg<'_>],
    read: ReadRow<T>,
    prepared: bool,
) -> Result<Vec<T>, StoreError> {
    let rows = fetch_rows(conn, sql, args, prepared)
        .await
        .map_err(classify)?;
    read_rows(&rows, read)
}

/// The rows of `sql`, the driver's error as it came (for a caller that must tell its kinds).
async fn fetch_rows<'c>(
    conn: impl PgExecutor<'c>,
    sql: &str,
    args: &[Arg<'_>],
    prepared: bool,
) -> Result<Vec<PgRow>, sqlx::Error> {
    bind(sqlx::query(sql).persistent(prepared), args)
        .fetch_all(conn)
        .await
}

/// [`fetch_rows`] on a lent connection, which learns whether its error leaves it unusable.
async fn fetch_lent(
    lent: &mut Lent,
    sql: &str,
    args: &[Arg<'_>],
    prepared: bool,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let rows = fetch_rows(lent.conn(), sql, args, prepared).await;
    lent.note(rows)
}

fn read_rows<T>(rows: &[PgRow], read: ReadRow<T>) -> Result<Vec<T>, StoreError> {
    rows.iter()
        .map(|row| read(row).map_err(StoreError::Other))
        .collect()
}

pub(super) async fn execute<'c>(
    conn: impl PgExecutor<'c>,
    sql: &str,
    args: &[Arg<'_>],
    prepared: bool,
) -> Result<u64, StoreError> {
    execute_raw(conn, sql, args, prepared)
        .await
        .map_err(classify)
}

async fn execute_raw<'c>(
    conn: impl PgExecutor<'c>,
    sql: &str,
    args: &[Arg<'_>],
    prepared: bool,
) -> Result<u64, sqlx::Error> {
    bind(sqlx::query(sql).persistent(prepared), args)
        .execute(conn)
        .await
        .map(|done| done.rows_affected())
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
            // connection lost, server shutting down; or a read-only server (the connection
            // reached a standby: a failover in progress, or a proxy that has not checked yet)
            Some(code) if code.starts_with("08") || code.starts_with("57P") || code == "25006" => {
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
