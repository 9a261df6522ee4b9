//! The consumer's own database: its inbox and its receipts, SQLite (a file, the default) or
//! PostgreSQL (by URL). Every SQL statement of the consumer is here, written once: the same text
//! runs on either (`$n` parameters, `ON CONFLICT`, partial indexes), and [`on_either!`] hands
//! it to whichever driver holds the connection.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::Duration;

use checkout_idempotency::{
    Claim, Claimed, Classify, Failure, Finish, KeyRecord, KeyStore, KeyTx, LateClaim,
    StoredResponse, Work,
};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, Postgres, Sqlite, SqlitePool};

use crate::receipt::{Kind, Line, NewReceipt, Receipt};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Either database's handle of one kind (a pool, a transaction).
pub enum Either<S, P> {
    Sqlite(S),
    Postgres(P),
}

/// Runs `$body` with `$name` bound to whichever driver's handle `$value` holds: one statement
/// text, two drivers' types.
macro_rules! on_either {
    ($value:expr, $name:ident => $body:expr) => {
        match $value {
            Either::Sqlite($name) => $body,
            Either::Postgres($name) => $body,
        }
    };
}

/// The receipt's row, as a query to fetch on either driver; it returns nothing when its payment
/// (or refund) has one already, by another event. `$key`: the message's key the receipt holds
/// (its queue and fingerprint, see [`receipt_key`]), if it does.
macro_rules! insert_receipt {
    ($receipt_id:expr, $receipt:expr, $lines:expr, $now_ms:expr, $key:expr) => {
        sqlx::query_as::<_, (String,)>(
            "INSERT INTO receipts (receipt_id, kind, payment_id, refund_id, order_id, currency, \
                                   livemode, lines, total, event_id, operation_at, issued_at, \
                                   consumer, request_hash) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT DO NOTHING RETURNING receipt_id",
        )
        .bind($receipt_id)
        .bind($receipt.kind.as_str())
        .bind($receipt.payment_id.as_str())
        .bind($receipt.refund_id.as_deref())
        .bind($receipt.order_id.as_str())
        .bind($receipt.currency.as_str())
        .bind(i64::from($receipt.livemode))
        .bind($lines)
        .bind($receipt.total)
        .bind($receipt.event_id.as_str())
        .bind($receipt.operation_at.as_str())
        .bind($now_ms)
        .bind($key.map(|(consumer, _)| consumer))
        .bind($key.map(|(_, request_hash)| request_hash))
    };
}

#[derive(Clone)]
pub struct Store {
    /// Where the inbox's transactions and every write go.
    pool: Either<SqlitePool, PgPool>,
    /// Where `GET /receipts` reads: the same pool on PostgreSQL; on SQLite read-only
    /// connections of their own, so that a long listing never holds up the writer.
    reads: Either<SqlitePool, PgPool>,
}

impl Clone for Either<SqlitePool, PgPool> {
    fn clone(&self) -> Self {
        match self {
            Either::Sqlite(pool) => Either::Sqlite(pool.clone()),
            Either::Postgres(pool) => Either::Postgres(pool.clone()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the receipts' database: {0}")]
pub struct StoreError(#[from] pub sqlx::Error);

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(error: sqlx::migrate::MigrateError) -> StoreError {
        StoreError(sqlx::Error::Migrate(Box::new(error)))
    }
}

impl Classify for StoreError {
    fn failure(&self) -> Failure {
        let sqlx::Error::Database(e) = &self.0 else {
            return match &self.0 {
                sqlx::Error::PoolTimedOut => Failure::Busy,
                _ => Failure::Fatal,
            };
        };
        match e.code().as_deref() {
            // PostgreSQL: lock_timeout (another consumer holds the message's claim); a lost
            // serialization race or deadlock.
            Some("55P03") => Failure::Busy,
            Some("40001" | "40P01") => Failure::Retry,
            // SQLite: the other process's writer held the file past the busy timeout.
            _ if e.message().contains("locked") || e.message().contains("busy") => Failure::Busy,
            _ => Failure::Fatal,
        }
    }
}

/// How long a claim waits for another consumer holding the same message.
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// A pooled PostgreSQL connection idle this long is pinged before it is lent. Longer than the
/// checkout's second: a batch that fails on a connection broken meanwhile only comes again.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(10);

impl Store {
    /// Opens (and migrates) `sqlite://FILE` (created if missing) or `postgres://…`.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let options = PgConnectOptions::from_str(url)?
                .options([("lock_timeout", format!("{}ms", LOCK_TIMEOUT.as_millis()))]);
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(10))
                // sqlx pings every connection it lends: a round trip before each batch. One in
                // steady use is known alive (sqlx pings each given back, too), so only one
                // idle for a while is pinged.
                .test_before_acquire(false)
                .before_acquire(|conn, meta| {
                    Box::pin(async move {
                        Ok(meta.idle_for < IDLE_BEFORE_PING
                            || sqlx::Connection::ping(conn).await.is_ok())
                    })
                })
                .connect_with(options)
                .await?;
            POSTGRES_MIGRATIONS.run(&pool).await?;
            return Ok(Store {
                pool: Either::Postgres(pool.clone()),
                reads: Either::Postgres(pool),
            });
        }
        // FULL: a receipt is acknowledged to the broker once committed, so the commit must
        // survive a power cut too, not only a crash of the process.
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(LOCK_TIMEOUT);
        // One writing connection: SQLite has one writer anyway, and writers of one process
        // queue for this connection in order, where several connections would poll SQLite's
        // lock in the busy handler's growing sleeps. Another consumer process still waits on
        // the lock (the busy timeout).
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        SQLITE_MIGRATIONS.run(&pool).await?;
        let reads = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.read_only(true))
            .await?;
        Ok(Store {
            pool: Either::Sqlite(pool),
            reads: Either::Sqlite(reads),
        })
    }

    /// The receipts, newest first by id (ids are time-ordered), at most `limit`; only
    /// `payment_id`'s if given; only those before `starting_after` (an id) if given.
    pub async fn receipts(
        &self,
        payment_id: Option<&str>,
        starting_after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Receipt>, StoreError> {
        let rows: Vec<ReceiptRow> = on_either!(&self.reads, pool => {
            sqlx::query_as(
                "SELECT receipt_id, kind, payment_id, refund_id, order_id, currency, livemode, \
                        lines, total, event_id, operation_at, issued_at \
                   FROM receipts WHERE ($1 IS NULL OR payment_id = $1) \
                    AND ($2 IS NULL OR receipt_id < $2) \
                  ORDER BY receipt_id DESC LIMIT $3",
            )
            .bind(payment_id)
            .bind(starting_after)
            .bind(limit)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().filter_map(receipt).collect())
    }

    /// How many receipts, and their sum with returns subtracted: what the books must show.
    pub async fn totals(&self) -> Result<Totals, StoreError> {
        let (income, returns, net): (i64, i64, i64) = on_either!(&self.reads, pool => {
            sqlx::query_as(
                "SELECT CAST(COALESCE(SUM(CASE WHEN kind = 'income' THEN 1 ELSE 0 END), 0) AS BIGINT), \
                        CAST(COALESCE(SUM(CASE WHEN kind = 'income' THEN 0 ELSE 1 END), 0) AS BIGINT), \
                        CAST(COALESCE(SUM(CASE WHEN kind = 'income' THEN total ELSE -total END), 0) AS BIGINT) \
                   FROM receipts",
            )
            .fetch_one(pool)
            .await?
        });
        Ok(Totals {
            income,
            returns,
            net,
        })
    }

    /// The protocol's view of this database: where the inbox's keys live, beside the receipts.
    pub fn inbox(&self) -> Inbox {
        Inbox {
            pool: self.pool.clone(),
        }
    }

    /// Writes a batch's receipts with no inbox at all, in one transaction, each database the
    /// way the inbox's batch writes them (SQLite one by one, PostgreSQL in one statement): the
    /// benchmark's baseline, never the consumer's way (a redelivered message would be refused
    /// by the unique indexes, not absorbed). How many were written.
    pub async fn insert_without_inbox(
        &self,
        receipts: &[NewReceipt],
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let mut tx = begin(&self.pool).await?;
        let written = match &mut tx {
            Either::Sqlite(tx) => {
                let mut written = 0;
                for receipt in receipts {
                    let inserted: Option<(String,)> = insert_receipt!(
                        receipt_id(),
                        receipt,
                        lines_json(receipt),
                        now_ms,
                        None::<(&str, &str)>
                    )
                    .fetch_optional(&mut **tx)
                    .await?;
                    written += usize::from(inserted.is_some());
                }
                written
            }
            Either::Postgres(tx) => {
                let mut rows = ReceiptRows::default();
                for receipt in receipts {
                    rows.push(receipt_id(), receipt, None, now_ms);
                }
                let written = rows
                    .bind(sqlx::query(POSTGRES_INSERT_RECEIPTS))
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                usize::try_from(written).unwrap_or(usize::MAX)
            }
        };
        end(tx, true).await?;
        Ok(written)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    /// «Приход» receipts.
    pub income: i64,
    /// «Возврат прихода» receipts.
    pub returns: i64,
    /// Kopecks: income minus returns.
    pub net: i64,
}

type ReceiptRow = (
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
    String,
    i64,
    String,
    String,
    i64,
);

fn receipt(
    (
        receipt_id,
        kind,
        payment_id,
        refund_id,
        order_id,
        currency,
        livemode,
        lines,
        total,
        event_id,
        operation_at,
        issued_at,
    ): ReceiptRow,
) -> Option<Receipt> {
    let kind = Kind::parse(&kind)?;
    Some(Receipt {
        receipt_id,
        kind,
        title: kind.title().to_owned(),
        payment_id,
        refund_id,
        order_id,
        currency,
        livemode: livemode == 1,
        lines: serde_json::from_str::<Vec<Line>>(&lines).ok()?,
        total,
        event_id,
        operation_at,
        issued_at: rfc3339(issued_at),
    })
}

pub fn rfc3339(ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn lines_json(receipt: &NewReceipt) -> String {
    serde_json::to_string(&receipt.lines).expect("lines serialize")
}

/// A new receipt's id (time-ordered: the index it goes into grows at one end).
fn receipt_id() -> String {
    format!("rcp_{}", uuid::Uuid::now_v7().simple())
}

/// PostgreSQL: receipts inserted from one array per column ([`ReceiptRows`]), in one statement
/// whatever their number; a receipt the unique indexes refuse fails it.
macro_rules! postgres_receipts_from_arrays {
    () => {
        "INSERT INTO receipts (receipt_id, kind, payment_id, refund_id, order_id, currency, \
                               livemode, lines, total, event_id, operation_at, issued_at, \
                               consumer, request_hash) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
                              $6::text[], $7::bigint[], $8::text[], $9::bigint[], $10::text[], \
                              $11::text[], $12::bigint[], $13::text[], $14::text[])"
    };
}

const POSTGRES_INSERT_RECEIPTS: &str = postgres_receipts_from_arrays!();

/// Receipts to insert on PostgreSQL, one array per column, in [`postgres_receipts_from_arrays`]'s
/// order.
#[derive(Default)]
struct ReceiptRows {
    receipt_id: Vec<String>,
    kind: Vec<&'static str>,
    payment_id: Vec<String>,
    refund_id: Vec<Option<String>>,
    order_id: Vec<String>,
    currency: Vec<String>,
    livemode: Vec<i64>,
    lines: Vec<String>,
    total: Vec<i64>,
    event_id: Vec<String>,
    operation_at: Vec<String>,
    issued_at: Vec<i64>,
    consumer: Vec<Option<String>>,
    request_hash: Vec<Option<String>>,
}

impl ReceiptRows {
    fn push(
        &mut self,
        receipt_id: String,
        receipt: &NewReceipt,
        key: Option<(&str, &str)>,
        now_ms: i64,
    ) {
        self.receipt_id.push(receipt_id);
        self.kind.push(receipt.kind.as_str());
        self.payment_id.push(receipt.payment_id.clone());
        self.refund_id.push(receipt.refund_id.clone());
        self.order_id.push(receipt.order_id.clone());
        self.currency.push(receipt.currency.clone());
        self.livemode.push(i64::from(receipt.livemode));
        self.lines.push(lines_json(receipt));
        self.total.push(receipt.total);
        self.event_id.push(receipt.event_id.clone());
        self.operation_at.push(receipt.operation_at.clone());
        self.issued_at.push(now_ms);
        self.consumer
            .push(key.map(|(consumer, _)| consumer.to_owned()));
        self.request_hash
            .push(key.map(|(_, request_hash)| request_hash.to_owned()));
    }

    fn is_empty(&self) -> bool {
        self.receipt_id.is_empty()
    }

    /// Binds the columns as the statement's parameters.
    fn bind(self, query: PgQuery<'_>) -> PgQuery<'_> {
        query
            .bind(self.receipt_id)
            .bind(self.kind)
            .bind(self.payment_id)
            .bind(self.refund_id)
            .bind(self.order_id)
            .bind(self.currency)
            .bind(self.livemode)
            .bind(self.lines)
            .bind(self.total)
            .bind(self.event_id)
            .bind(self.operation_at)
            .bind(self.issued_at)
            .bind(self.consumer)
            .bind(self.request_hash)
    }
}

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

// -- the inbox: the idempotency protocol's keys, beside the receipts ----------------------------
//
// A message's key is held by one of two records: the receipt it issued (whose `event_id` is the
// message id; the queue and the message's fingerprint beside it, and its answer is the
// receipt's id), or an inbox row (a claim in progress, or an outcome that is not a receipt: a
// refusal). A message that issued a receipt writes no row of its own: the receipt is the
// record, as a payment's idempotency key is stored on the payment it made.

/// The receipts' database as [`KeyStore`]: one transaction per batch of messages, or per
/// message when one runs alone ([`begin`]).
pub struct Inbox {
    pool: Either<SqlitePool, PgPool>,
}

/// One batch's transaction: the claims, the receipts, the stored outcomes.
pub struct InboxTx {
    tx: WriteTx,
    /// Set when a claim came before the receipts (a message alone, or a batch taking the
    /// protocol's steps): then each receipt is written at once, and its answer says whether
    /// it was (see [`InboxTx::issue`]). Its value is the claims' bound: a record older than
    /// this no longer holds its key.
    claimed_first: Option<i64>,
    /// PostgreSQL: receipts issued before their messages' late claim, written by it.
    unwritten: ReceiptRows,
    /// The claims (by claim id) whose keys the receipts this transaction wrote (or noted) hold:
    /// each one's receipt id.
    held_by_receipts: HashMap<String, String>,
}

/// What became of a receipt ([`InboxTx::issue`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Issued {
    /// Written (on PostgreSQL, in a batch whose keys are claimed late, to be written by its late
    /// claim): its id.
    Receipt(String),
    /// Its payment (or refund) has a receipt already, by another event.
    Refused,
    /// The message's own receipt, committed by another consumer after this transaction's
    /// claim of it was made: the claim is stale, and the next attempt's finds that receipt.
    ClaimedMeanwhile,
}

/// The answer stored for a message that issued a receipt: what the receipt's row gives back as
/// its key's record ([`receipt_key_record`]), byte for byte.
pub fn issued_answer(receipt_id: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        body: json!({ "receipt_id": receipt_id }).to_string(),
    }
}

/// A receipt's row as the record of the key it holds ([`KeyRow`]'s columns), as
/// [`issued_answer`] makes it.
macro_rules! receipt_key_record {
    () => {
        "request_hash, 'done', CAST(201 AS BIGINT), \
         '{\"receipt_id\":\"' || receipt_id || '\"}', issued_at"
    };
}

/// The message's key a receipt holds — its queue and its fingerprint — when the receipt is the
/// message's own (its event is the message: always, for a message of the checkout's).
fn receipt_key<'c>(receipt: &NewReceipt, claim: &'c Claim) -> Option<(&'c str, &'c str)> {
    (receipt.event_id == claim.key).then_some((claim.scope.as_str(), claim.request_hash.as_str()))
}

type WriteTx = Either<sqlx::Transaction<'static, Sqlite>, sqlx::Transaction<'static, Postgres>>;

/// A write transaction (SQLite's begun `IMMEDIATE`, so that it never deadlocks with another
/// process's).
async fn begin(pool: &Either<SqlitePool, PgPool>) -> Result<WriteTx, StoreError> {
    Ok(match pool {
        Either::Sqlite(pool) => Either::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
        Either::Postgres(pool) => Either::Postgres(pool.begin().await?),
    })
}

/// Commits `tx`, or rolls it back.
async fn end(tx: WriteTx, commit: bool) -> Result<(), StoreError> {
    match (commit, tx) {
        (true, Either::Sqlite(tx)) => tx.commit().await?,
        (true, Either::Postgres(tx)) => tx.commit().await?,
        (false, Either::Sqlite(tx)) => tx.rollback().await?,
        (false, Either::Postgres(tx)) => tx.rollback().await?,
    }
    Ok(())
}

type KeyRow = (String, String, Option<i64>, Option<String>, i64);
/// A key's scope and key, then its [`KeyRow`].
type HeldRow = (
    String,
    String,
    String,
    String,
    Option<i64>,
    Option<String>,
    i64,
);

fn key_record(
    (request_hash, status, response_status, response_body, created_at): KeyRow,
) -> KeyRecord {
    let response = StoredResponse::from_columns(&status, response_status, response_body);
    KeyRecord {
        request_hash,
        // Not kept (see the migration 0002): a reused message id is told by its fingerprint.
        request_body: None,
        response,
        created_at_ms: created_at,
    }
}

/// A key's record: the newest of its inbox row and the receipt that holds it (a key has both
/// once its receipt's record has expired and a later claim stored a refusal).
const STORED_KEY: &str = concat!(
    "SELECT request_hash, status, response_status, response_body, created_at FROM inbox \
      WHERE consumer = $1 AND message_id = $2 \
     UNION ALL \
     SELECT ",
    receipt_key_record!(),
    " FROM receipts WHERE event_id = $2 AND consumer = $1 \
     ORDER BY created_at DESC LIMIT 1"
);

impl KeyStore for Inbox {
    type Tx = InboxTx;
    type Error = StoreError;

    /// Nearly every message is new: a read before the claim would only cost a round trip
    /// (and a redelivery is told by the claim itself).
    fn reads_before_claim(&self) -> bool {
        false
    }

    /// A batch's receipts are written, and hold their messages' keys, with no claim before
    /// them: the inbox's late claim is their one statement (PostgreSQL), or nothing at all. A
    /// redelivered message in the batch makes the batch run again with its claims first (rare:
    /// a consumer gone before its acks).
    fn claims_late(&self) -> bool {
        true
    }

    async fn stored_key(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<KeyRow> = on_either!(&self.pool, pool => {
            sqlx::query_as(STORED_KEY).bind(scope).bind(key).fetch_optional(pool).await?
        });
        Ok(row.map(key_record))
    }

    async fn transaction<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<InboxTx>,
    {
        let mut tx = InboxTx {
            tx: begin(&self.pool).await?,
            claimed_first: None,
            unwritten: ReceiptRows::default(),
            held_by_receipts: HashMap::new(),
        };
        let finished = work.run(&mut tx).await;
        let commit = matches!(finished, Ok(Finish::Commit(_)));
        if commit {
            // Never left unwritten by the protocol (its late claim writes them), but an
            // answer that names a receipt commits only with it.
            tx.write_unwritten().await?;
        }
        end(tx.tx, commit).await?;
        match finished? {
            Finish::Commit(output) | Finish::Rollback(output) => Ok(output),
        }
    }
}

impl KeyTx for InboxTx {
    type Error = StoreError;

    /// The key's inbox row inserted (or an expired one's taken over), unless a live receipt
    /// holds the key. PostgreSQL: a second consumer's claim of the same message waits here for
    /// the first one's claim (at most the lock timeout); a receipt for it that the first is
    /// writing, uncommitted, is found when this one's receipt waits for it
    /// ([`Issued::ClaimedMeanwhile`]).
    async fn claim(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<Claimed, StoreError> {
        self.claimed_first = Some(expired_before_ms);
        let claimed: Option<(String,)> = on_either!(&mut self.tx, tx => {
            sqlx::query_as(
                "INSERT INTO inbox (consumer, message_id, claim_id, request_hash, status, \
                                    created_at) \
                 SELECT $1, $2, $3, $4, 'in_progress', $5 \
                  WHERE NOT EXISTS (SELECT 1 FROM receipts \
                                     WHERE event_id = $2 AND consumer = $1 AND issued_at >= $6) \
                 ON CONFLICT (consumer, message_id) DO UPDATE \
                    SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, \
                        status = 'in_progress', response_status = NULL, \
                        response_body = NULL, created_at = excluded.created_at \
                  WHERE inbox.created_at < $6 \
                 RETURNING claim_id",
            )
            .bind(&claim.scope)
            .bind(&claim.key)
            .bind(&claim.claim_id)
            .bind(&claim.request_hash)
            .bind(claim.now_ms)
            .bind(expired_before_ms)
            .fetch_optional(&mut **tx)
            .await?
        });
        if claimed.is_some() {
            return Ok(Claimed::Ours);
        }
        Ok(Claimed::Taken(self.held(claim).await?))
    }

    /// [`KeyTx::claim`] of every claim, in one statement whatever their number (and, on
    /// SQLite, one more for each key it takes over from an expired row).
    ///
    /// SQLite: this transaction took the database's one write lock as it began (`IMMEDIATE`),
    /// so no other can write a key before it ends, and a key no live record holds is this
    /// transaction's already. The claim is then a read, and [`KeyTx::complete_many`] writes
    /// each refusal's row once, with its answer (a receipt holds its own key). PostgreSQL has
    /// no such lock: each key is claimed by inserting its row, whose index entry makes another
    /// consumer's claim of it wait for this transaction.
    async fn claim_many(
        &mut self,
        claims: &[Claim],
        expired_before_ms: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        self.claimed_first = Some(expired_before_ms);
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        match &mut self.tx {
            Either::Sqlite(tx) => sqlite_claim_many(tx, claims, expired_before_ms).await,
            Either::Postgres(tx) => {
                let column =
                    |f: fn(&Claim) -> &str| -> Vec<&str> { claims.iter().map(f).collect() };
                let taken: Vec<(String, String)> = sqlx::query_as(POSTGRES_CLAIM_MANY)
                    .bind(column(|c| &c.scope))
                    .bind(column(|c| &c.key))
                    .bind(column(|c| &c.claim_id))
                    .bind(column(|c| &c.request_hash))
                    .bind(claims.iter().map(|c| c.now_ms).collect::<Vec<i64>>())
                    .bind(expired_before_ms)
                    .fetch_all(&mut **tx)
                    .await?;
                // The keys it did not take are read one by one (redeliveries: rare).
                let ours: HashSet<(String, String)> = taken.into_iter().collect();
                let mut claimed = Vec::with_capacity(claims.len());
                for claim in claims {
                    if ours.contains(&(claim.scope.clone(), claim.key.clone())) {
                        claimed.push(Claimed::Ours);
                    } else {
                        claimed.push(Claimed::Taken(self.held(claim).await?));
                    }
                }
                Ok(claimed)
            }
        }
    }

    /// [`KeyTx::complete`] of every claimed key: each refusal's row as it stays, written over
    /// the claim's (PostgreSQL, in one statement whatever their number) or written now
    /// (SQLite, see `claim_many`); the claims of the keys their receipts now hold, deleted
    /// (PostgreSQL; SQLite's wrote none).
    async fn complete_many(
        &mut self,
        answers: &[(&Claim, &StoredResponse)],
    ) -> Result<(), StoreError> {
        let (held, rows) = self.held_apart(answers)?;
        let mut done = 0;
        if !rows.is_empty() {
            done += self.write_answered(&rows).await?;
        }
        if let Either::Postgres(tx) = &mut self.tx
            && !held.is_empty()
        {
            let column =
                |f: fn(&Claim) -> &str| -> Vec<&str> { held.iter().map(|c| f(c)).collect() };
            done += sqlx::query(POSTGRES_DELETE_CLAIMS)
                .bind(column(|c| &c.scope))
                .bind(column(|c| &c.key))
                .bind(column(|c| &c.claim_id))
                .execute(&mut **tx)
                .await?
                .rows_affected();
        } else {
            done += held.len() as u64;
        }
        if done == answers.len() as u64 {
            Ok(())
        } else {
            Err(StoreError(sqlx::Error::RowNotFound))
        }
    }

    /// The late claim: a batch's receipts hold their keys — on PostgreSQL this is their one
    /// statement, which fails (after waiting for a transaction writing one) if any of them is
    /// refused, by a receipt of its event, payment or refund; every other answer (a refusal) is
    /// inserted as its key's row, on SQLite, unless a receipt holds its key or it has a row:
    /// then nothing commits, and the batch runs again with its claims first, where each
    /// receipt is written at once and a refusal is answered.
    async fn insert_answered_many(
        &mut self,
        answers: &[(&Claim, &StoredResponse)],
    ) -> Result<LateClaim, StoreError> {
        let (_, rows) = self.held_apart(answers)?;
        let all_written = match &mut self.tx {
            // Every answer of a late-claimed batch on PostgreSQL is a receipt noted (see
            // `issue`): any other takes the claims first.
            Either::Postgres(_) if !rows.is_empty() => Ok(false),
            Either::Postgres(_) => self.write_unwritten().await.map(|()| true),
            Either::Sqlite(_) if rows.is_empty() => Ok(true),
            Either::Sqlite(tx) => sqlx::query(SQLITE_INSERT_ANSWERED_UNLESS_HELD)
                .bind(sqlite_answered_rows(&rows))
                .execute(&mut **tx)
                .await
                .map(|done| done.rows_affected() == rows.len() as u64)
                .map_err(StoreError),
        };
        match all_written {
            Ok(true) => Ok(LateClaim::Written),
            Ok(false) => Ok(LateClaim::KeyHeld),
            Err(StoreError(sqlx::Error::Database(e))) if e.is_unique_violation() => {
                Ok(LateClaim::KeyHeld)
            }
            Err(error) => Err(error),
        }
    }

    /// The answer over the claim's row; or, if the key's receipt holds it now, the claim's row
    /// deleted.
    async fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let (held, _) = self.held_apart(&[(claim, response)])?;
        let done = on_either!(&mut self.tx, tx => {
            if held.is_empty() {
                sqlx::query(
                    "UPDATE inbox SET status = 'done', response_status = $4, response_body = $5 \
                     WHERE consumer = $1 AND message_id = $2 AND claim_id = $3",
                )
                .bind(&claim.scope)
                .bind(&claim.key)
                .bind(&claim.claim_id)
                .bind(i64::from(response.status))
                .bind(&response.body)
                .execute(&mut **tx)
                .await?
                .rows_affected()
            } else {
                sqlx::query(
                    "DELETE FROM inbox WHERE consumer = $1 AND message_id = $2 AND claim_id = $3",
                )
                .bind(&claim.scope)
                .bind(&claim.key)
                .bind(&claim.claim_id)
                .execute(&mut **tx)
                .await?
                .rows_affected()
            }
        });
        if done == 1 {
            Ok(())
        } else {
            Err(StoreError(sqlx::Error::RowNotFound))
        }
    }
}

/// SQLite's claim of a batch (see [`KeyTx::claim_many`] of [`InboxTx`]): which records hold
/// the keys, in one read; a key whose newest record is older than `expired_before_ms` (months:
/// rare) has its inbox row deleted, if it has one, and is taken over.
async fn sqlite_claim_many(
    tx: &mut sqlx::Transaction<'static, Sqlite>,
    claims: &[Claim],
    expired_before_ms: i64,
) -> Result<Vec<Claimed>, StoreError> {
    let keys: Vec<Value> = claims.iter().map(|c| json!([c.scope, c.key])).collect();
    let rows: Vec<HeldRow> = sqlx::query_as(SQLITE_HELD_MANY)
        .bind(Value::Array(keys).to_string())
        .fetch_all(&mut **tx)
        .await?;
    let mut held: HashMap<(String, String), KeyRow> = HashMap::with_capacity(rows.len());
    for (scope, key, hash, status, response_status, body, created_at) in rows {
        let row = (hash, status, response_status, body, created_at);
        match held.entry((scope, key)) {
            std::collections::hash_map::Entry::Occupied(mut newest) => {
                if newest.get().4 < created_at {
                    newest.insert(row);
                }
            }
            std::collections::hash_map::Entry::Vacant(first) => {
                first.insert(row);
            }
        }
    }
    let mut claimed = Vec::with_capacity(claims.len());
    for claim in claims {
        match held.remove(&(claim.scope.clone(), claim.key.clone())) {
            None => claimed.push(Claimed::Ours),
            Some(row @ (.., created_at)) if created_at >= expired_before_ms => {
                claimed.push(Claimed::Taken(Some(key_record(row))));
            }
            Some(_) => {
                sqlx::query("DELETE FROM inbox WHERE consumer = $1 AND message_id = $2")
                    .bind(&claim.scope)
                    .bind(&claim.key)
                    .execute(&mut **tx)
                    .await?;
                claimed.push(Claimed::Ours);
            }
        }
    }
    Ok(claimed)
}

/// The batch statements take their rows as one parameter of each database's own kind (SQLite
/// a JSON array of rows, PostgreSQL an array per column), so that the text is the same for any
/// number of them and prepared once.
///
/// SQLite: the records that hold any of the keys (a key may have two, see [`STORED_KEY`]).
const SQLITE_HELD_MANY: &str = concat!(
    "SELECT inbox.consumer, inbox.message_id, request_hash, status, response_status, \
            response_body, created_at \
       FROM json_each($1) AS keys \
       JOIN inbox ON inbox.consumer = keys.value ->> 0 AND inbox.message_id = keys.value ->> 1 \
     UNION ALL \
     SELECT receipts.consumer, receipts.event_id, ",
    receipt_key_record!(),
    " FROM json_each($1) AS keys \
       JOIN receipts ON receipts.event_id = keys.value ->> 1 \
                    AND receipts.consumer = keys.value ->> 0"
);

/// PostgreSQL: each new key's row inserted (or an expired one's taken over), unless a live
/// receipt holds it; the keys it took come back.
const POSTGRES_CLAIM_MANY: &str = "\
    INSERT INTO inbox (consumer, message_id, claim_id, request_hash, status, created_at) \
    SELECT consumer, message_id, claim_id, request_hash, 'in_progress', created_at \
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) \
           AS claims (consumer, message_id, claim_id, request_hash, created_at) \
     WHERE NOT EXISTS (SELECT 1 FROM receipts \
                        WHERE receipts.event_id = claims.message_id \
                          AND receipts.consumer = claims.consumer \
                          AND receipts.issued_at >= $6) \
    ON CONFLICT (consumer, message_id) DO UPDATE \
       SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, \
           status = 'in_progress', response_status = NULL, response_body = NULL, \
           created_at = excluded.created_at \
     WHERE inbox.created_at < $6 \
    RETURNING consumer, message_id";

/// PostgreSQL: the claims of keys that their receipts now hold, deleted.
const POSTGRES_DELETE_CLAIMS: &str = "\
    DELETE FROM inbox USING unnest($1::text[], $2::text[], $3::text[]) \
                            AS held (consumer, message_id, claim_id) \
     WHERE inbox.consumer = held.consumer AND inbox.message_id = held.message_id \
       AND inbox.claim_id = held.claim_id";

/// SQLite: each key's one row, with its answer (a key with a row fails it).
const SQLITE_INSERT_ANSWERED: &str = "\
    INSERT INTO inbox (consumer, message_id, claim_id, request_hash, status, response_status, \
                       response_body, created_at) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, 'done', value ->> 4, \
           value ->> 5, value ->> 6 \
      FROM json_each($1)";

/// SQLite, the late claim: each key's one row, with its answer, but none for a key that a
/// receipt holds, live or not (a key with a row fails it).
const SQLITE_INSERT_ANSWERED_UNLESS_HELD: &str = "\
    INSERT INTO inbox (consumer, message_id, claim_id, request_hash, status, response_status, \
                       response_body, created_at) \
    SELECT answers.value ->> 0, answers.value ->> 1, answers.value ->> 2, \
           answers.value ->> 3, 'done', answers.value ->> 4, answers.value ->> 5, \
           answers.value ->> 6 \
      FROM json_each($1) AS answers \
     WHERE NOT EXISTS (SELECT 1 FROM receipts \
                        WHERE receipts.event_id = answers.value ->> 1 \
                          AND receipts.consumer = answers.value ->> 0)";

/// PostgreSQL: the answer written over each claim's row, only while the row is still that
/// claim's. (A claimed row cannot be missing: its insert locked it until this transaction
/// ends. Were it, the row would be inserted as it stays.)
const POSTGRES_COMPLETE_MANY: &str = "\
    INSERT INTO inbox (consumer, message_id, claim_id, request_hash, status, response_status, \
                       response_body, created_at) \
    SELECT consumer, message_id, claim_id, request_hash, 'done', status, body, created_at \
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], \
                  $6::bigint[], $7::text[]) \
           AS answers (consumer, message_id, claim_id, request_hash, created_at, status, body) \
    ON CONFLICT (consumer, message_id) DO UPDATE \
       SET status = 'done', response_status = excluded.response_status, \
           response_body = excluded.response_body \
     WHERE inbox.claim_id = excluded.claim_id";

/// SQLite: each key's row with its answer, as the batch statements' one parameter.
fn sqlite_answered_rows(answers: &[(&Claim, &StoredResponse)]) -> String {
    let rows: Vec<Value> = answers
        .iter()
        .map(|(c, r)| {
            json!([
                c.scope,
                c.key,
                c.claim_id,
                c.request_hash,
                r.status,
                r.body,
                c.now_ms
            ])
        })
        .collect();
    Value::Array(rows).to_string()
}

impl InboxTx {
    /// A batch's answers set apart: the claims of the keys whose receipts this transaction
    /// wrote (or noted) and hold them, and the answers whose keys an inbox row keeps. A held
    /// key's answer is its receipt's, which gives it back as the key's record.
    #[allow(clippy::type_complexity)]
    fn held_apart<'a>(
        &self,
        answers: &[(&'a Claim, &'a StoredResponse)],
    ) -> Result<(Vec<&'a Claim>, Vec<(&'a Claim, &'a StoredResponse)>), StoreError> {
        let mut held = Vec::new();
        let mut rows = Vec::new();
        for &(claim, response) in answers {
            match self.held_by_receipts.get(&claim.claim_id) {
                Some(receipt_id) if *response == issued_answer(receipt_id) => held.push(claim),
                Some(receipt_id) => {
                    return Err(StoreError(sqlx::Error::Protocol(format!(
                        "message {}: its receipt {receipt_id} holds its key, but its answer is \
                         not the receipt's",
                        claim.key
                    ))));
                }
                None => rows.push((claim, response)),
            }
        }
        Ok((held, rows))
    }

    /// Writes each key's row with its answer ([`SQLITE_INSERT_ANSWERED`] or
    /// [`POSTGRES_COMPLETE_MANY`]). How many rows it wrote.
    async fn write_answered(
        &mut self,
        answers: &[(&Claim, &StoredResponse)],
    ) -> Result<u64, StoreError> {
        Ok(match &mut self.tx {
            Either::Sqlite(tx) => sqlx::query(SQLITE_INSERT_ANSWERED)
                .bind(sqlite_answered_rows(answers))
                .execute(&mut **tx)
                .await?
                .rows_affected(),
            Either::Postgres(tx) => {
                let column = |f: fn(&Claim) -> &str| -> Vec<&str> {
                    answers.iter().map(|(claim, _)| f(claim)).collect()
                };
                sqlx::query(POSTGRES_COMPLETE_MANY)
                    .bind(column(|c| &c.scope))
                    .bind(column(|c| &c.key))
                    .bind(column(|c| &c.claim_id))
                    .bind(column(|c| &c.request_hash))
                    .bind(answers.iter().map(|(c, _)| c.now_ms).collect::<Vec<i64>>())
                    .bind(
                        answers
                            .iter()
                            .map(|(_, r)| i64::from(r.status))
                            .collect::<Vec<i64>>(),
                    )
                    .bind(
                        answers
                            .iter()
                            .map(|(_, r)| r.body.as_str())
                            .collect::<Vec<&str>>(),
                    )
                    .execute(&mut **tx)
                    .await?
                    .rows_affected()
            }
        })
    }

    /// The committed record of the key a claim did not take.
    async fn held(&mut self, claim: &Claim) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<KeyRow> = on_either!(&mut self.tx, tx => {
            sqlx::query_as(STORED_KEY)
                .bind(&claim.scope)
                .bind(&claim.key)
                .fetch_optional(&mut **tx)
                .await?
        });
        Ok(row.map(key_record))
    }

    /// Writes the message's receipt, holding its key ([`receipt_key`]).
    ///
    /// PostgreSQL, in a batch whose keys are claimed late: the receipt is only noted, and the
    /// late claim writes it, in one statement for the whole batch (a statement per receipt was
    /// a round trip each). Its id is then answered before it is written: were it refused, that
    /// statement fails, nothing of the batch commits, and the batch runs again with its claims
    /// first, each receipt written here at once.
    pub async fn issue(
        &mut self,
        receipt: &NewReceipt,
        claim: &Claim,
    ) -> Result<Issued, StoreError> {
        let receipt_id = receipt_id();
        let key = receipt_key(receipt, claim);
        if matches!(self.tx, Either::Postgres(_)) && self.claimed_first.is_none() {
            self.unwritten
                .push(receipt_id.clone(), receipt, key, claim.now_ms);
            self.note_held(key, claim, &receipt_id);
            return Ok(Issued::Receipt(receipt_id));
        }
        let inserted: Option<(String,)> = on_either!(&mut self.tx, tx => {
            insert_receipt!(&receipt_id, receipt, lines_json(receipt), claim.now_ms, key)
                .fetch_optional(&mut **tx)
                .await?
        });
        if inserted.is_some() {
            self.note_held(key, claim, &receipt_id);
            return Ok(Issued::Receipt(receipt_id));
        }
        if let Some(expired_before_ms) = self.claimed_first
            && key.is_some()
            && self.receipt_holds_key(claim, expired_before_ms).await?
        {
            return Ok(Issued::ClaimedMeanwhile);
        }
        Ok(Issued::Refused)
    }

    fn note_held(&mut self, key: Option<(&str, &str)>, claim: &Claim, receipt_id: &str) {
        if key.is_some() {
            self.held_by_receipts
                .insert(claim.claim_id.clone(), receipt_id.to_owned());
        }
    }

    /// Whether a live receipt holds the claim's key: committed after the claim found none.
    async fn receipt_holds_key(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<bool, StoreError> {
        let found: Option<(i64,)> = on_either!(&mut self.tx, tx => {
            sqlx::query_as(
                "SELECT issued_at FROM receipts \
                  WHERE event_id = $1 AND consumer = $2 AND issued_at >= $3",
            )
            .bind(&claim.key)
            .bind(&claim.scope)
            .bind(expired_before_ms)
            .fetch_optional(&mut **tx)
            .await?
        });
        Ok(found.is_some())
    }

    /// Writes the receipts still unwritten (PostgreSQL), in one statement: the late claim's, or
    /// any left at a commit.
    async fn write_unwritten(&mut self) -> Result<(), StoreError> {
        if let Either::Postgres(tx) = &mut self.tx
            && !self.unwritten.is_empty()
        {
            std::mem::take(&mut self.unwritten)
                .bind(sqlx::query(POSTGRES_INSERT_RECEIPTS))
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// The receipt already issued for this payment (or refund), for the reason of a refusal.
    pub async fn existing(&mut self, receipt: &NewReceipt) -> Result<Option<String>, StoreError> {
        let found: Option<(String,)> = on_either!(&mut self.tx, tx => {
            sqlx::query_as(
                "SELECT receipt_id FROM receipts \
                  WHERE (kind = 'income' AND $1 IS NULL AND payment_id = $2) OR refund_id = $1 \
                     OR event_id = $3",
            )
            .bind(receipt.refund_id.as_deref())
            .bind(receipt.payment_id.as_str())
            .bind(receipt.event_id.as_str())
            .fetch_optional(&mut **tx)
            .await?
        });
        Ok(found.map(|(id,)| id))
    }
}
