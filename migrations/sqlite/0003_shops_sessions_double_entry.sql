-- no-transaction
-- Shops, checkout sessions, and money that moves from shopper to shop in double entry.
-- Run with foreign keys off (backend/src/store/sqlite.rs), because rebuilding `payments`
-- (SQLite cannot drop a UNIQUE constraint in place) needs them off, which SQLite allows only
-- outside a transaction; the runner still makes it one transaction and checks the keys after.

-- Every account is a shopper's (a bearer token), a shop's (a secret key), or the system's.
ALTER TABLE accounts ADD COLUMN kind TEXT NOT NULL DEFAULT 'shopper'
    CHECK (kind IN ('shopper', 'shop', 'system'));

CREATE TABLE shops (
    shop_id          TEXT PRIMARY KEY,
    account_id       TEXT NOT NULL UNIQUE REFERENCES accounts (account_id),
    name             TEXT NOT NULL,
    webhook_url      TEXT,
    -- Not hashed: the server signs webhooks with it (Standard Webhooks, HMAC-SHA256).
    signing_secret   TEXT NOT NULL,
    created_at       BIGINT NOT NULL
);

-- The shop fixes the amount; the shopper's browser only pays it. One session per order.
CREATE TABLE checkout_sessions (
    session_id       TEXT PRIMARY KEY,
    shop_account_id  TEXT NOT NULL REFERENCES accounts (account_id),
    order_id         TEXT NOT NULL,
    amount           BIGINT NOT NULL CHECK (amount > 0),
    currency         TEXT NOT NULL,
    description      TEXT,
    items            TEXT NOT NULL,              -- JSON array of line items
    status           TEXT NOT NULL CHECK (status IN ('open', 'paid', 'expired')),
    payment_id       TEXT,
    expires_at       BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    UNIQUE (shop_account_id, order_id)
);
CREATE INDEX checkout_sessions_open ON checkout_sessions (expires_at) WHERE status = 'open';

-- Payments made before shops moved money to nobody: they are given their counterpart on a
-- system account, so that every transfer's ledger rows sum to zero.
INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind)
SELECT 'acc_before_shops', 'no token: the counterpart of payments made before shops', 'RUB',
       COALESCE((SELECT SUM(amount) FROM payments), 0) - COALESCE((SELECT SUM(amount) FROM refunds), 0),
       0, 'system';
INSERT INTO ledger (account_id, amount, kind, idempotency_key, payment_id, created_at)
SELECT 'acc_before_shops', amount, 'payment', idempotency_key, payment_id, created_at FROM payments;
INSERT INTO ledger (account_id, amount, kind, idempotency_key, payment_id, refund_id, created_at)
SELECT 'acc_before_shops', -amount, 'refund', idempotency_key, payment_id, refund_id, created_at FROM refunds;

-- Payments now go from a shopper to a shop, for a session (at most one payment each). Order ids
-- are the shops' own, so a shopper may pay two shops' orders of the same id.
CREATE TABLE payments_v2 (
    payment_id           TEXT PRIMARY KEY,
    checkout_session_id  TEXT UNIQUE REFERENCES checkout_sessions (session_id),
    shopper_account_id   TEXT NOT NULL REFERENCES accounts (account_id),
    shop_account_id      TEXT NOT NULL REFERENCES accounts (account_id),
    order_id             TEXT NOT NULL,
    amount               BIGINT NOT NULL CHECK (amount > 0),
    currency             TEXT NOT NULL,
    refunded             BIGINT NOT NULL DEFAULT 0 CHECK (refunded >= 0 AND refunded <= amount),
    balance_after        BIGINT NOT NULL,
    idempotency_key      TEXT NOT NULL,
    created_at           BIGINT NOT NULL
);
INSERT INTO payments_v2 (payment_id, checkout_session_id, shopper_account_id, shop_account_id,
                         order_id, amount, currency, refunded, balance_after, idempotency_key,
                         created_at)
SELECT payment_id, NULL, account_id, 'acc_before_shops', order_id, amount, currency, refunded,
       balance_after, idempotency_key, created_at
  FROM payments;
DROP TABLE payments;
ALTER TABLE payments_v2 RENAME TO payments;
CREATE INDEX payments_shop ON payments (shop_account_id);
CREATE INDEX payments_shopper ON payments (shopper_account_id);

-- A shop's credits from payments are not written into its balance row: they wait here, and are
-- folded into the balance when the shop spends (a refund). balance + unfolded credits ==
-- sum(ledger).
CREATE TABLE unfolded_credits (
    payment_id   TEXT PRIMARY KEY REFERENCES payments (payment_id),
    account_id   TEXT NOT NULL REFERENCES accounts (account_id),
    amount       BIGINT NOT NULL CHECK (amount > 0)
);
CREATE INDEX unfolded_credits_account ON unfolded_credits (account_id);

