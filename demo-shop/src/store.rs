//! The shop's own SQLite database: its orders and its refunds. Every SQL statement of the shop
//! is here.

use std::str::FromStr;
use std::time::Duration;

use checkout_idempotency::{
    Claim, Claimed, Classify, Failure, Finish, KeyRecord, KeyStore, KeyTx, StoredResponse, Work,
};
use checkout_shared::LineItem;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{FromRow, SqlitePool};

#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderState {
    AwaitingPayment,
    Paid,
    /// Unpaid, and its checkout session lapsed: it can no longer be paid.
    Expired,
}

#[derive(Clone, Debug)]
pub struct Order {
    pub id: String,
    pub items: Vec<LineItem>,
    pub amount: i64,
    pub session_key: String,
    pub checkout_session_id: Option<String>,
    pub state: OrderState,
    pub payment_id: Option<String>,
    pub refunded: i64,
    pub created_at: i64,
    /// `page` or `webhook`: how the shop first learned it was paid.
    pub paid_via: Option<String>,
    /// The loyalty bonus for the order, in points.
    pub bonus: Option<i64>,
}

#[derive(FromRow)]
struct OrderRow {
    id: String,
    items: String,
    amount: i64,
    session_key: String,
    checkout_session_id: Option<String>,
    state: String,
    payment_id: Option<String>,
    refunded: i64,
    created_at: i64,
    paid_via: Option<String>,
    bonus: Option<i64>,
    session_expired_at: Option<i64>,
}

impl From<OrderRow> for Order {
    fn from(row: OrderRow) -> Order {
        Order {
            id: row.id,
            items: serde_json::from_str(&row.items).unwrap_or_default(),
            amount: row.amount,
            session_key: row.session_key,
            checkout_session_id: row.checkout_session_id,
            state: match (row.state.as_str(), row.session_expired_at) {
                ("paid", _) => OrderState::Paid,
                (_, Some(_)) => OrderState::Expired,
                _ => OrderState::AwaitingPayment,
            },
            payment_id: row.payment_id,
            refunded: row.refunded,
            created_at: row.created_at,
            paid_via: row.paid_via,
            bonus: row.bonus,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefundState {
    Pending,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug)]
pub struct RefundRequest {
    pub idempotency_key: String,
    pub order_id: String,
    pub amount: i64,
    pub state: RefundState,
    pub refund_id: Option<String>,
    pub failure: Option<String>,
    pub created_at: i64,
}

#[derive(FromRow)]
struct RefundRow {
    idempotency_key: String,
    order_id: String,
    amount: i64,
    state: String,
    refund_id: Option<String>,
    failure: Option<String>,
    created_at: i64,
}

impl From<RefundRow> for RefundRequest {
    fn from(row: RefundRow) -> RefundRequest {
        RefundRequest {
            idempotency_key: row.idempotency_key,
            order_id: row.order_id,
            amount: row.amount,
            state: match row.state.as_str() {
                "succeeded" => RefundState::Succeeded,
                "failed" => RefundState::Failed,
                _ => RefundState::Pending,
            },
            refund_id: row.refund_id,
            failure: row.failure,
            created_at: row.created_at,
        }
    }
}

pub struct NewOrder<'a> {
    pub id: &'a str,
    pub cart_token: &'a str,
    pub items: &'a [LineItem],
    pub amount: i64,
    pub session_key: &'a str,
    pub now_ms: i64,
}

const ORDER_COLUMNS: &str = "id, items, amount, session_key, checkout_session_id, state, \
    payment_id, refunded, created_at, paid_via, session_expired_at, \
    (SELECT points FROM bonuses b WHERE b.order_id = orders.id) AS bonus";
const REFUND_COLUMNS: &str =
    "idempotency_key, order_id, amount, state, refund_id, failure, created_at";

impl Store {
    pub async fn open(url: &str) -> Result<Store, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store { pool })
    }

    /// The order of this cart form: made on its first submission, found on any other.
    pub async fn place_order(&self, new: NewOrder<'_>) -> Result<Order, sqlx::Error> {
        let items = serde_json::to_string(new.items).expect("items serialize");
        sqlx::query(
            "INSERT INTO orders (id, cart_token, items, amount, session_key, created_at)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (cart_token) DO NOTHING",
        )
        .bind(new.id)
        .bind(new.cart_token)
        .bind(items)
        .bind(new.amount)
        .bind(new.session_key)
        .bind(new.now_ms)
        .execute(&self.pool)
        .await?;
        let row: OrderRow = sqlx::query_as(&format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE cart_token = $1"
        ))
        .bind(new.cart_token)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.into())
    }

    pub async fn order(&self, id: &str) -> Result<Option<Order>, sqlx::Error> {
        let row: Option<OrderRow> =
            sqlx::query_as(&format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1"))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(Order::from))
    }

    /// The latest orders, newest first.
    pub async fn orders(&self, limit: i64) -> Result<Vec<Order>, sqlx::Error> {
        let rows: Vec<OrderRow> = sqlx::query_as(&format!(
            "SELECT {ORDER_COLUMNS} FROM orders ORDER BY created_at DESC, id LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(Order::from).collect())
    }

    /// Records the order's checkout session; the first one recorded stays (the checkout gives
    /// one session per order anyway).
    pub async fn set_session(&self, order_id: &str, session_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE orders SET checkout_session_id = $1
             WHERE id = $2 AND checkout_session_id IS NULL",
        )
        .bind(session_id)
        .bind(order_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Marks the order paid by `payment_id`; `false` if it already was.
    pub async fn mark_paid(
        &self,
        order_id: &str,
        payment_id: &str,
        now_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE orders SET state = 'paid', payment_id = $1, paid_at = $2, paid_via = 'page'
             WHERE id = $3 AND state = 'awaiting_payment'",
        )
        .bind(payment_id)
        .bind(now_ms)
        .bind(order_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// What the checkout says was refunded so far; it only grows.
    pub async fn set_refunded(&self, order_id: &str, refunded: i64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE orders SET refunded = MAX(refunded, $1) WHERE id = $2")
            .bind(refunded)
            .bind(order_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The refund asked for under `key`: recorded on its first submission, found on any other
    /// (then with the amount and order it was first asked with). `None`: a new key for an order
    /// whose earlier refund still waits for the checkout's answer (that one is settled first,
    /// with its own key, never replaced by a second refund).
    pub async fn claim_refund(
        &self,
        key: &str,
        order_id: &str,
        amount: i64,
        now_ms: i64,
    ) -> Result<Option<RefundRequest>, sqlx::Error> {
        sqlx::query(
            "INSERT INTO refunds (idempotency_key, order_id, amount, created_at)
             SELECT $1, $2, $3, $4
              WHERE NOT EXISTS (SELECT 1 FROM refunds
                                 WHERE order_id = $2 AND state = 'pending' AND idempotency_key <> $1)
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(order_id)
        .bind(amount)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        let row: Option<RefundRow> = sqlx::query_as(&format!(
            "SELECT {REFUND_COLUMNS} FROM refunds WHERE idempotency_key = $1"
        ))
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Into::into))
    }

    /// Refunds that still wait for the checkout's answer, by order (at most one each).
    pub async fn pending_refunds(&self) -> Result<Vec<RefundRequest>, sqlx::Error> {
        let rows: Vec<RefundRow> = sqlx::query_as(&format!(
            "SELECT {REFUND_COLUMNS} FROM refunds WHERE state = 'pending' ORDER BY created_at"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(RefundRequest::from).collect())
    }

    // -- staff sign-ins ------------------------------------------------------------------------

    /// The CSRF token of a live sign-in with this token hash.
    pub async fn staff_session(
        &self,
        token_hash: &str,
        now_ms: i64,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT csrf FROM staff_sessions WHERE token_hash = $1 AND expires_at > $2",
        )
        .bind(token_hash)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await
    }

    pub async fn open_staff_session(
        &self,
        token_hash: &str,
        csrf: &str,
        now_ms: i64,
        expires_at: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM staff_sessions WHERE expires_at <= $1")
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO staff_sessions (token_hash, csrf, created_at, expires_at)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(token_hash)
        .bind(csrf)
        .bind(now_ms)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn close_staff_session(&self, token_hash: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM staff_sessions WHERE token_hash = $1")
            .bind(token_hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn refund_succeeded(&self, key: &str, refund_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE refunds SET state = 'succeeded', refund_id = $1, failure = NULL
             WHERE idempotency_key = $2",
        )
        .bind(refund_id)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn refund_failed(&self, key: &str, failure: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE refunds SET state = 'failed', failure = $1
             WHERE idempotency_key = $2 AND state = 'pending'",
        )
        .bind(failure)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The latest refund requests, newest first.
    pub async fn refunds(&self, limit: i64) -> Result<Vec<RefundRequest>, sqlx::Error> {
        let rows: Vec<RefundRow> = sqlx::query_as(&format!(
            "SELECT {REFUND_COLUMNS} FROM refunds ORDER BY created_at DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(RefundRequest::from).collect())
    }
}

// -- the inbox: the idempotency protocol's keys, in the shop's own database ---------------------

/// What the inbox has recorded, for the back office.
#[derive(Clone, Debug)]
pub struct InboxEntry {
    pub webhook_id: String,
    /// The event, as canonical JSON.
    pub event: Option<String>,
    pub created_at: i64,
}

impl Store {
    /// The protocol's view of this database: where the inbox's keys live, beside the orders.
    pub fn inbox(&self) -> InboxStore {
        InboxStore {
            pool: self.pool.clone(),
        }
    }

    /// The latest events received, newest first.
    pub async fn inbox_entries(&self, limit: i64) -> Result<Vec<InboxEntry>, sqlx::Error> {
        let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(
            "SELECT webhook_id, request_body, created_at FROM inbox
             WHERE status = 'done' ORDER BY created_at DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(webhook_id, event, created_at)| InboxEntry {
                webhook_id,
                event,
                created_at,
            })
            .collect())
    }
}

/// The shop's database as [`checkout_idempotency::KeyStore`]: one transaction per event, begun
/// `IMMEDIATE` (SQLite takes its write lock at once, so a claim never deadlocks). A sqlx
/// transaction, so that a request dropped midway (its sender gave up) rolls back, never leaving
/// a pooled connection inside an open transaction whose later writes would never commit.
#[derive(Clone, Debug)]
pub struct InboxStore {
    pool: SqlitePool,
}

/// One transaction of the inbox: the claim, the effect on orders and bonuses, the record.
pub struct InboxTx {
    conn: sqlx::Transaction<'static, sqlx::Sqlite>,
}

#[derive(Debug, thiserror::Error)]
#[error("the shop's database: {0}")]
pub struct InboxError(#[from] sqlx::Error);

impl Classify for InboxError {
    fn failure(&self) -> Failure {
        match &self.0 {
            sqlx::Error::Database(e) if e.message().contains("locked") => Failure::Busy,
            _ => Failure::Fatal,
        }
    }
}

type KeyRow = (
    String,
    Option<String>,
    String,
    Option<i64>,
    Option<String>,
    i64,
);

fn key_record(
    (request_hash, request_body, status, response_status, response_body, created_at): KeyRow,
) -> KeyRecord {
    let response = StoredResponse::from_columns(&status, response_status, response_body);
    KeyRecord {
        request_hash,
        request_body,
        response,
        created_at_ms: created_at,
    }
}

const STORED_KEY: &str =
    "SELECT request_hash, request_body, status, response_status, response_body, created_at
     FROM inbox WHERE sender = $1 AND webhook_id = $2";

impl KeyStore for InboxStore {
    type Tx = InboxTx;
    type Error = InboxError;

    async fn stored_key(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, InboxError> {
        let row: Option<KeyRow> = sqlx::query_as(STORED_KEY)
            .bind(scope)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(key_record))
    }

    async fn transaction<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<InboxTx>,
    {
        let conn = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(InboxError::from)?;
        let mut tx = InboxTx { conn };
        let finished = work.run(&mut tx).await;
        match &finished {
            Ok(Finish::Commit(_)) => tx.conn.commit().await.map_err(InboxError::from)?,
            _ => tx.conn.rollback().await.map_err(InboxError::from)?,
        }
        match finished? {
            Finish::Commit(output) | Finish::Rollback(output) => Ok(output),
        }
    }
}

impl KeyTx for InboxTx {
    type Error = InboxError;

    async fn claim(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<Claimed, InboxError> {
        let claimed: Option<(String,)> = sqlx::query_as(
            "INSERT INTO inbox (sender, webhook_id, claim_id, request_hash, request_body, status, created_at)
             VALUES ($1, $2, $3, $4, $5, 'in_progress', $6)
             ON CONFLICT (sender, webhook_id) DO UPDATE
                SET claim_id = excluded.claim_id, request_hash = excluded.request_hash,
                    request_body = excluded.request_body, status = 'in_progress',
                    response_status = NULL, response_body = NULL, created_at = excluded.created_at
              WHERE inbox.created_at < $7
             RETURNING claim_id",
        )
        .bind(&claim.scope)
        .bind(&claim.key)
        .bind(&claim.claim_id)
        .bind(&claim.request_hash)
        .bind(&claim.request_body)
        .bind(claim.now_ms)
        .bind(expired_before_ms)
        .fetch_optional(&mut *self.conn)
        .await?;
        if claimed.is_some() {
            return Ok(Claimed::Ours);
        }
        // SQLite: this transaction holds the only writer, so the holder is read as committed.
        let row: Option<KeyRow> = sqlx::query_as(STORED_KEY)
            .bind(&claim.scope)
            .bind(&claim.key)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(Claimed::Taken(row.map(key_record)))
    }

    async fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> Result<(), InboxError> {
        let done = sqlx::query(
            "UPDATE inbox SET status = 'done', response_status = $4, response_body = $5
             WHERE sender = $1 AND webhook_id = $2 AND claim_id = $3",
        )
        .bind(&claim.scope)
        .bind(&claim.key)
        .bind(&claim.claim_id)
        .bind(i64::from(response.status))
        .bind(&response.body)
        .execute(&mut *self.conn)
        .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(InboxError(sqlx::Error::RowNotFound))
        }
    }
}

impl InboxTx {
    /// The order is paid by `payment_id`, learned from the checkout's event; `false` if the
    /// shop already knew (from its page, or an earlier event).
    pub async fn order_paid(
        &mut self,
        order_id: &str,
        payment_id: &str,
        amount: i64,
        now_ms: i64,
    ) -> Result<bool, InboxError> {
        let done = sqlx::query(
            "UPDATE orders SET state = 'paid', payment_id = $1, paid_at = $2, paid_via = 'webhook'
             WHERE id = $3 AND state = 'awaiting_payment' AND amount = $4",
        )
        .bind(payment_id)
        .bind(now_ms)
        .bind(order_id)
        .bind(amount)
        .execute(&mut *self.conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The order's checkout session lapsed unpaid. `false` if it was paid (or told) already.
    pub async fn order_session_expired(
        &mut self,
        order_id: &str,
        now_ms: i64,
    ) -> Result<bool, InboxError> {
        let done = sqlx::query(
            "UPDATE orders SET session_expired_at = $1
             WHERE id = $2 AND state = 'awaiting_payment' AND session_expired_at IS NULL",
        )
        .bind(now_ms)
        .bind(order_id)
        .execute(&mut *self.conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// What was refunded of the order, as the checkout's event says (it only grows).
    /// The checkout says it made a refund of `amount` for the order: a refund request of this
    /// amount still waiting for its answer (the answer was lost) is that one, settled now.
    pub async fn settle_pending_refund(
        &mut self,
        order_id: &str,
        amount: i64,
        refund_id: &str,
    ) -> Result<bool, InboxError> {
        let done = sqlx::query(
            "UPDATE refunds SET state = 'succeeded', refund_id = $1, failure = NULL
             WHERE idempotency_key = (SELECT idempotency_key FROM refunds
                                       WHERE order_id = $2 AND amount = $3 AND state = 'pending'
                                       ORDER BY created_at LIMIT 1)
               AND NOT EXISTS (SELECT 1 FROM refunds WHERE refund_id = $1)",
        )
        .bind(refund_id)
        .bind(order_id)
        .bind(amount)
        .execute(&mut *self.conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The order's refunded total as a refund's event `sequence` left it; `false` when an event
    /// of the payment at least as new was applied already (the totals stay as they are).
    pub async fn order_refunded(
        &mut self,
        order_id: &str,
        refunded: i64,
        sequence: i64,
    ) -> Result<bool, InboxError> {
        // An event without a sequence (written before the checkout sent one): the total only
        // grows, so the larger one is the newer.
        if sequence == 0 {
            sqlx::query(
                "UPDATE orders SET refunded = MAX(refunded, $1) WHERE id = $2 AND refunded <= amount",
            )
            .bind(refunded)
            .bind(order_id)
            .execute(&mut *self.conn)
            .await?;
            return Ok(true);
        }
        let done = sqlx::query(
            "UPDATE orders SET refunded = $1, payment_sequence = $3
             WHERE id = $2 AND payment_sequence < $3 AND $1 <= amount",
        )
        .bind(refunded)
        .bind(order_id)
        .bind(sequence)
        .execute(&mut *self.conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The order's payment events up to `sequence` are applied (it never goes back).
    pub async fn payment_sequence_seen(
        &mut self,
        order_id: &str,
        sequence: i64,
    ) -> Result<(), InboxError> {
        sqlx::query("UPDATE orders SET payment_sequence = MAX(payment_sequence, $1) WHERE id = $2")
            .bind(sequence)
            .bind(order_id)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    /// Writes the order's bonus from what is paid and not refunded: a state, not an increment.
    pub async fn set_bonus(
        &mut self,
        order_id: &str,
        roubles_per_point: i64,
        now_ms: i64,
    ) -> Result<(), InboxError> {
        sqlx::query(
            "INSERT INTO bonuses (order_id, points, updated_at)
             SELECT id, (amount - refunded) / 100 / $2, $3 FROM orders WHERE id = $1 AND state = 'paid'
             ON CONFLICT (order_id) DO UPDATE SET points = excluded.points, updated_at = excluded.updated_at",
        )
        .bind(order_id)
        .bind(roubles_per_point)
        .bind(now_ms)
        .execute(&mut *self.conn)
        .await?;
        Ok(())
    }
}
