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

// -- accounts, shops and the ledger -----------------------------------------------------------

pub const ACCOUNT_BY_TOKEN_HASH: &str =
    "SELECT account_id, currency, kind FROM accounts WHERE token_hash = $1";

/// An account's balance: its row plus the credits not folded into it yet.
pub const ACCOUNT: &str = "\
    SELECT a.account_id, a.currency, a.kind, \
           CAST(a.balance + COALESCE((SELECT SUM(u.amount) FROM unfolded_credits u \
                                       WHERE u.account_id = a.account_id), 0) AS BIGINT) AS balance \
      FROM accounts a WHERE a.account_id = $1";

pub const INSERT_ACCOUNT: &str = "\
    INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind) \
    VALUES ($1, $2, $3, $4, $5, $6)";

/// A new secret key for an account (the demo shop gets one at every start).
pub const SET_TOKEN_HASH: &str = "UPDATE accounts SET token_hash = $2 WHERE account_id = $1";

pub const INSERT_SHOP: &str = "\
    INSERT INTO shops (shop_id, account_id, name, webhook_url, signing_secret, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6)";

pub const SET_WEBHOOK_URL: &str = "UPDATE shops SET webhook_url = $2 WHERE shop_id = $1";

pub const SHOP: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret FROM shops WHERE shop_id = $1";

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

// -- checkout sessions -------------------------------------------------------------------------

/// Inserts nothing when the order has a session already; the unique index decides.
pub const INSERT_SESSION: &str = "\
    INSERT INTO checkout_sessions (session_id, shop_account_id, order_id, amount, currency, \
                                   description, items, status, expires_at, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'open', $8, $9) \
    ON CONFLICT (shop_account_id, order_id) DO NOTHING RETURNING session_id";

pub const SESSION_OF_ORDER: &str =
    "SELECT session_id FROM checkout_sessions WHERE shop_account_id = $1 AND order_id = $2";

/// A session with its shop's name: the public view, and what a payment decides on.
pub const SESSION: &str = "\
    SELECT s.session_id, s.shop_account_id, s.order_id, s.amount, s.currency, s.description, \
           s.items, s.status, s.payment_id, s.expires_at, sh.name AS shop_name \
      FROM checkout_sessions s JOIN shops sh ON sh.account_id = s.shop_account_id \
     WHERE s.session_id = $1";

/// The guarded step of a payment: an open, unexpired session becomes paid by this payment.
/// Touches no row otherwise, so a session is paid at most once (the unique index on
/// `payments.checkout_session_id` stands behind it).
pub const TAKE_SESSION: &str = "\
    UPDATE checkout_sessions SET status = 'paid', payment_id = $2 \
     WHERE session_id = $1 AND status = 'open' AND expires_at > $3 \
    RETURNING shop_account_id, order_id, amount, currency";

/// Undoes [`TAKE_SESSION`] inside the same transaction when the shopper cannot pay.
pub const RELEASE_SESSION: &str = "\
    UPDATE checkout_sessions SET status = 'open', payment_id = NULL \
     WHERE session_id = $1 AND payment_id = $2";

// -- payments and refunds --------------------------------------------------------------------

/// Inserts nothing when the session was paid meanwhile; the unique index decides.
pub const INSERT_PAYMENT: &str = "\
    INSERT INTO payments (payment_id, checkout_session_id, shopper_account_id, shop_account_id, \
                          order_id, amount, currency, balance_after, idempotency_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
    ON CONFLICT (checkout_session_id) DO NOTHING";

/// A payment as its shop sees it (refunds are the shop's).
pub const PAYMENT_OF_SHOP: &str = "\
    SELECT payment_id, checkout_session_id, shopper_account_id, shop_account_id, order_id, \
           amount, currency, balance_after, created_at, refunded \
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
           p.order_id, p.amount, p.currency, p.balance_after, p.created_at, p.refunded, \
           r.refund_id, r.amount AS refund_amount, r.refunded_total_after, \
           r.balance_after AS refund_balance_after, r.created_at AS refund_created_at \
      FROM payments p LEFT JOIN refunds r ON r.payment_id = p.payment_id \
     WHERE p.payment_id = $1 AND (p.shopper_account_id = $2 OR p.shop_account_id = $2) \
     ORDER BY r.refunded_total_after";

pub const PING: &str = "SELECT CAST(1 AS BIGINT) AS one";

/// The outbox's backlog, for the metrics: events not yet delivered, and the oldest one's time.
pub const OUTBOX_BACKLOG: &str = "\
SELECT COUNT(*) AS depth, MIN(created_at) AS oldest FROM webhook_events WHERE status = 'pending'";

// -- events to the shops (the outbox) ---------------------------------------------------------

/// The events due now, oldest first, leased to this worker until $2 (their attempt counted):
/// pending, not leased by another, for a shop with a webhook URL, and with no earlier event of
/// their subject still pending (a refund's event never overtakes its payment's). Databases
/// append their own locking to the inner SELECT.
pub const CLAIM_DUE_EVENTS_HEAD: &str = "\
    UPDATE webhook_events SET locked_until = $2, attempts = attempts + 1 \
     WHERE event_id IN (SELECT ev.event_id FROM webhook_events ev \
             WHERE ev.status = 'pending' AND ev.next_attempt_at <= $1 \
               AND (ev.locked_until IS NULL OR ev.locked_until < $1) \
               AND EXISTS (SELECT 1 FROM shops s \
                            WHERE s.account_id = ev.shop_account_id AND s.webhook_url IS NOT NULL) \
               AND NOT EXISTS (SELECT 1 FROM webhook_events p \
                                WHERE p.subject_id = ev.subject_id AND p.seq < ev.seq \
                                  AND p.status = 'pending') \
             ORDER BY ev.seq LIMIT $3";
pub const CLAIM_DUE_EVENTS_TAIL: &str = ") RETURNING event_id, seq, shop_account_id, type, subject_id, \
    body, created_at, status, attempts, next_attempt_at, last_error, delivered_at";

pub const SHOP_OF_ACCOUNT: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret FROM shops WHERE account_id = $1";

pub const EVENT_DELIVERED: &str = "\
    UPDATE webhook_events SET status = 'delivered', delivered_at = $2, locked_until = NULL, \
           last_error = NULL \
     WHERE event_id = $1 AND status = 'pending'";

pub const EVENT_RETRY_AT: &str = "\
    UPDATE webhook_events SET next_attempt_at = $2, locked_until = NULL, last_error = $3 \
     WHERE event_id = $1 AND status = 'pending'";

pub const EVENT_DEAD: &str = "\
    UPDATE webhook_events SET status = 'dead', locked_until = NULL, last_error = $2 \
     WHERE event_id = $1 AND status = 'pending'";

/// A shop's events, newest first, before `seq` $2, at most $3.
pub const SHOP_EVENTS: &str = "\
    SELECT event_id, seq, shop_account_id, type, subject_id, body, created_at, \
           status, attempts, next_attempt_at, last_error, delivered_at \
      FROM webhook_events WHERE shop_account_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3";

pub const SHOP_EVENT: &str = "\
    SELECT event_id, seq, shop_account_id, type, subject_id, body, created_at, \
           status, attempts, next_attempt_at, last_error, delivered_at \
      FROM webhook_events WHERE event_id = $1 AND shop_account_id = $2";

/// A shop asks for an event again: pending now, with a fresh schedule.
pub const REDELIVER_EVENT: &str = "\
    UPDATE webhook_events SET status = 'pending', attempts = 0, next_attempt_at = $3, \
           locked_until = NULL, last_error = NULL \
     WHERE event_id = $1 AND shop_account_id = $2 \
    RETURNING event_id, seq, shop_account_id, type, subject_id, body, created_at, \
           status, attempts, next_attempt_at, last_error, delivered_at";

/// Events still to be delivered, and how old the oldest is.
pub const OUTBOX_DEPTH: &str = "\
    SELECT COUNT(*) AS depth, COALESCE(MIN(created_at), 0) AS oldest \
      FROM webhook_events WHERE status = 'pending'";

/// One bounded batch of sessions that lapsed unpaid ($2 at most) become `expired`; the caller
/// writes each one's event in the same transaction.
pub const EXPIRE_SESSIONS: &str = "\
    UPDATE checkout_sessions SET status = 'expired' \
     WHERE session_id IN (SELECT session_id FROM checkout_sessions \
                           WHERE status = 'open' AND expires_at < $1 ORDER BY expires_at LIMIT $2) \
    RETURNING session_id, shop_account_id, order_id, amount, currency, expires_at";
