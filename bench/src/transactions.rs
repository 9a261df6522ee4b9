//! What pgbench runs: the server's own statements on PostgreSQL, spelled for pgbench from the
//! very constants the server sends (`checkout_backend::store`), each `$n` replaced by the
//! pgbench expression of what the server binds there; and, as a fixed anchor, the keyed payment
//! as the server sent it before its change was composed (eleven statements).
//!
//! A script's variables: `:n` the session number (its shop `shop-(n mod 64)`, as the setup
//! made it), `:a` the shopper (`bench-1` …). pgbench binds its variables untyped: each is cast
//! where the server's statement would not tell its type.

use checkout_backend::store::{
    events::POSTGRES_INSERT_EVENT,
    payments::{BALANCE_SENTINEL, PAYMENT_OUTLOOK, POSTGRES_PAY, POSTGRES_PAY_AT_ONCE},
    replace_placeholders,
};

const PREAMBLE: &str = r#"\set i :i + 1
\set n :first + :client_id * :span + :i - 1
\set a random(1, :accounts)
\set shop :n % 64
"#;

const NOW: &str = "1764000000000";
const SESSION: &str = "('cs_' || lpad(to_hex(:n::bigint), 32, '0'))";
const SHOPPER: &str = "('bench-' || :a::text)";
const PAYMENT: &str = "('pay-' || :n::text)";
const CLAIM_ID: &str = "('c-' || :n::text)";
/// What the server stores (its bytes as good as the server's; `": false"` is spaced because
/// pgbench would take `:false` for a variable).
const EVENT_BODY: &str = r#"'{"type":"payment.succeeded","timestamp":"2026-12-02T14:01:20.331Z","data":{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","created_at":"2026-12-02T14:01:20.331Z","livemode": false}}'"#;
const ANSWER: &str = r#"'{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z","livemode": false}'"#;

/// `sql` with its placeholders spelled as pgbench expressions, as one script line.
fn spelled(sql: &str, args: &[&str]) -> String {
    let line = replace_placeholders(sql, |n| args[n - 1].to_owned());
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{line};\n")
}

/// The payment's change ([`POSTGRES_PAY`]) under `key`.
fn pay(key: &str) -> String {
    spelled(
        POSTGRES_PAY,
        &[SESSION, PAYMENT, NOW, SHOPPER, "0", "'RUB'", key, CLAIM_ID],
    )
}

const EVENT_ARGS: [&str; 6] = [
    "('evt-' || :n::text)",
    "('shop-' || :shop::text)",
    "'payment.succeeded'",
    PAYMENT,
    EVENT_BODY,
    NOW,
];

/// The server's keyed payment as it reaches PostgreSQL now, outside any transaction: the read
/// of the session, the balance and the key; then one statement that claims the key, pays,
/// writes the event and stores the answer (the balance written into it).
pub fn keyed_transaction() -> String {
    let key = "('k-' || :n::text)";
    let outlook = spelled(PAYMENT_OUTLOOK, &[SESSION, SHOPPER, key]);
    let answer = ANSWER.replace("99999", &BALANCE_SENTINEL.to_string());
    let mut args = vec![
        SESSION,
        PAYMENT,
        NOW,
        SHOPPER,
        "0",
        "'RUB'",
        key,
        CLAIM_ID,
        "'5f2b9c0d6a7e4c3b8a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b'",
        r#"('{"checkout_session_id":"' || ('cs_' || lpad(to_hex(:n::bigint), 32, '0')) || '"}')"#,
        &answer,
    ];
    args.extend(EVENT_ARGS);
    let at_once = spelled(&POSTGRES_PAY_AT_ONCE, &args);
    format!("{PREAMBLE}{outlook}{at_once}")
}

/// The same payment without a key (`POST /api/bench/unkeyed-payments`): `BEGIN`, the change,
/// the event (alone before `COMMIT`: there is no answer to carry it), `COMMIT`.
pub fn unkeyed_transaction() -> String {
    let event = spelled(POSTGRES_INSERT_EVENT, &EVENT_ARGS);
    format!(
        "{PREAMBLE}BEGIN;\n{}{event}COMMIT;\n",
        pay("('unkeyed-' || :n::text)")
    )
}

/// Statements (each one round trip) per request, `BEGIN` and `COMMIT` included.
pub const KEYED_STATEMENTS: usize = 2;
pub const UNKEYED_STATEMENTS: usize = 4;
pub const ELEVEN_STATEMENTS: usize = 11;
/// A replay: the read, which finds the stored answer.
pub const REPLAY_STATEMENTS: usize = 1;

/// The keyed payment before this change, kept as it was sent (an anchor that does not move):
/// `BEGIN`, the claim (whose `RETURNING` lifts the lock timeout), the session taken, the
/// shopper's guarded debit, the payment row, the transfer's two ledger rows, the shop's waiting
/// credit, the payment's event in the outbox, the stored answer, `COMMIT`.
pub const ELEVEN_STATEMENT_TRANSACTION: &str = r#"\set i :i + 1
\set n :first + :client_id * :span + :i - 1
\set a random(1, :accounts)
\set shop :n % 64
BEGIN;
INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, request_body, status, created_at) VALUES ('bench-' || :a, 'k-' || :n, 'c-' || :n, '5f2b9c0d6a7e4c3b8a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b', '{"checkout_session_id":"cs_' || lpad(to_hex(:n::bigint), 32, '0') || '"}', 'in_progress', 1764000000000) ON CONFLICT (account_id, idempotency_key) DO UPDATE SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, request_body = excluded.request_body, status = 'in_progress', response_status = NULL, response_body = NULL, created_at = excluded.created_at WHERE idempotency_keys.created_at < 1763900000000 RETURNING claim_id, set_config('lock_timeout', '5s', true);
UPDATE checkout_sessions SET status = 'paid', payment_id = 'pay-' || :n WHERE session_id = 'cs_' || lpad(to_hex(:n::bigint), 32, '0') AND status = 'open' AND expires_at > 1764000000000 RETURNING shop_account_id, order_id, amount, currency;
UPDATE accounts SET balance = balance - 1 WHERE account_id = 'bench-' || :a AND balance >= 1 RETURNING balance;
INSERT INTO payments (payment_id, checkout_session_id, shopper_account_id, shop_account_id, order_id, amount, currency, balance_after, idempotency_key, created_at) VALUES ('pay-' || :n, 'cs_' || lpad(to_hex(:n::bigint), 32, '0'), 'bench-' || :a, 'shop-' || :shop, 'o-' || :n, 1, 'RUB', 0, 'k-' || :n, 1764000000000) ON CONFLICT (checkout_session_id) DO NOTHING;
INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) VALUES ('bench-' || :a, -1, 'payment', 'k-' || :n, 'c-' || :n, 'pay-' || :n, NULL, 1764000000000);
INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) VALUES ('shop-' || :shop, 1, 'payment', NULL, NULL, 'pay-' || :n, NULL, 1764000000000);
INSERT INTO unfolded_credits (payment_id, account_id, amount) VALUES ('pay-' || :n, 'shop-' || :shop, 1);
INSERT INTO webhook_events (event_id, shop_account_id, type, subject_id, body, created_at, next_attempt_at, status) VALUES ('evt-' || :n, 'shop-' || :shop, 'payment.succeeded', 'pay-' || :n, '{"type":"payment.succeeded","timestamp":"2026-12-02T14:01:20.331Z","data":{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","created_at":"2026-12-02T14:01:20.331Z"}}', 1764000000000, 1764000000000, CASE WHEN (SELECT webhook_url FROM shops WHERE account_id = 'shop-' || :shop) IS NULL THEN 'no_endpoint' ELSE 'pending' END);
UPDATE idempotency_keys SET status = 'done', response_status = 201, response_body = '{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z"}' WHERE account_id = 'bench-' || :a AND idempotency_key = 'k-' || :n AND claim_id = 'c-' || :n;
COMMIT;
"#;
