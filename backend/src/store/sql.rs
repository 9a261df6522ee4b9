//! The SQL both databases run unchanged (`$n` placeholders work in SQLite too). Statements
//! that differ live in `sqlite.rs` and `postgres.rs`. Public so that the benchmark can run the
//! very same statements against the databases directly.

// -- idempotency keys ------------------------------------------------------------------------

/// The fast path: a completed key is answered from here without taking any write lock.
pub const STORED_KEY: &str = "\
    SELECT request_hash, request_body, status, response_status, response_body, created_at \
      FROM idempotency_keys WHERE account_id = $1 AND idempotency_key = $2";

/// The claim. A live row blocks it (no row returned: replay, mismatch or in use); an expired
/// row is taken over, because an expired key is a new key. The primary key, not a check in
/// code, settles concurrent claims. Databases append their own RETURNING clause.
pub const CLAIM_KEY: &str = "\
    INSERT INTO idempotency_keys \
           (account_id, idempotency_key, claim_id, request_hash, request_body, status, created_at) \
    VALUES ($1, $2, $3, $4, $7, 'in_progress', $5) \
    ON CONFLICT (account_id, idempotency_key) DO UPDATE \
       SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, \
           request_body = excluded.request_body, \
           status = 'in_progress', response_status = NULL, response_body = NULL, \
           created_at = excluded.created_at \
     WHERE idempotency_keys.created_at < $6";

pub const COMPLETE_KEY: &str = "\
    UPDATE idempotency_keys SET status = 'done', response_status = $4, response_body = $5 \
     WHERE account_id = $1 AND idempotency_key = $2 AND claim_id = $3";

/// One bounded batch of expired keys ($2 at most).
pub const SWEEP_EXPIRED_KEYS: &str = "\
    DELETE FROM idempotency_keys WHERE (account_id, idempotency_key) IN \
        (SELECT account_id, idempotency_key FROM idempotency_keys WHERE created_at < $1 LIMIT $2)";

// -- accounts and ledger ---------------------------------------------------------------------

pub const ACCOUNT_BY_TOKEN_HASH: &str =
    "SELECT account_id, currency FROM accounts WHERE token_hash = $1";

pub const ACCOUNT: &str =
    "SELECT account_id, balance, currency FROM accounts WHERE account_id = $1";

pub const INSERT_ACCOUNT: &str = "\
    INSERT INTO accounts (account_id, token_hash, currency, balance, created_at) \
    VALUES ($1, $2, $3, $4, $5)";

/// The guarded debit of a payment: touches no row when the balance is short (so it can never
/// go negative) or the order is already paid. The order check here only saves a round trip;
/// the unique index on payments is what settles a race between two orders.
pub const DEBIT_FOR_ORDER: &str = "\
    UPDATE accounts SET balance = balance - $2 \
     WHERE account_id = $1 AND balance >= $2 \
       AND NOT EXISTS (SELECT 1 FROM payments WHERE account_id = $1 AND order_id = $3) \
    RETURNING balance";

pub const CREDIT: &str =
    "UPDATE accounts SET balance = balance + $2 WHERE account_id = $1 RETURNING balance";

pub const INSERT_LEDGER: &str = "\
    INSERT INTO ledger \
           (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

// -- payments and refunds --------------------------------------------------------------------

pub const PAID_ORDER: &str =
    "SELECT payment_id FROM payments WHERE account_id = $1 AND order_id = $2";

/// Inserts nothing when the order was paid meanwhile; the unique index decides.
pub const INSERT_PAYMENT: &str = "\
    INSERT INTO payments (payment_id, account_id, order_id, amount, currency, balance_after, \
                          idempotency_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
    ON CONFLICT (account_id, order_id) DO NOTHING";

pub const PAYMENT: &str = "\
    SELECT payment_id, order_id, amount, currency, balance_after, created_at, refunded \
      FROM payments WHERE payment_id = $1 AND account_id = $2";

/// The guarded refund: touches no row when it would refund more than remains.
pub const ADD_REFUNDED: &str = "\
    UPDATE payments SET refunded = refunded + $3 \
     WHERE payment_id = $1 AND account_id = $2 AND refunded + $3 <= amount \
    RETURNING refunded";

pub const INSERT_REFUND: &str = "\
    INSERT INTO refunds (refund_id, payment_id, amount, refunded_total_after, balance_after, \
                         idempotency_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// The payment and its refunds in one statement (one snapshot). `refunded_total_after` grows
/// with every refund, so it orders them as they happened.
pub const PAYMENT_WITH_REFUNDS: &str = "\
    SELECT p.payment_id, p.order_id, p.amount, p.currency, p.balance_after, p.created_at, \
           p.refunded, r.refund_id, r.amount AS refund_amount, r.refunded_total_after, \
           r.balance_after AS refund_balance_after, r.created_at AS refund_created_at \
      FROM payments p LEFT JOIN refunds r ON r.payment_id = p.payment_id \
     WHERE p.payment_id = $1 AND p.account_id = $2 \
     ORDER BY r.refunded_total_after";

pub const PING: &str = "SELECT CAST(1 AS BIGINT) AS one";
