//! Payments and refunds, and the ledger that records every movement of money in double entry:
//! the guarded debit, the credit, the shop's credits that wait beside its balance row (so that
//! payments to one shop never queue on it) and their folding in at a refund.

use std::sync::LazyLock;

use checkout_idempotency::{Claim, KeyRecord, StoredResponse};

use super::events::{NewEvent, POSTGRES_INSERT_EVENT};
use super::keys::read_key;
use super::postgres::AtOnceWrite;
use super::row::{Arg, Row, RowError, replace_placeholders};
use super::sessions::TakenSession;
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

/// The chained steps of [`POSTGRES_PAY`], shared with [`POSTGRES_PAY_AT_ONCE`]: `$1` the session,
/// `$2` the payment's id, `$3` now, `$4` the shopper, `$5`/`$6` the shopper's mode and
/// currency, `$7` the key, `$8` the claim.
macro_rules! pay_chain {
    () => {
        "session AS ( \
        UPDATE checkout_sessions SET status = 'paid', payment_id = $2 \
         WHERE session_id = $1 AND status = 'open' AND expires_at > $3 \
        RETURNING shop_account_id, order_id, amount, currency, livemode, items, description), \
    debit AS ( \
        UPDATE accounts SET balance = balance - (SELECT amount FROM session) \
         WHERE account_id = $4 AND balance >= (SELECT amount FROM session) \
           AND EXISTS (SELECT 1 FROM session WHERE livemode = $5 AND currency = $6) \
        RETURNING balance), \
    payment AS ( \
        INSERT INTO payments (payment_id, checkout_session_id, shopper_account_id, \
                              shop_account_id, order_id, amount, currency, balance_after, \
                              idempotency_key, created_at, livemode) \
        SELECT $2, $1, $4, s.shop_account_id, s.order_id, s.amount, s.currency, d.balance, $7, \
               $3, s.livemode \
          FROM session s, debit d \
        ON CONFLICT (checkout_session_id) DO NOTHING \
        RETURNING payment_id, shop_account_id, amount), \
    ledger AS ( \
        INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, \
                            refund_id, created_at) \
        SELECT $4, -p.amount, 'payment', $7, $8, p.payment_id, NULL, $3 FROM payment p \
        UNION ALL \
        SELECT p.shop_account_id, p.amount, 'payment', NULL, NULL, p.payment_id, NULL, $3 \
          FROM payment p \
        RETURNING 1), \
    credit AS ( \
        INSERT INTO unfolded_credits (payment_id, account_id, amount) \
        SELECT payment_id, shop_account_id, amount FROM payment \
        RETURNING 1)"
    };
}

/// A payment's whole change on PostgreSQL in one statement (one round trip instead of six):
/// the session taken, the shopper's guarded debit, the payment, the transfer's two ledger rows
/// and the shop's waiting credit, each step fed by the rows of the one before, so that a step
/// that matches nothing leaves every later step nothing to write. The same guards as the
/// statements above, spelled out again because a data-modifying `WITH` cannot call them; the
/// caller checks what each step touched (see [`PaymentChange`]) and rolls back a change that
/// went only part of the way. Livemode and currency must match the shopper's ($5, $6) or
/// nothing is debited. The debit reads the session through subqueries, not a join, so that the
/// shopper's row is found by its key: a join's plan may scan the table, and under a stream of
/// payments a scan walks every dead version of the shoppers' rows.
pub const POSTGRES_PAY: &str = concat!(
    "WITH ",
    pay_chain!(),
    " \
    SELECT s.shop_account_id, s.order_id, s.amount, s.currency, s.livemode, s.items, \
           s.description, (SELECT balance FROM debit) AS balance, \
           (SELECT count(*) FROM payment) AS payments, \
           (SELECT count(*) FROM ledger) AS ledger_rows, \
           (SELECT count(*) FROM credit) AS credits \
      FROM session s"
);

/// What a keyed payment needs to know to be settled at once, in one read: the session, the
/// shopper's balance, and the key as committed (a completed key is answered from here).
pub const PAYMENT_OUTLOOK: &str = "\
    SELECT s.status AS session_status, s.expires_at, s.shop_account_id, s.order_id, s.amount, \
           s.currency, s.livemode, s.items, s.description, \
           (SELECT balance FROM accounts WHERE account_id = $2) AS balance, \
           k.request_hash, k.request_body, k.status, k.response_status, k.response_body, \
           k.created_at \
      FROM (VALUES (1)) AS one (n) \
      LEFT JOIN checkout_sessions s ON s.session_id = $1 \
      LEFT JOIN idempotency_keys k ON k.account_id = $2 AND k.idempotency_key = $3";

/// The balance a payment's answer carries until the statement that debits knows it: that
/// statement writes the balance after the debit in its place.
pub const BALANCE_SENTINEL: i64 = i64::MIN;

/// A keyed payment whole, on PostgreSQL, as ONE statement outside any transaction: the chain of
/// [`POSTGRES_PAY`], the payment's event (`$12`…`$17`, [`POSTGRES_INSERT_EVENT`]'s), and the
/// key inserted completed with its answer (`$9` the request's hash, `$10` its body, `$11` the
/// answer with [`BALANCE_SENTINEL`] for the balance). All or nothing: the key's `claim_id`
/// (NOT NULL) is the claim only if every step wrote what it must, so a chain broken anywhere
/// (the session not open, the balance short, a mode or currency not the shopper's, the payment
/// raced) fails the statement; and the key's plain insert fails on any row of the key there,
/// live, expired or being claimed (after waiting for its claim, within the lock bound). Then
/// nothing was written and the protocol's steps settle the request.
pub static POSTGRES_PAY_AT_ONCE: LazyLock<String> = LazyLock::new(|| {
    let event = replace_placeholders(POSTGRES_INSERT_EVENT, |n| format!("${}", n + 11));
    format!(
        "WITH {chain}, \
         event AS ({event} RETURNING 1), \
         keyed AS ( \
            INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, \
                                          request_body, status, response_status, response_body, \
                                          created_at) \
            VALUES ($4, $7, \
                    (SELECT $8::text FROM payment \
                      WHERE (SELECT count(*) FROM ledger) = 2 \
                        AND (SELECT count(*) FROM credit) = 1 \
                        AND (SELECT count(*) FROM event) = 1), \
                    $9, $10, 'done', 201, \
                    replace($11, '\"balance\":{BALANCE_SENTINEL}', \
                            '\"balance\":' || (SELECT balance FROM debit)), \
                    $3) \
            RETURNING response_body) \
         SELECT response_body FROM keyed",
        chain = pay_chain!(),
    )
});

/// A payment as its shop sees it (refunds are the shop's).
pub const PAYMENT_OF_SHOP: &str = "\
    SELECT payment_id, checkout_session_id, shopper_account_id, shop_account_id, order_id, \
           amount, currency, balance_after, created_at, refunded, livemode \
      FROM payments WHERE payment_id = $1 AND shop_account_id = $2";

/// The guarded refund: touches no row when it would refund more than remains (or the payment
/// is not this shop's). The payment's version goes up by one: the refund's event carries it.
pub const ADD_REFUNDED: &str = "\
    UPDATE payments SET refunded = refunded + $3, version = version + 1 \
     WHERE payment_id = $1 AND shop_account_id = $2 AND refunded + $3 <= amount \
    RETURNING refunded, version, shopper_account_id, order_id, currency";

/// Undoes [`ADD_REFUNDED`] inside the same transaction when the shop cannot fund the refund.
pub const UNDO_REFUNDED: &str = "\
    UPDATE payments SET refunded = refunded - $3, version = version - 1 \
     WHERE payment_id = $1 AND shop_account_id = $2";

pub const INSERT_REFUND: &str = "\
    INSERT INTO refunds (refund_id, payment_id, amount, refunded_total_after, balance_after, \
                         idempotency_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// A refund's first step on PostgreSQL in one statement: [`ADD_REFUNDED`], then, if it took,
/// the shop's waiting credits folded into its balance under the row's lock, as
/// [`POSTGRES_FOLD_CREDITS`] does. No row when the refund would exceed what remains (or the
/// payment is not this shop's). The debit is the next statement's: one statement cannot
/// update the shop's row twice, and whether the debit took must be known.
pub const POSTGRES_ADD_REFUNDED_AND_FOLD: &str = "\
    WITH refunded AS ( \
        UPDATE payments SET refunded = refunded + $3, version = version + 1 \
         WHERE payment_id = $1 AND shop_account_id = $2 AND refunded + $3 <= amount \
        RETURNING refunded, version, shopper_account_id, order_id, currency), \
    folded AS ( \
        DELETE FROM unfolded_credits \
         WHERE account_id = $2 AND EXISTS (SELECT 1 FROM refunded) RETURNING amount), \
    shop AS ( \
        UPDATE accounts SET balance = balance + COALESCE((SELECT SUM(amount) FROM folded), 0) \
         WHERE account_id = $2 AND EXISTS (SELECT 1 FROM refunded) RETURNING balance) \
    SELECT r.refunded, r.version, r.shopper_account_id, r.order_id, r.currency, \
           (SELECT balance FROM shop) AS balance \
      FROM refunded r";

/// A refund's transfer on PostgreSQL in one statement: the shop's guarded debit, the shopper's
/// credit, the refund row and the two ledger rows, each step fed by the one before; the caller
/// checks what each touched.
pub const POSTGRES_TRANSFER_REFUND: &str = "\
    WITH shop AS ( \
        UPDATE accounts SET balance = balance - $3 \
         WHERE account_id = $2 AND balance >= $3 RETURNING balance), \
    shopper AS ( \
        UPDATE accounts SET balance = balance + $3 \
         WHERE account_id = $4 AND EXISTS (SELECT 1 FROM shop) RETURNING balance), \
    refund AS ( \
        INSERT INTO refunds (refund_id, payment_id, amount, refunded_total_after, balance_after, \
                             idempotency_key, created_at) \
        SELECT $5, $1, $3, $6, s.balance, $7, $8 FROM shop s, shopper \
        RETURNING refund_id), \
    ledger AS ( \
        INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, \
                            refund_id, created_at) \
        SELECT $2, -$3, 'refund', $7, $9, $1, r.refund_id, $8 FROM refund r \
        UNION ALL \
        SELECT $4, $3, 'refund', NULL, NULL, $1, r.refund_id, $8 FROM refund r \
        RETURNING 1) \
    SELECT (SELECT balance FROM shop) AS balance, \
           (SELECT count(*) FROM shopper) AS credited, \
           (SELECT count(*) FROM refund) AS refunds, \
           (SELECT count(*) FROM ledger) AS ledger_rows";

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
    /// The payment's version after the refund (its events' `sequence`).
    pub version: i64,
    pub shopper_account_id: String,
    pub order_id: String,
    pub currency: String,
}

fn read_refunded(row: &dyn Row) -> Result<Refunded, RowError> {
    Ok(Refunded {
        refunded_total: row.int("refunded")?,
        version: row.int("version")?,
        shopper_account_id: row.text("shopper_account_id")?,
        order_id: row.text("order_id")?,
        currency: row.text("currency")?,
    })
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

/// Who pays which session, for [`Tx::pay`].
pub struct Payer<'a> {
    pub payment_id: &'a str,
    pub checkout_session_id: &'a str,
    pub shopper_account_id: &'a str,
    /// The shopper's mode and currency: the session must be of both.
    pub livemode: bool,
    pub currency: &'a str,
}

impl<'a> Payer<'a> {
    /// Whether this shopper's money may pay the session: the same mode and currency.
    pub fn pays_in(&self, session: &TakenSession) -> bool {
        session.livemode == self.livemode && session.currency == self.currency
    }

    /// `$1`…`$8` of the payment's chain ([`POSTGRES_PAY`], [`POSTGRES_PAY_AT_ONCE`]).
    fn chain_args(&self, claim: &'a Claim) -> [Arg<'a>; 8] {
        [
            Arg::Text(self.checkout_session_id),
            Arg::Text(self.payment_id),
            Arg::Int(claim.now_ms),
            Arg::Text(self.shopper_account_id),
            Arg::Int(i64::from(self.livemode)),
            Arg::Text(self.currency),
            Arg::Text(&claim.key),
            Arg::Text(&claim.claim_id),
        ]
    }
}

/// How far a payment's change went ([`Tx::pay`]).
#[derive(Debug)]
pub enum PaymentChange {
    /// The session is not open: unknown, paid, or expired (the caller reads which).
    SessionNotOpen,
    /// The session is of another mode or currency than the shopper's: it was taken and nothing
    /// else; the caller rolls back.
    Mismatch(TakenSession),
    /// The shopper's balance is short: the session was taken and nothing else.
    Short(TakenSession),
    /// Another payment of this session committed first; the caller runs it again.
    Raced,
    /// Paid in full: the session's terms and the shopper's balance after.
    Paid { session: TakenSession, balance: i64 },
}

/// A keyed payment as it stands before it is settled at once ([`PAYMENT_OUTLOOK`]).
#[derive(Debug)]
pub struct PaymentOutlook {
    /// The session, if there is one: its status, its expiry, and its terms.
    pub session: Option<(String, i64, TakenSession)>,
    /// The shopper's balance.
    pub balance: Option<i64>,
    /// The key as committed, if any.
    pub key: Option<KeyRecord>,
}

impl PaymentOutlook {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        let session = match row.opt_text("session_status")? {
            Some(status) => Some((status, row.int("expires_at")?, TakenSession::read(row)?)),
            None => None,
        };
        let key = match row.opt_text("request_hash")? {
            Some(_) => Some(read_key(row)?),
            None => None,
        };
        Ok(PaymentOutlook {
            session,
            balance: row.opt_int("balance")?,
            key,
        })
    }
}

/// A keyed payment settled at once ([`Store::pay_at_once`]).
pub struct PaymentAtOnce<'a> {
    pub claim: &'a Claim,
    pub payer: &'a Payer<'a>,
    /// The answer to store under the key, its balance [`BALANCE_SENTINEL`].
    pub answer: &'a str,
    /// The payment's event for the session's shop.
    pub event: &'a NewEvent<'a>,
}

pub struct NewRefund<'a> {
    pub refund_id: &'a str,
    pub payment_id: &'a str,
    pub amount: i64,
    pub refunded_total_after: i64,
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

impl Store {
    /// Whether a payment can be settled at once here: PostgreSQL with named statements (see
    /// [`super::PgStore::write_at_once`]).
    pub fn pays_at_once(&self) -> bool {
        matches!(self, Store::Postgres(store) if store.prepared())
    }

    /// The session, the shopper's balance and the key, in one read.
    pub async fn payment_outlook(
        &self,
        session_id: &str,
        shopper_account_id: &str,
        key: &str,
    ) -> Result<PaymentOutlook, StoreError> {
        let rows = self
            .read(
                PAYMENT_OUTLOOK,
                &[
                    Arg::Text(session_id),
                    Arg::Text(shopper_account_id),
                    Arg::Text(key),
                ],
                PaymentOutlook::read,
            )
            .await?;
        rows.into_iter()
            .next()
            .ok_or_else(|| StoreError::Other("the payment's outlook read no row".into()))
    }

    /// The keyed payment whole, in one statement ([`POSTGRES_PAY_AT_ONCE`]): the answer stored
    /// under the key, or `None` when nothing was written (the protocol's steps then decide).
    pub async fn pay_at_once(
        &self,
        payment: &PaymentAtOnce<'_>,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let Store::Postgres(store) = self else {
            return Ok(None);
        };
        let (claim, payer, event) = (payment.claim, payment.payer, payment.event);
        let mut args = payer.chain_args(claim).to_vec();
        args.extend([
            Arg::Text(&claim.request_hash),
            Arg::Text(&claim.request_body),
            Arg::Text(payment.answer),
        ]);
        args.extend(event.args());
        let written = store
            .write_at_once(&POSTGRES_PAY_AT_ONCE, &args, |row| {
                row.text("response_body")
            })
            .await?;
        match written {
            AtOnceWrite::Committed(bodies) => match bodies.into_iter().next() {
                Some(body) => Ok(Some(StoredResponse { status: 201, body })),
                // Never expected: the key's insert returns its row or fails the statement.
                None => Err(StoreError::Other(
                    "a payment at once committed without its key".into(),
                )),
            },
            AtOnceWrite::Refused => Ok(None),
        }
    }
}

impl Tx {
    /// A payment's change: the session taken, the guarded debit, the payment, its two ledger
    /// rows and the shop's waiting credit. PostgreSQL runs it as one statement
    /// ([`POSTGRES_PAY`]); SQLite, whose statements cost no round trip, one by one.
    pub async fn pay(
        &mut self,
        claim: &Claim,
        payer: &Payer<'_>,
    ) -> Result<PaymentChange, StoreError> {
        if matches!(self, Tx::Postgres(_)) {
            return self.pay_composed(claim, payer).await;
        }
        let Some(session) = self
            .take_session(payer.checkout_session_id, payer.payment_id, claim.now_ms)
            .await?
        else {
            return Ok(PaymentChange::SessionNotOpen);
        };
        if !payer.pays_in(&session) {
            return Ok(PaymentChange::Mismatch(session));
        }
        let Some(balance) = self.debit(payer.shopper_account_id, session.amount).await? else {
            return Ok(PaymentChange::Short(session));
        };
        let inserted = self
            .insert_payment(
                claim,
                &NewPayment {
                    payment_id: payer.payment_id,
                    checkout_session_id: payer.checkout_session_id,
                    shopper_account_id: payer.shopper_account_id,
                    shop_account_id: &session.shop_account_id,
                    order_id: &session.order_id,
                    amount: session.amount,
                    currency: &session.currency,
                    balance_after: balance,
                },
            )
            .await?;
        if !inserted {
            return Ok(PaymentChange::Raced);
        }
        // The transfer, in double entry: the shopper's debit (with the key's claim), the shop's
        // credit, which waits to be folded into the shop's balance.
        for (account_id, amount, keyed_side) in [
            (payer.shopper_account_id, -session.amount, Some(claim)),
            (session.shop_account_id.as_str(), session.amount, None),
        ] {
            self.insert_ledger(&LedgerEntry {
                account_id,
                amount,
                kind: EntryKind::Payment,
                claim: keyed_side,
                payment_id: Some(payer.payment_id),
                refund_id: None,
                created_at: claim.now_ms,
            })
            .await?;
        }
        self.credit_unfolded(payer.payment_id, &session.shop_account_id, session.amount)
            .await?;
        Ok(PaymentChange::Paid { session, balance })
    }

    async fn pay_composed(
        &mut self,
        claim: &Claim,
        payer: &Payer<'_>,
    ) -> Result<PaymentChange, StoreError> {
        let row = self
            .fetch_optional(POSTGRES_PAY, &payer.chain_args(claim), |row| {
                Ok((
                    TakenSession::read(row)?,
                    row.opt_int("balance")?,
                    [
                        row.int("payments")?,
                        row.int("ledger_rows")?,
                        row.int("credits")?,
                    ],
                ))
            })
            .await?;
        let Some((session, balance, written)) = row else {
            return Ok(PaymentChange::SessionNotOpen);
        };
        if !payer.pays_in(&session) {
            return Ok(PaymentChange::Mismatch(session));
        }
        let Some(balance) = balance else {
            return Ok(PaymentChange::Short(session));
        };
        match written {
            [1, 2, 1] => Ok(PaymentChange::Paid { session, balance }),
            [0, 0, 0] => Ok(PaymentChange::Raced),
            // Never expected: the steps are chained. Rolled back rather than half kept.
            _ => Err(StoreError::Other(
                format!("a payment's change wrote {written:?} rows (payment, ledger, credit)")
                    .into(),
            )),
        }
    }

    /// A refund's first step: [`Self::add_refunded`], then the shop's waiting credits folded
    /// into its balance, which is returned (the row stays locked: the balance holds until
    /// commit). `None` when the refund would exceed what remains, or the payment is not this
    /// shop's; nothing is folded then. One statement on PostgreSQL.
    pub async fn add_refunded_and_fold(
        &mut self,
        shop_account_id: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<Option<(Refunded, i64)>, StoreError> {
        if matches!(self, Tx::Postgres(_)) {
            return self
                .fetch_optional(
                    POSTGRES_ADD_REFUNDED_AND_FOLD,
                    &[
                        Arg::Text(payment_id),
                        Arg::Text(shop_account_id),
                        Arg::Int(amount),
                    ],
                    |row| Ok((read_refunded(row)?, row.int("balance")?)),
                )
                .await;
        }
        let Some(refunded) = self
            .add_refunded(shop_account_id, payment_id, amount)
            .await?
        else {
            return Ok(None);
        };
        let balance = self.fold_credits(shop_account_id).await?;
        Ok(Some((refunded, balance)))
    }

    /// A refund's transfer: the shop's guarded debit, the shopper's credit, the refund row and
    /// the transfer's two ledger rows. The shop's balance after, or `None` (nothing written)
    /// when it is short. One statement on PostgreSQL.
    pub async fn transfer_refund(
        &mut self,
        claim: &Claim,
        shopper_account_id: &str,
        refund: &NewRefund<'_>,
    ) -> Result<Option<i64>, StoreError> {
        let shop = claim.scope.as_str();
        if matches!(self, Tx::Postgres(_)) {
            let (balance, written) = self
                .fetch_one(
                    POSTGRES_TRANSFER_REFUND,
                    &[
                        Arg::Text(refund.payment_id),
                        Arg::Text(shop),
                        Arg::Int(refund.amount),
                        Arg::Text(shopper_account_id),
                        Arg::Text(refund.refund_id),
                        Arg::Int(refund.refunded_total_after),
                        Arg::Text(&claim.key),
                        Arg::Int(claim.now_ms),
                        Arg::Text(&claim.claim_id),
                    ],
                    |row| {
                        Ok((
                            row.opt_int("balance")?,
                            [
                                row.int("credited")?,
                                row.int("refunds")?,
                                row.int("ledger_rows")?,
                            ],
                        ))
                    },
                )
                .await?;
            return match (balance, written) {
                (Some(balance), [1, 1, 2]) => Ok(Some(balance)),
                (None, [0, 0, 0]) => Ok(None),
                // Never expected: the steps are chained. Rolled back rather than half kept.
                _ => Err(StoreError::Other(
                    format!("a refund's transfer wrote {written:?} rows (credit, refund, ledger)")
                        .into(),
                )),
            };
        }
        let Some(balance) = self.debit(shop, refund.amount).await? else {
            return Ok(None);
        };
        self.credit(shopper_account_id, refund.amount).await?;
        self.insert_refund(claim, refund, balance).await?;
        // The transfer, in double entry: the shop's debit (with the key's claim), the shopper's
        // credit.
        for (account_id, amount, keyed_side) in [
            (shop, -refund.amount, Some(claim)),
            (shopper_account_id, refund.amount, None),
        ] {
            self.insert_ledger(&LedgerEntry {
                account_id,
                amount,
                kind: EntryKind::Refund,
                claim: keyed_side,
                payment_id: Some(refund.payment_id),
                refund_id: Some(refund.refund_id),
                created_at: claim.now_ms,
            })
            .await?;
        }
        Ok(Some(balance))
    }

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
            read_refunded,
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
        balance_after: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            INSERT_REFUND,
            &[
                Arg::Text(refund.refund_id),
                Arg::Text(refund.payment_id),
                Arg::Int(refund.amount),
                Arg::Int(refund.refunded_total_after),
                Arg::Int(balance_after),
                Arg::Text(&claim.key),
                Arg::Int(claim.now_ms),
            ],
        )
        .await
        .map(|_| ())
    }
}
