//! Payments and refunds, and the ledger that records every movement of money in double entry:
//! the guarded debit, the credit, the shop's credits that wait beside its balance row (so that
//! payments to one shop never queue on it) and their folding in at a refund.

use checkout_idempotency::Claim;

use super::row::{Arg, Row, RowError};
use super::{Store, StoreError, Tx};

/// The guarded debit: touches no row when the balance is short, so it never goes negative.
pub const DEBIT: &str = "\
    UPDATE accounts SET balance = balance - $2 \
     WHERE account_id = $1 AND balance >= $2 RETURNING balance";

pub const CREDIT: &str =
    "UPDATE accounts SET balance = balance + $2 WHERE account_id = $1 RETURNING balance";

/// A shop's credit that waits to be folded into its balance (see the migration).
pub const INSERT_UNFOLDED_CREDIT: &str =
    "INSERT INTO unfolded_credits (payment_id, account_id, amount) VALUES ($1, $2, $3)";

pub const INSERT_LEDGER: &str = "\
    INSERT INTO ledger \
           (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Folds a shop's waiting credits into its balance. SQLite has one writer, so nothing can
/// commit a credit between this and [`SQLITE_DELETE_FOLDED`] in the same transaction.
pub const SQLITE_FOLD_CREDITS: &str = "\
    UPDATE accounts SET balance = balance + \
           COALESCE((SELECT SUM(amount) FROM unfolded_credits WHERE account_id = $1), 0) \
     WHERE account_id = $1 RETURNING balance";
pub const SQLITE_DELETE_FOLDED: &str = "DELETE FROM unfolded_credits WHERE account_id = $1";

/// Folds a shop's waiting credits into its balance under the row's lock: the credits deleted
/// are exactly the credits added, in one statement (two would let a credit committed in between
/// be deleted unadded). Returns the new balance.
pub const POSTGRES_FOLD_CREDITS: &str = "\
    WITH folded AS (DELETE FROM unfolded_credits WHERE account_id = $1 RETURNING amount) \
    UPDATE accounts SET balance = balance + COALESCE((SELECT SUM(amount) FROM folded), 0) \
     WHERE account_id = $1 RETURNING balance";

/// Inserts nothing when the session was paid meanwhile; the unique index decides.
pub const INSERT_PAYMENT: &str = "\
    INSERT INTO payments (payment_id, checkout_session_id, shopper_account_id, shop_account_id, \
                          order_id, amount, currency, balance_after, idempotency_key, created_at, \
                          livemode) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
            (SELECT livemode FROM checkout_sessions WHERE session_id = $2)) \
    ON CONFLICT (checkout_session_id) DO NOTHING";

/// A payment as its shop sees it (refunds are the shop's).
pub const PAYMENT_OF_SHOP: &str = "\
    SELECT payment_id, checkout_session_id, shopper_account_id, shop_account_id, order_id, \
           amount, currency, balance_after, created_at, refunded, livemode \
      FROM payments WHERE payment_id = $1 AND shop_account_id = $2";

/// The guarded refund: touches no row when it would refund more than remains (or the payment
/// is not this shop's).
pub const ADD_REFUNDED: &str = "\
    UPDATE payments SET refunded = refunded + $3 \
     WHERE payment_id = $1 AND shop_account_id = $2 AND refunded + $3 <= amount \
    RETURNING refunded, shopper_account_id, order_id, currency";

/// Undoes [`ADD_REFUNDED`] inside the same transaction when the shop cannot fund the refund.
pub const UNDO_REFUNDED: &str = "\
    UPDATE payments SET refunded = refunded - $3 WHERE payment_id = $1 AND shop_account_id = $2";

pub const INSERT_REFUND: &str = "\
    INSERT INTO refunds (refund_id, payment_id, amount, refunded_total_after, balance_after, \
                         idempotency_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// The payment and its refunds in one statement (one snapshot), for either party to it.
/// `refunded_total_after` grows with every refund, so it orders them as they happened.
pub const PAYMENT_WITH_REFUNDS: &str = "\
    SELECT p.payment_id, p.checkout_session_id, p.shopper_account_id, p.shop_account_id, \
           p.order_id, p.amount, p.currency, p.balance_after, p.created_at, p.refunded, p.livemode, \
           r.refund_id, r.amount AS refund_amount, r.refunded_total_after, \
           r.balance_after AS refund_balance_after, r.created_at AS refund_created_at \
      FROM payments p LEFT JOIN refunds r ON r.payment_id = p.payment_id \
     WHERE p.payment_id = $1 AND (p.shopper_account_id = $2 OR p.shop_account_id = $2) \
     ORDER BY r.refunded_total_after";

#[derive(Clone, Copy, Debug)]
pub enum EntryKind {
    Opening,
    Payment,
    Refund,
    Deposit,
}

impl EntryKind {
    fn as_str(self) -> &'static str {
        match self {
            EntryKind::Opening => "opening",
            EntryKind::Payment => "payment",
            EntryKind::Refund => "refund",
            EntryKind::Deposit => "deposit",
        }
    }
}

#[derive(Clone, Debug)]
pub struct LedgerEntry<'a> {
    pub account_id: &'a str,
    /// Signed kopecks: a debit is negative.
    pub amount: i64,
    pub kind: EntryKind,
    pub claim: Option<&'a Claim>,
    pub payment_id: Option<&'a str>,
    pub refund_id: Option<&'a str>,
    pub created_at: i64,
}

#[derive(Clone, Debug)]
pub struct PaymentRow {
    pub payment_id: String,
    pub checkout_session_id: Option<String>,
    pub shopper_account_id: String,
    pub shop_account_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    /// The shopper's balance right after the payment.
    pub balance_after: i64,
    pub created_at: i64,
    pub refunded: i64,
    pub livemode: bool,
}

impl PaymentRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(PaymentRow {
            payment_id: row.text("payment_id")?,
            checkout_session_id: row.opt_text("checkout_session_id")?,
            shopper_account_id: row.text("shopper_account_id")?,
            shop_account_id: row.text("shop_account_id")?,
            order_id: row.text("order_id")?,
            amount: row.int("amount")?,
            currency: row.text("currency")?,
            balance_after: row.int("balance_after")?,
            created_at: row.int("created_at")?,
            refunded: row.int("refunded")?,
            livemode: row.int("livemode")? == 1,
        })
    }
}

#[derive(Clone, Debug)]
pub struct RefundRow {
    pub refund_id: String,
    pub payment_id: String,
    pub amount: i64,
    pub refunded_total_after: i64,
    /// The shop's balance right after the refund.
    pub balance_after: i64,
    pub created_at: i64,
}

/// One row of [`PAYMENT_WITH_REFUNDS`]: the payment, and one of its refunds if any.
fn read_payment_and_refund(row: &dyn Row) -> Result<(PaymentRow, Option<RefundRow>), RowError> {
    let payment = PaymentRow::read(row)?;
    let refund = match row.opt_text("refund_id")? {
        Some(refund_id) => Some(RefundRow {
            refund_id,
            payment_id: payment.payment_id.clone(),
            amount: row.int("refund_amount")?,
            refunded_total_after: row.int("refunded_total_after")?,
            balance_after: row.int("refund_balance_after")?,
            created_at: row.int("refund_created_at")?,
        }),
        None => None,
    };
    Ok((payment, refund))
}

/// A payment after a refund was added to it.
#[derive(Clone, Debug)]
pub struct Refunded {
    pub refunded_total: i64,
    pub shopper_account_id: String,
    pub order_id: String,
    pub currency: String,
}

pub struct NewPayment<'a> {
    pub payment_id: &'a str,
    pub checkout_session_id: &'a str,
    pub shopper_account_id: &'a str,
    pub shop_account_id: &'a str,
    pub order_id: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub balance_after: i64,
}

pub struct NewRefund<'a> {
    pub refund_id: &'a str,
    pub payment_id: &'a str,
    pub amount: i64,
    pub refunded_total_after: i64,
    pub balance_after: i64,
}

impl Store {
    /// The payment with its refunds, read by one statement, so that both come from one snapshot
    /// even while refunds are being made: `refunded` always equals the refunds' sum. Only for
    /// the payment's shopper or shop.
    pub async fn payment_with_refunds(
        &self,
        account_id: &str,
        payment_id: &str,
    ) -> Result<Option<(PaymentRow, Vec<RefundRow>)>, StoreError> {
        let rows = self
            .read(
                PAYMENT_WITH_REFUNDS,
                &[Arg::Text(payment_id), Arg::Text(account_id)],
                read_payment_and_refund,
            )
            .await?;
        let Some((payment, _)) = rows.first() else {
            return Ok(None);
        };
        let payment = payment.clone();
        let refunds = rows.into_iter().filter_map(|(_, refund)| refund).collect();
        Ok(Some((payment, refunds)))
    }
}

impl Tx {
    /// The guarded debit: the new balance, or `None` when the balance is short.
    pub async fn debit(
        &mut self,
        account_id: &str,
        amount: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.fetch_optional(DEBIT, &[Arg::Text(account_id), Arg::Int(amount)], |row| {
            row.int("balance")
        })
        .await
    }

    pub async fn credit(&mut self, account_id: &str, amount: i64) -> Result<i64, StoreError> {
        self.fetch_one(CREDIT, &[Arg::Text(account_id), Arg::Int(amount)], |row| {
            row.int("balance")
        })
        .await
    }

    /// A shop's credit from a payment, which waits to be folded into its balance: no payment
    /// to a shop ever queues on the shop's balance row.
    pub async fn credit_unfolded(
        &mut self,
        payment_id: &str,
        account_id: &str,
        amount: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            INSERT_UNFOLDED_CREDIT,
            &[
                Arg::Text(payment_id),
                Arg::Text(account_id),
                Arg::Int(amount),
            ],
        )
        .await
        .map(|_| ())
    }

    /// Folds the account's waiting credits into its balance, under the balance row's lock,
    /// and returns the balance: everything committed so far, exactly.
    pub async fn fold_credits(&mut self, account_id: &str) -> Result<i64, StoreError> {
        if let Tx::Postgres(_) = self {
            return self
                .fetch_one(POSTGRES_FOLD_CREDITS, &[Arg::Text(account_id)], |row| {
                    row.int("balance")
                })
                .await;
        }
        let balance = self
            .fetch_one(SQLITE_FOLD_CREDITS, &[Arg::Text(account_id)], |row| {
                row.int("balance")
            })
            .await?;
        self.execute(SQLITE_DELETE_FOLDED, &[Arg::Text(account_id)])
            .await?;
        Ok(balance)
    }

    /// The account's balance, its waiting credits included.
    pub async fn balance(&mut self, account_id: &str) -> Result<i64, StoreError> {
        self.fetch_one(super::accounts::ACCOUNT, &[Arg::Text(account_id)], |row| {
            row.int("balance")
        })
        .await
    }

    pub async fn insert_ledger(&mut self, entry: &LedgerEntry<'_>) -> Result<(), StoreError> {
        self.execute(
            INSERT_LEDGER,
            &[
                Arg::Text(entry.account_id),
                Arg::Int(entry.amount),
                Arg::Text(entry.kind.as_str()),
                Arg::OptText(entry.claim.map(|c| c.key.as_str())),
                Arg::OptText(entry.claim.map(|c| c.claim_id.as_str())),
                Arg::OptText(entry.payment_id),
                Arg::OptText(entry.refund_id),
                Arg::Int(entry.created_at),
            ],
        )
        .await
        .map(|_| ())
    }

    /// `false` when the session was paid meanwhile (the unique index decided).
    pub async fn insert_payment(
        &mut self,
        claim: &Claim,
        payment: &NewPayment<'_>,
    ) -> Result<bool, StoreError> {
        let inserted = self
            .execute(
                INSERT_PAYMENT,
                &[
                    Arg::Text(payment.payment_id),
                    Arg::Text(payment.checkout_session_id),
                    Arg::Text(payment.shopper_account_id),
                    Arg::Text(payment.shop_account_id),
                    Arg::Text(payment.order_id),
                    Arg::Int(payment.amount),
                    Arg::Text(payment.currency),
                    Arg::Int(payment.balance_after),
                    Arg::Text(&claim.key),
                    Arg::Int(claim.now_ms),
                ],
            )
            .await?;
        Ok(inserted == 1)
    }

    pub async fn payment_of_shop(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        self.fetch_optional(
            PAYMENT_OF_SHOP,
            &[Arg::Text(payment_id), Arg::Text(shop_account_id)],
            PaymentRow::read,
        )
        .await
    }

    /// The payment's new refunded total, its shopper, order and currency, or `None` when
    /// `amount` exceeds what remains (or the payment is not this shop's).
    pub async fn add_refunded(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<Option<Refunded>, StoreError> {
        self.fetch_optional(
            ADD_REFUNDED,
            &[
                Arg::Text(payment_id),
                Arg::Text(shop_account_id),
                Arg::Int(amount),
            ],
            |row| {
                Ok(Refunded {
                    refunded_total: row.int("refunded")?,
                    shopper_account_id: row.text("shopper_account_id")?,
                    order_id: row.text("order_id")?,
                    currency: row.text("currency")?,
                })
            },
        )
        .await
    }

    pub async fn undo_refunded(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            UNDO_REFUNDED,
            &[
                Arg::Text(payment_id),
                Arg::Text(shop_account_id),
                Arg::Int(amount),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn insert_refund(
        &mut self,
        claim: &Claim,
        refund: &NewRefund<'_>,
    ) -> Result<(), StoreError> {
        self.execute(
            INSERT_REFUND,
            &[
                Arg::Text(refund.refund_id),
                Arg::Text(refund.payment_id),
                Arg::Int(refund.amount),
                Arg::Int(refund.refunded_total_after),
                Arg::Int(refund.balance_after),
                Arg::Text(&claim.key),
                Arg::Int(claim.now_ms),
            ],
        )
        .await
        .map(|_| ())
    }
}
