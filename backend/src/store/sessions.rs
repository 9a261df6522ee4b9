//! Checkout sessions: what a shop asks to be paid. One per (shop, order); taken by at most one
//! payment, guarded; closed when they lapse unpaid.

use super::row::{Arg, Row, RowError, Template};
use super::{Store, StoreError, Tx};

/// Inserts nothing when the order has a session already; the unique index decides.
pub const INSERT_SESSION: &str = "\
    INSERT INTO checkout_sessions (session_id, shop_account_id, order_id, amount, currency, \
                                   description, items, status, expires_at, created_at, return_url, \
                                   livemode) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'open', $8, $9, $10, \
            (SELECT livemode FROM accounts WHERE account_id = $2)) \
    ON CONFLICT (shop_account_id, order_id) DO NOTHING RETURNING session_id";

pub const SESSION_OF_ORDER: &str =
    "SELECT session_id FROM checkout_sessions WHERE shop_account_id = $1 AND order_id = $2";

/// A session with its shop's name and the origins that may frame its payment page: the public
/// view, the page, and what a payment decides on.
pub const SESSION: &str = "\
    SELECT s.session_id, s.shop_account_id, s.order_id, s.amount, s.currency, s.description, \
           s.items, s.status, s.payment_id, s.expires_at, s.return_url, sh.name AS shop_name, \
           sh.origins AS shop_origins, s.livemode \
      FROM checkout_sessions s JOIN shops sh ON sh.account_id = s.shop_account_id \
     WHERE s.session_id = $1";

/// The guarded step of a payment: an open, unexpired session becomes paid by this payment.
/// Touches no row otherwise, so a session is paid at most once (the unique index on
/// `payments.checkout_session_id` stands behind it).
pub const TAKE_SESSION: &str = "\
    UPDATE checkout_sessions SET status = 'paid', payment_id = $2 \
     WHERE session_id = $1 AND status = 'open' AND expires_at > $3 \
    RETURNING shop_account_id, order_id, amount, currency, livemode, items, description";

/// Undoes [`TAKE_SESSION`] inside the same transaction when the shopper cannot pay.
pub const RELEASE_SESSION: &str = "\
    UPDATE checkout_sessions SET status = 'open', payment_id = NULL \
     WHERE session_id = $1 AND payment_id = $2";

/// One bounded batch of sessions that lapsed unpaid ($2 at most) become `expired`; the caller
/// writes each one's event in the same transaction. The subquery skips sessions a payment (or
/// another instance's sweep) holds right now, and the outer `WHERE` checks again what it
/// picked: under READ COMMITTED a row the sweep waited for is re-read against that alone, and
/// a session paid meanwhile must stay paid, with no `expired` event.
pub static EXPIRE_SESSIONS: Template = Template::new(
    "UPDATE checkout_sessions SET status = 'expired' \
      WHERE session_id IN (SELECT session_id FROM checkout_sessions \
                            WHERE status = 'open' AND expires_at < $1 \
                            ORDER BY expires_at LIMIT $2{skip_locked}) \
        AND status = 'open' AND expires_at < $1 \
     RETURNING session_id, shop_account_id, order_id, amount, currency, expires_at, livemode",
);

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
    pub return_url: Option<String>,
    /// The origins whose pages may frame the payment page (its shop's).
    pub shop_origins: Vec<String>,
    pub livemode: bool,
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
            return_url: row.opt_text("return_url")?,
            shop_origins: serde_json::from_str(&row.text("shop_origins")?)?,
            livemode: row.int("livemode")? == 1,
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
    pub return_url: Option<&'a str>,
}

/// What [`Tx::take_session`] took: the session's terms, as its shop set them.
#[derive(Clone, Debug)]
pub struct TakenSession {
    pub shop_account_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    /// Test or live money: only a shopper of the same mode pays it.
    pub livemode: bool,
    /// The lines as the shop set them (JSON), for the payment's event: a receipt lists them.
    pub items: String,
    pub description: Option<String>,
}

impl TakenSession {
    /// The columns [`TAKE_SESSION`] returns (and the payment's composed change, after it).
    pub(super) fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(TakenSession {
            shop_account_id: row.text("shop_account_id")?,
            order_id: row.text("order_id")?,
            amount: row.int("amount")?,
            currency: row.text("currency")?,
            livemode: row.int("livemode")? == 1,
            items: row.text("items")?,
            description: row.opt_text("description")?,
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
    pub livemode: bool,
}

impl Store {
    /// A checkout session with its shop's name.
    pub async fn session(&self, session_id: &str) -> Result<Option<SessionRow>, StoreError> {
        let rows = self
            .read(SESSION, &[Arg::Text(session_id)], SessionRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }
}

impl Tx {
    /// `false` when the order has a session already (the unique index decided).
    pub async fn insert_session(&mut self, session: &NewSession<'_>) -> Result<bool, StoreError> {
        let inserted = self
            .fetch_optional(
                INSERT_SESSION,
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
                    Arg::OptText(session.return_url),
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
            SESSION_OF_ORDER,
            &[Arg::Text(shop_account_id), Arg::Text(order_id)],
            |row| row.text("session_id"),
        )
        .await
    }

    pub async fn session(&mut self, session_id: &str) -> Result<Option<SessionRow>, StoreError> {
        self.fetch_optional(SESSION, &[Arg::Text(session_id)], SessionRow::read)
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
            TAKE_SESSION,
            &[
                Arg::Text(session_id),
                Arg::Text(payment_id),
                Arg::Int(now_ms),
            ],
            TakenSession::read,
        )
        .await
    }

    pub async fn release_session(
        &mut self,
        session_id: &str,
        payment_id: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            RELEASE_SESSION,
            &[Arg::Text(session_id), Arg::Text(payment_id)],
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
        let statement = self.template(&EXPIRE_SESSIONS);
        self.fetch_all(statement, &[Arg::Int(now_ms), Arg::Int(batch)], |row| {
            Ok(ExpiredSession {
                session_id: row.text("session_id")?,
                shop_account_id: row.text("shop_account_id")?,
                order_id: row.text("order_id")?,
                amount: row.int("amount")?,
                currency: row.text("currency")?,
                expires_at: row.int("expires_at")?,
                livemode: row.int("livemode")? == 1,
            })
        })
        .await
    }
}
