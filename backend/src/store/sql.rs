//! The SQL both databases run unchanged (`$n` placeholders work in SQLite too), or as a
//! [`Template`] with the few words that differ. Statements that differ more live in `sqlite.rs`
//! and `postgres.rs`. Public so that the benchmark can run the very same statements against
//! the databases directly.

use super::row::Template;

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

/// One bounded batch of expired keys ($2 at most). Every condition is repeated outside the
/// subquery: under PostgreSQL's READ COMMITTED, a delete that waited for a row lock re-checks
/// only the outer `WHERE` against the row as committed, and a key re-claimed meanwhile (an
/// expired key is a new key) is live again. The subquery skips keys being claimed right now.
pub static SWEEP_EXPIRED_KEYS: Template = Template::new(
    "DELETE FROM idempotency_keys WHERE (account_id, idempotency_key) IN \
        (SELECT account_id, idempotency_key FROM idempotency_keys WHERE created_at < $1 \
          LIMIT $2{skip_locked}) \
       AND created_at < $1",
);

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

/// An event is due when it is pending, its time has come, no worker holds a lease on it, its
/// shop has a webhook URL, and no earlier event of its subject is still pending (a refund's
/// event never overtakes its payment's). `{e}` names the row.
macro_rules! due_event {
    ($e:literal) => {
        concat!(
            $e,
            ".status = 'pending' AND ",
            $e,
            ".next_attempt_at <= {now} \
             AND (",
            $e,
            ".locked_until IS NULL OR ",
            $e,
            ".locked_until < {now}) \
             AND EXISTS (SELECT 1 FROM shops s \
                          WHERE s.account_id = ",
            $e,
            ".shop_account_id AND s.webhook_url IS NOT NULL) \
             AND NOT EXISTS (SELECT 1 FROM webhook_events p \
                              WHERE p.subject_id = ",
            $e,
            ".subject_id AND p.seq < ",
            $e,
            ".seq \
                                AND p.status = 'pending')"
        )
    };
}

/// The columns of an event, as [`super::EventRow`] reads them.
macro_rules! event_columns {
    () => {
        "event_id, seq, shop_account_id, type, subject_id, body, created_at, status, attempts, \
         next_attempt_at, last_error, delivered_at, lease_id"
    };
}

/// Leases up to $4 due events to this worker for $1 ms under lease $2 (their attempt counted),
/// taking turns between shops: each shop's due events are numbered in order, and a shop gets
/// at most $3 in flight at once (its events already leased count), so one shop whose endpoint
/// hangs cannot hold every send slot. The innermost query ranks; the middle one locks what it
/// picked and re-checks it as locked (skipping rows another instance holds); the outer
/// `UPDATE` checks once more, as READ COMMITTED re-reads only its own `WHERE`.
pub static CLAIM_DUE_EVENTS: Template = Template::new(concat!(
    "UPDATE webhook_events SET locked_until = {now} + $1, lease_id = $2, attempts = attempts + 1 \
      WHERE event_id IN ( \
            SELECT ev.event_id FROM webhook_events ev \
             WHERE ev.event_id IN ( \
                   SELECT due.event_id FROM ( \
                          SELECT e.event_id, e.seq, e.shop_account_id, \
                                 ROW_NUMBER() OVER (PARTITION BY e.shop_account_id ORDER BY e.seq) AS turn \
                            FROM webhook_events e WHERE ",
    due_event!("e"),
    ") due \
                     LEFT JOIN (SELECT shop_account_id, COUNT(*) AS n FROM webhook_events \
                                 WHERE status = 'pending' AND locked_until >= {now} \
                                 GROUP BY shop_account_id) busy \
                            ON busy.shop_account_id = due.shop_account_id \
                    WHERE due.turn + COALESCE(busy.n, 0) <= $3 \
                    ORDER BY due.turn, due.seq LIMIT $4) \
               AND ",
    due_event!("ev"),
    "{skip_locked}) \
        AND ",
    due_event!("webhook_events"),
    " RETURNING ",
    event_columns!()
));

pub const SHOP_OF_ACCOUNT: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret FROM shops WHERE account_id = $1";

/// How an attempt ended is written only by the attempt that holds the lease ($2): a shop's
/// redelivery request made meanwhile takes the lease away, and is not undone by it.
pub static EVENT_DELIVERED: Template = Template::new(
    "UPDATE webhook_events SET status = 'delivered', delivered_at = {now}, locked_until = NULL, \
            lease_id = NULL, last_error = NULL \
      WHERE event_id = $1 AND lease_id = $2 AND status = 'pending'",
);

/// The next attempt $3 ms from now.
pub static EVENT_RETRY_AT: Template = Template::new(
    "UPDATE webhook_events SET next_attempt_at = {now} + $3, locked_until = NULL, lease_id = NULL, \
            last_error = $4 \
      WHERE event_id = $1 AND lease_id = $2 AND status = 'pending'",
);

pub const EVENT_DEAD: &str = "\
    UPDATE webhook_events SET status = 'dead', locked_until = NULL, lease_id = NULL, \
           last_error = $3 \
     WHERE event_id = $1 AND lease_id = $2 AND status = 'pending'";

/// A shop's events, newest first, before `seq` $2, at most $3.
pub const SHOP_EVENTS: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM webhook_events WHERE shop_account_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3"
);

pub const SHOP_EVENT: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM webhook_events WHERE event_id = $1 AND shop_account_id = $2"
);

/// A shop asks for an event again: pending with a fresh schedule, due now, or when the lease
/// of an attempt in flight ends (the lease stays, so no other worker sends it meanwhile; the
/// lease id goes, so that attempt's outcome no longer counts). Kept as `no_endpoint` while the
/// shop has no webhook URL.
pub static REDELIVER_EVENT: Template = Template::new(concat!(
    "UPDATE webhook_events \
        SET status = CASE WHEN (SELECT webhook_url FROM shops WHERE account_id = $2) IS NULL \
                          THEN 'no_endpoint' ELSE 'pending' END, \
            attempts = 0, lease_id = NULL, last_error = NULL, \
            next_attempt_at = CASE WHEN locked_until > {now} THEN locked_until ELSE {now} END \
      WHERE event_id = $1 AND shop_account_id = $2 \
     RETURNING ",
    event_columns!()
));

/// A shop's webhook URL, set or cleared by its operator.
pub const SET_SHOP_WEBHOOK_URL: &str =
    "UPDATE shops SET webhook_url = $2 WHERE shop_id = $1 RETURNING account_id";

/// The shop has an endpoint (again): every event it has not received goes there, due now, on
/// a fresh schedule; an attempt in flight keeps its lease.
pub static EVENTS_TO_NEW_ENDPOINT: Template = Template::new(
    "UPDATE webhook_events \
        SET status = 'pending', attempts = 0, last_error = NULL, \
            next_attempt_at = CASE WHEN locked_until > {now} THEN locked_until ELSE {now} END \
      WHERE shop_account_id = $1 AND status IN ('pending', 'no_endpoint')",
);

/// The shop has no endpoint any more: what waited for delivery is kept, as `no_endpoint`.
pub static EVENTS_WITHOUT_ENDPOINT: Template = Template::new(
    "UPDATE webhook_events SET status = 'no_endpoint', lease_id = NULL \
      WHERE shop_account_id = $1 AND status = 'pending' \
        AND (locked_until IS NULL OR locked_until < {now})",
);

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
     RETURNING session_id, shop_account_id, order_id, amount, currency, expires_at",
);
