//! SQLite, the embedded default: one file, held by one server process, in WAL mode.
//!
//! SQLite lets one writer in at a time, so there is exactly one: a thread that owns the write
//! connection and runs each write transaction's whole unit of work there, with no hop between
//! threads per statement. Work that queues up meanwhile joins the same transaction, each unit in
//! a savepoint of its own (its failure rolls back only itself), and one `COMMIT` makes the whole
//! batch durable (group commit). Only then is any unit of the batch answered, so no answer ever
//! leaves before the commit that holds it; a crash loses only unanswered work. A batch never
//! waits to fill: it is whatever is queued, up to a bound.
//!
//! Readers have connections of their own and never wait for the writer.

use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkout_idempotency::{Finish, Work};
use rusqlite::{Connection, OpenFlags, Statement};
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::row::{Arg, OwnedArg, ReadRow, Row, RowError};
use super::{ConnectError, StoreError, Tx};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// How long a write may wait in the writer's queue before it is refused (`503`) unrun.
const QUEUE_WAIT: Duration = Duration::from_secs(10);
/// Reader connections: opened as needed up to this many, then reused, never closed.
const READERS: usize = 8;
/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 64;

#[derive(Clone, Debug)]
pub struct SqliteStore {
    writer: Sender<Box<dyn Job>>,
    readers: Arc<Readers>,
    pub stats: Arc<WriterStats>,
    /// Held for the life of a server: no second server may open the file (an operator's
    /// command beside it holds nothing).
    _lock: Option<Arc<File>>,
}

/// What the writer is doing and has done.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Units waiting in the queue now.
    pub queued: AtomicU64,
    /// Batches committed (or failed to), and the units they held.
    pub batches: AtomicU64,
    pub units: AtomicU64,
    pub largest_batch: AtomicU64,
}

/// The writer's connection, lent to one unit of work at a time.
pub struct SqliteTx {
    conn: Connection,
}

pub async fn connect(
    url: &str,
    settings: &super::StoreSettings,
) -> Result<SqliteStore, ConnectError> {
    let (max_batch, exclusive) = (settings.sqlite_batch, settings.exclusive);
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a COMMIT the server acknowledged survives even a power cut, not only a crash.
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true);
    let file = options.get_filename().to_path_buf();
    if file.as_os_str().is_empty() || file == Path::new(":memory:") {
        return Err(ConnectError::Config(
            "SQLite needs a file (sqlite://checkout.db): an in-memory database cannot be shared by the writer and the readers".into(),
        ));
    }
    let lock = if exclusive {
        Some(hold_exclusively(&file)?)
    } else {
        None
    };
    // The schema; the connection is closed again right after.
    let mut migrating = options.connect().await?;
    migrate(&mut migrating).await?;
    sqlx::Connection::close(migrating).await?;

    let conn = open(&file, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    if let Some(kib) = settings.sqlite_max_size_kib {
        // Per connection, and only the writer's writes: the cap is the writer's.
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |row| row.get(0))?;
        let pages = (kib.saturating_mul(1024) / page_size.max(1) as u64).max(1);
        conn.pragma_update(None, "max_page_count", pages as i64)?;
    }
    let (writer, jobs) = mpsc::channel();
    let stats = Arc::new(WriterStats::default());
    let runtime = Handle::current();
    let thread_stats = stats.clone();
    let after_commit = settings.after_sqlite_commit.clone();
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            write_batches(
                conn,
                &jobs,
                &runtime,
                max_batch.max(1),
                &thread_stats,
                &after_commit,
            )
        })
        .map_err(|e| ConnectError::Config(format!("cannot start the SQLite writer: {e}")))?;
    Ok(SqliteStore {
        writer,
        readers: Arc::new(Readers {
            file,
            idle: Mutex::new(Vec::new()),
            turns: tokio::sync::Semaphore::new(READERS),
        }),
        stats,
        _lock: lock.map(Arc::new),
    })
}

/// `checkout-server migrate` on a SQLite file (created if missing): the schema's version after.
pub async fn migrate_file(url: &str) -> Result<i64, ConnectError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .foreign_keys(true);
    let mut conn = options.connect().await?;
    migrate(&mut conn).await?;
    sqlx::Connection::close(conn).await?;
    Ok(MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0))
}

/// sqlx's migrator, except that a migration marked `-- no-transaction` runs with foreign keys
/// off (SQLite allows turning them off only outside a transaction, and rebuilding a table needs
/// it: <https://www.sqlite.org/lang_altertable.html#otheralter>), still in one transaction with
/// its bookkeeping row, and checked with `foreign_key_check` before it commits. sqlx's SQLite
/// driver would run it inside its own transaction, where the pragma does nothing.
async fn migrate(conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::migrate::{Migrate, MigrateError};
    conn.ensure_migrations_table().await?;
    if let Some(version) = conn.dirty_version().await? {
        return Err(MigrateError::Dirty(version));
    }
    let applied = conn.list_applied_migrations().await?;
    for migration in MIGRATOR.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        if let Some(done) = applied.iter().find(|a| a.version == migration.version) {
            if done.checksum != migration.checksum {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            continue;
        }
        if !migration.no_tx {
            conn.apply(migration).await?;
            continue;
        }
        let failed = |e| MigrateError::ExecuteMigration(e, migration.version);
        sqlx::raw_sql("PRAGMA foreign_keys = OFF")
            .execute(&mut *conn)
            .await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::raw_sql(&migration.sql)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        let broken: Vec<sqlx::sqlite::SqliteRow> = sqlx::query("PRAGMA foreign_key_check")
            .fetch_all(&mut *tx)
            .await?;
        if !broken.is_empty() {
            return Err(MigrateError::ExecuteMigration(
                sqlx::Error::Protocol(format!("{} rows break a foreign key", broken.len())),
                migration.version,
            ));
        }
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (?1, ?2, TRUE, ?3, -1)",
        )
        .bind(migration.version)
        .bind(&*migration.description)
        .bind(&*migration.checksum)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        sqlx::raw_sql("PRAGMA foreign_keys = ON")
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Takes an exclusive lock on `<file>.lock` for the life of this process. (A lock file beside
/// the database rather than the database itself: closing any descriptor of the database would
/// drop SQLite's own locks.)
fn hold_exclusively(file: &Path) -> Result<File, ConnectError> {
    let mut lock_path = file.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| ConnectError::Config(format!("cannot open {}: {e}", lock_path.display())))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(ConnectError::InUse {
            file: std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf()),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(ConnectError::Config(format!(
            "cannot lock {}: {e}",
            lock_path.display()
        ))),
    }
}

fn open(file: &Path, flags: OpenFlags) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open_with_flags(file, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(Duration::from_secs(5))?;
    // temp_store: each unit's savepoint keeps its undo (the statement journal) in memory, not
    // in a temporary file created and unlinked per unit. cache_size: 64 MiB of pages.
    // wal_autocheckpoint: a batch writes hundreds of pages; copying the log back into the file
    // every 1 000 pages (the default) would cost a checkpoint every few commits.
    conn.execute_batch(
        "PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL; \
         PRAGMA temp_store = MEMORY; PRAGMA cache_size = -65536; \
         PRAGMA wal_autocheckpoint = 10000;",
    )?;
    Ok(conn)
}

impl SqliteStore {
    /// Readers busy now, and units queued for the writer.
    pub fn usage(&self) -> super::PoolUsage {
        super::PoolUsage {
            in_use: READERS.saturating_sub(self.readers.turns.available_permits()) as u64,
            waiting: self.stats.queued.load(Ordering::Relaxed),
        }
    }

    /// Queues `work` for the writer and waits for its answer, which comes after the commit of
    /// the batch that ran it.
    pub async fn transaction<W: Work<Tx>>(&self, work: W) -> Result<W::Output, W::Error> {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Unit {
            work: Some(work),
            result: None,
            reply,
            queued_until: Instant::now() + QUEUE_WAIT,
        });
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        if self.writer.send(job).is_err() {
            return Err(StoreError::Unavailable("the SQLite writer has stopped".into()).into());
        }
        match answer.await {
            Ok(result) => result,
            // The writer took the unit and stopped before answering: it may have stopped after
            // the COMMIT that held it. Only the key can tell.
            Err(_) => Err(StoreError::InDoubt(
                "the SQLite writer stopped before answering; the write may have committed".into(),
            )
            .into()),
        }
    }

    /// A read on one of the readers' own connections, off the async threads.
    pub async fn read<T: Send + 'static>(
        &self,
        sql: &'static str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Vec<T>, StoreError> {
        let args: Vec<OwnedArg> = args.iter().map(|a| OwnedArg::from(*a)).collect();
        self.on_reader(move |conn| {
            let args: Vec<Arg<'_>> = args.iter().map(OwnedArg::borrow).collect();
            fetch_all(conn, sql, &args, read)
        })
        .await
    }

    /// `f` on one of the readers' own connections, off the async threads.
    pub async fn on_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        // At most READERS reads at once: each gets a connection, none is opened twice.
        let _turn = self
            .readers
            .turns
            .acquire()
            .await
            .map_err(|e| StoreError::Unavailable(e.into()))?;
        tokio::task::spawn_blocking(move || readers.with(f))
            .await
            .map_err(|e| StoreError::Other(e.into()))?
    }
}

/// A connection that only reads the SQLite file of `url`, beside whoever writes it.
pub fn open_reader(url: &str) -> Result<Connection, StoreError> {
    let options = SqliteConnectOptions::from_str(url).map_err(|e| StoreError::Other(e.into()))?;
    open(options.get_filename(), OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(classify)
}

/// Read-only connections, opened on demand and kept for reuse.
#[derive(Debug)]
struct Readers {
    file: PathBuf,
    idle: Mutex<Vec<Connection>>,
    turns: tokio::sync::Semaphore,
}

impl Readers {
    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => open(&self.file, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(classify)?,
        };
        let result = f(&conn);
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
        result
    }
}

/// One queued write, type-erased for the writer's queue.
trait Job: Send {
    /// Its caller gave up waiting, or it waited too long: it will not be run.
    fn abandoned(&self) -> bool;
    /// Runs it inside its savepoint; `true` keeps what it wrote.
    fn run(&mut self, tx: &mut Tx, runtime: &Handle) -> bool;
    /// Answers it once its batch committed (or failed to).
    fn answer(self: Box<Self>, committed: Result<(), &StoreError>);
}

struct Unit<W: Work<Tx>> {
    work: Option<W>,
    result: Option<Result<Finish<W::Output>, W::Error>>,
    reply: oneshot::Sender<Result<W::Output, W::Error>>,
    queued_until: Instant,
}

impl<W: Work<Tx>> Job for Unit<W> {
    fn abandoned(&self) -> bool {
        self.reply.is_closed() || Instant::now() > self.queued_until
    }

    fn run(&mut self, tx: &mut Tx, runtime: &Handle) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        // A panic in one unit must not take the writer (and every later write) down with it.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(work.run(tx))))
            .unwrap_or_else(|_| {
                Err(StoreError::Other("a unit of work panicked; it was rolled back".into()).into())
            });
        let keep = matches!(result, Ok(Finish::Commit(_)));
        self.result = Some(result);
        keep
    }

    fn answer(self: Box<Self>, committed: Result<(), &StoreError>) {
        let answer = match (self.result, committed) {
            (None, _) => Err(StoreError::Busy(
                "the write waited too long for the SQLite writer".into(),
            )
            .into()),
            // Even a unit that rolled itself back may have read what an earlier unit of the
            // batch wrote: no answer survives a failed commit. A commit whose outcome is not
            // known stays so for each unit.
            (Some(_), Err(StoreError::InDoubt(error))) => {
                Err(StoreError::InDoubt(error.to_string().into()).into())
            }
            (Some(_), Err(error)) => Err(StoreError::Unavailable(error.to_string().into()).into()),
            (Some(Ok(Finish::Commit(output) | Finish::Rollback(output))), Ok(())) => Ok(output),
            (Some(Err(error)), Ok(())) => Err(error),
        };
        let _ = self.reply.send(answer);
    }
}

/// The writer thread: batch after batch until the store is dropped.
///
/// SQLite may roll a whole transaction back by itself inside a unit (a full disk, an I/O error):
/// `ROLLBACK TO` then fails, and whatever ran next would run outside any transaction, committing
/// on its own while being answered as failed. So after every unit the writer checks that the
/// batch's transaction is still open and that each savepoint statement worked; if not, the batch
/// is lost: every unit run in it is answered as not done (true: nothing of it committed), and
/// the units still queued start a new batch.
fn write_batches(
    mut conn: Connection,
    jobs: &Receiver<Box<dyn Job>>,
    runtime: &Handle,
    max_batch: usize,
    stats: &WriterStats,
    after_commit: &super::AfterSqliteCommit,
) {
    while let Ok(first) = jobs.recv() {
        if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
            stats.queued.fetch_sub(1, Ordering::SeqCst);
            first.answer(Err(&classify(error)));
            continue;
        }
        let mut tx = Tx::Sqlite(SqliteTx { conn });
        let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(max_batch);
        let mut lost = None;
        let mut next = Some(first);
        while let Some(mut job) = next.take() {
            stats.queued.fetch_sub(1, Ordering::SeqCst);
            if job.abandoned() {
                job.answer(Ok(()));
            } else {
                let end = run_in_savepoint(&mut tx, job.as_mut(), runtime);
                batch.push(job);
                if let Err(error) = end {
                    lost = Some(error);
                    break;
                }
            }
            if batch.len() < max_batch {
                next = jobs.try_recv().ok();
            }
        }
        let Tx::Sqlite(SqliteTx { conn: batch_conn }) = tx else {
            unreachable!("the writer only ever lends its SQLite connection");
        };
        conn = batch_conn;
        let committed = match lost {
            Some(error) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                tracing::error!(%error, units = batch.len(), "a SQLite batch was lost; none of it committed");
                Err(error)
            }
            None => {
                let committed = conn.execute_batch("COMMIT").map_err(classify);
                let committed = match (committed, &after_commit.0) {
                    (Ok(()), Some(seam)) => seam().map_err(|injected| {
                        classify(rusqlite::Error::SqliteFailure(
                            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                            Some(injected),
                        ))
                    }),
                    (committed, _) => committed,
                };
                match committed {
                    Ok(()) => Ok(()),
                    // Still inside the transaction (the COMMIT was refused, e.g. busy): rolled
                    // back here, so surely nothing of it committed.
                    Err(error) if !conn.is_autocommit() => {
                        let _ = conn.execute_batch("ROLLBACK");
                        Err(error)
                    }
                    // SQLite ended the transaction itself while committing (an I/O error, a
                    // full disk): what reached the file is not known here. Only the keys can
                    // tell, so every unit of the batch is answered "in doubt".
                    Err(error) => Err(StoreError::InDoubt(error.to_string().into())),
                }
            }
        };
        crate::metrics::group_commit(batch.len());
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.units.fetch_add(batch.len() as u64, Ordering::Relaxed);
        stats
            .largest_batch
            .fetch_max(batch.len() as u64, Ordering::SeqCst);
        for job in batch {
            job.answer(committed.as_ref().map(|_| ()));
        }
    }
}

/// Runs one unit in a savepoint of the batch. `Err`: the batch's transaction cannot be trusted
/// any more (SQLite ended it, or a savepoint statement failed) and must not commit.
fn run_in_savepoint(tx: &mut Tx, job: &mut dyn Job, runtime: &Handle) -> Result<(), StoreError> {
    let lost = |error: &dyn std::fmt::Display| {
        StoreError::Unavailable(format!("the batch's transaction was lost: {error}").into())
    };
    {
        let Tx::Sqlite(SqliteTx { conn }) = tx else {
            unreachable!("the writer only ever lends its SQLite connection");
        };
        conn.execute_batch("SAVEPOINT unit").map_err(|e| lost(&e))?;
    }
    let keep = job.run(tx, runtime);
    let Tx::Sqlite(SqliteTx { conn }) = tx else {
        unreachable!("the writer only ever lends its SQLite connection");
    };
    if conn.is_autocommit() {
        return Err(lost(&"SQLite rolled it back (disk full or an I/O error)"));
    }
    let end = if keep {
        "RELEASE unit"
    } else {
        "ROLLBACK TO unit; RELEASE unit"
    };
    conn.execute_batch(end).map_err(|e| lost(&e))?;
    if conn.is_autocommit() {
        return Err(lost(&"it ended with the unit's savepoint"));
    }
    Ok(())
}

// -- statements --------------------------------------------------------------------------------

impl SqliteTx {
    pub fn fetch_all<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        read: ReadRow<T>,
    ) -> Result<Vec<T>, StoreError> {
        fetch_all(&self.conn, sql, args, read)
    }

    pub fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut statement = self.conn.prepare_cached(sql).map_err(classify)?;
        bind(&mut statement, args).map_err(classify)?;
        statement.raw_execute().map(|n| n as u64).map_err(classify)
    }
}

pub(super) fn fetch_all<T>(
    conn: &Connection,
    sql: &str,
    args: &[Arg<'_>],
    read: ReadRow<T>,
) -> Result<Vec<T>, StoreError> {
    let mut statement = conn.prepare_cached(sql).map_err(classify)?;
    bind(&mut statement, args).map_err(classify)?;
    let mut rows = statement.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(classify)? {
        out.push(read(row).map_err(StoreError::Other)?);
    }
    Ok(out)
}

/// `$1, $2, …` are named parameters to SQLite; bind each by its name.
fn bind(statement: &mut Statement<'_>, args: &[Arg<'_>]) -> rusqlite::Result<()> {
    const NAMES: [&str; 12] = [
        "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10", "$11", "$12",
    ];
    for (arg, name) in args.iter().zip(NAMES) {
        let Some(index) = statement.parameter_index(name)? else {
            continue;
        };
        match *arg {
            Arg::Int(n) => statement.raw_bind_parameter(index, n)?,
            Arg::Text(s) => statement.raw_bind_parameter(index, s)?,
            Arg::OptText(s) => statement.raw_bind_parameter(index, s)?,
        }
    }
    // A `Template`'s `{now}`: this process's clock (it holds the file alone).
    if let Some(index) = statement.parameter_index("$now")? {
        statement.raw_bind_parameter(index, checkout_idempotency::now_ms())?;
    }
    Ok(())
}

impl Row for rusqlite::Row<'_> {
    fn opt_int(&self, column: &str) -> Result<Option<i64>, RowError> {
        Ok(self.get(column)?)
    }

    fn opt_text(&self, column: &str) -> Result<Option<String>, RowError> {
        Ok(self.get(column)?)
    }
}

pub fn classify(error: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked, DiskFull, ReadOnly, SystemIoFailure};
    match &error {
        rusqlite::Error::SqliteFailure(failure, _)
            if matches!(failure.code, DatabaseBusy | DatabaseLocked) =>
        {
            StoreError::Busy(error.into())
        }
        // The file is full (or the disk failed) but the statement alone was undone: the unit's
        // savepoint rolls back and the request is refused as the database's trouble (503),
        // not as a bug of ours (500).
        rusqlite::Error::SqliteFailure(failure, _)
            if matches!(failure.code, DiskFull | SystemIoFailure | ReadOnly) =>
        {
            StoreError::Unavailable(error.into())
        }
        _ => StoreError::Other(error.into()),
    }
}
