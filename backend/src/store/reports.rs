//! What a shop's dashboard reads, and nothing writes: its payments searched, a payment's ledger
//! rows and events, each event's delivery attempts, and the days' totals for its charts. Every
//! read is bounded by an index on the shop's account (see migration 0015), so a page costs what
//! its rows cost, not what the shop's history costs.

use super::row::{Arg, Row, RowError};
use super::{EventRow, Store, StoreError};

/// A page of a shop's payments, newest first, after the cursor ($7, $8: the last row's time
/// and id), filtered: `$match` on the text ($2), an amount ($3, 0 for any), a time range
/// [$4, $5), a state ($6: '', `paid`, `partially_refunded`, `refunded`).
macro_rules! search_payments {
    ($match:literal) => {
        concat!(
            "SELECT payment_id, order_id, amount, refunded, currency, created_at, livemode \
               FROM payments \
              WHERE shop_account_id = $1 AND ",
            $match,
            " AND ($3 = 0 OR amount = $3) \
                AND created_at >= $4 AND created_at < $5 \
                AND ($6 = '' OR ($6 = 'paid' AND refunded = 0) \
                     OR ($6 = 'partially_refunded' AND refunded > 0 AND refunded < amount) \
                     OR ($6 = 'refunded' AND refunded = amount)) \
                AND (created_at < $7 OR (created_at = $7 AND payment_id < $8)) \
              ORDER BY created_at DESC, payment_id DESC LIMIT $9"
        )
    };
}
// An id is looked up by its key, an order id by the shop's index: no `OR` that would leave the
// planner neither.
const SEARCH_PAYMENTS: &str = search_payments!("$2 = ''");
const SEARCH_PAYMENTS_BY_ID: &str = search_payments!("payment_id = $2");
const SEARCH_PAYMENTS_BY_ORDER: &str = search_payments!("order_id = $2");

/// A payment's ledger rows: its transfer's two and each refund's two, in the order written.
const PAYMENT_LEDGER: &str = "\
    SELECT l.entry_id, l.account_id, a.kind AS account_kind, l.amount, l.kind, l.refund_id, \
           l.created_at \
      FROM ledger l JOIN accounts a ON a.account_id = l.account_id \
     WHERE l.payment_id = $1 ORDER BY l.entry_id";

/// A shop's events of one subject (a payment and its refunds), in their order.
const SUBJECT_EVENTS: &str = "\
    SELECT event_id, seq, shop_account_id, type, subject_id, body, created_at, status, attempts, \
           next_attempt_at, last_error, delivered_at, lease_id \
      FROM webhook_events WHERE subject_id = $1 AND shop_account_id = $2 ORDER BY seq";

/// An event's delivery attempts, in the order they were made.
const EVENT_ATTEMPTS: &str = "\
    SELECT attempt, url, at, status, latency_ms, excerpt FROM delivery_attempts \
     WHERE event_id = $1 ORDER BY at, attempt";

/// A shop's payments per day since $2 (ms, a day's start), day 0 first: count and sum.
const PAYMENTS_PER_DAY: &str = "\
    SELECT (created_at - $2) / 86400000 AS day, COUNT(*) AS count, CAST(SUM(amount) AS BIGINT) AS total \
      FROM payments WHERE shop_account_id = $1 AND created_at >= $2 \
     GROUP BY (created_at - $2) / 86400000";

/// The same for refunds of the shop's payments.
const REFUNDS_PER_DAY: &str = "\
    SELECT (r.created_at - $2) / 86400000 AS day, COUNT(*) AS count, CAST(SUM(r.amount) AS BIGINT) AS total \
      FROM refunds r JOIN payments p ON p.payment_id = r.payment_id \
     WHERE p.shop_account_id = $1 AND r.created_at >= $2 \
     GROUP BY (r.created_at - $2) / 86400000";

/// Delivery attempts to a shop's endpoints since $2, per day: how many, how many answered 2xx.
const ATTEMPTS_PER_DAY: &str = "\
    SELECT (at - $2) / 86400000 AS day, COUNT(*) AS count, \
           CAST(SUM(CASE WHEN status >= 200 AND status < 300 THEN 1 ELSE 0 END) AS BIGINT) AS total \
      FROM delivery_attempts WHERE shop_account_id = $1 AND at >= $2 \
     GROUP BY (at - $2) / 86400000";

/// A payment as its shop's list shows it.
#[derive(Clone, Debug)]
pub struct PaymentLine {
    pub payment_id: String,
    pub order_id: String,
    pub amount: i64,
    pub refunded: i64,
    pub currency: String,
    pub created_at: i64,
    pub livemode: bool,
}

/// What a shop looks for among its payments.
#[derive(Clone, Debug, Default)]
pub struct PaymentSearch {
    /// An exact order id, or a payment id (`pay_…`); empty: any.
    pub text: String,
    /// Kopecks; 0: any.
    pub amount: i64,
    pub from_ms: i64,
    pub until_ms: i64,
    /// `paid`, `partially_refunded`, `refunded`; empty: any.
    pub state: String,
    /// Rows older than this (time, id): the next page.
    pub before: Option<(i64, String)>,
    pub limit: i64,
}

/// One ledger row of a payment.
#[derive(Clone, Debug)]
pub struct LedgerLine {
    pub entry_id: i64,
    pub account_id: String,
    /// `shopper` or `shop`.
    pub account_kind: String,
    pub amount: i64,
    pub kind: String,
    pub refund_id: Option<String>,
    pub created_at: i64,
}

/// One delivery attempt of an event.
#[derive(Clone, Debug)]
pub struct AttemptLine {
    pub attempt: i64,
    pub url: String,
    pub at: i64,
    pub status: Option<i64>,
    pub latency_ms: i64,
    pub excerpt: String,
}

/// A day's count and total (kopecks; for attempts: how many succeeded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Day {
    pub count: i64,
    pub total: i64,
}

impl Store {
    pub async fn search_payments(
        &self,
        shop_account_id: &str,
        search: &PaymentSearch,
    ) -> Result<Vec<PaymentLine>, StoreError> {
        let sql = match (search.text.is_empty(), search.text.starts_with("pay_")) {
            (true, _) => SEARCH_PAYMENTS,
            (false, true) => SEARCH_PAYMENTS_BY_ID,
            (false, false) => SEARCH_PAYMENTS_BY_ORDER,
        };
        let (before_at, before_id) = search
            .before
            .clone()
            .unwrap_or((i64::MAX, String::from("~")));
        self.read(
            sql,
            &[
                Arg::Text(shop_account_id),
                Arg::Text(&search.text),
                Arg::Int(search.amount),
                Arg::Int(search.from_ms),
                Arg::Int(search.until_ms),
                Arg::Text(&search.state),
                Arg::Int(before_at),
                Arg::Text(&before_id),
                Arg::Int(search.limit),
            ],
            |row| {
                Ok(PaymentLine {
                    payment_id: row.text("payment_id")?,
                    order_id: row.text("order_id")?,
                    amount: row.int("amount")?,
                    refunded: row.int("refunded")?,
                    currency: row.text("currency")?,
                    created_at: row.int("created_at")?,
                    livemode: row.int("livemode")? == 1,
                })
            },
        )
        .await
    }

    pub async fn payment_ledger(&self, payment_id: &str) -> Result<Vec<LedgerLine>, StoreError> {
        self.read(PAYMENT_LEDGER, &[Arg::Text(payment_id)], |row| {
            Ok(LedgerLine {
                entry_id: row.int("entry_id")?,
                account_id: row.text("account_id")?,
                account_kind: row.text("account_kind")?,
                amount: row.int("amount")?,
                kind: row.text("kind")?,
                refund_id: row.opt_text("refund_id")?,
                created_at: row.int("created_at")?,
            })
        })
        .await
    }

    pub async fn subject_events(
        &self,
        subject_id: &str,
        shop_account_id: &str,
    ) -> Result<Vec<EventRow>, StoreError> {
        self.read(
            SUBJECT_EVENTS,
            &[Arg::Text(subject_id), Arg::Text(shop_account_id)],
            EventRow::read,
        )
        .await
    }

    pub async fn event_attempts(&self, event_id: &str) -> Result<Vec<AttemptLine>, StoreError> {
        self.read(EVENT_ATTEMPTS, &[Arg::Text(event_id)], |row| {
            Ok(AttemptLine {
                attempt: row.int("attempt")?,
                url: row.text("url")?,
                at: row.int("at")?,
                status: Some(row.int("status")?).filter(|s| *s != 0),
                latency_ms: row.int("latency_ms")?,
                excerpt: row.text("excerpt")?,
            })
        })
        .await
    }

    /// `days` days from `since_ms` (a day's start): payments, refunds and delivery attempts of
    /// the shop's account, each day's count and total.
    pub async fn days(
        &self,
        shop_account_id: &str,
        since_ms: i64,
        days: usize,
    ) -> Result<[Vec<Day>; 3], StoreError> {
        let mut series = [
            vec![Day::default(); days],
            vec![Day::default(); days],
            vec![Day::default(); days],
        ];
        for (i, sql) in [PAYMENTS_PER_DAY, REFUNDS_PER_DAY, ATTEMPTS_PER_DAY]
            .into_iter()
            .enumerate()
        {
            let rows = self
                .read(
                    sql,
                    &[Arg::Text(shop_account_id), Arg::Int(since_ms)],
                    read_day,
                )
                .await?;
            for (day, value) in rows {
                if let Some(slot) = usize::try_from(day).ok().and_then(|d| series[i].get_mut(d)) {
                    *slot = value;
                }
            }
        }
        Ok(series)
    }
}

fn read_day(row: &dyn Row) -> Result<(i64, Day), RowError> {
    Ok((
        row.int("day")?,
        Day {
            count: row.int("count")?,
            total: row.opt_int("total")?.unwrap_or(0),
        },
    ))
}
