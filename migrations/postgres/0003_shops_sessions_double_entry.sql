-- Shops, checkout sessions, and money that moves from shopper to shop in double entry.

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

-- Payments now go from a shopper to a shop, for a session (at most one payment each). Order ids
-- are the shops' own, so a shopper may pay two shops' orders of the same id.
ALTER TABLE payments DROP CONSTRAINT payments_account_id_order_id_key;
ALTER TABLE payments RENAME COLUMN account_id TO shopper_account_id;
ALTER TABLE payments ADD COLUMN checkout_session_id TEXT UNIQUE REFERENCES checkout_sessions (session_id);
ALTER TABLE payments ADD COLUMN shop_account_id TEXT REFERENCES accounts (account_id);

-- Payments made before shops moved money to nobody: they are given their counterpart on a
-- system account, so that every transfer's ledger rows sum to zero.
INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind)
SELECT 'acc_before_shops', 'no token: the counterpart of payments made before shops', 'RUB',
       COALESCE((SELECT SUM(amount) FROM payments), 0) - COALESCE((SELECT SUM(amount) FROM refunds), 0),
       0, 'system';
UPDATE payments SET shop_account_id = 'acc_before_shops';
ALTER TABLE payments ALTER COLUMN shop_account_id SET NOT NULL;
INSERT INTO ledger (account_id, amount, kind, idempotency_key, payment_id, created_at)
SELECT 'acc_before_shops', amount, 'payment', idempotency_key, payment_id, created_at FROM payments;
INSERT INTO ledger (account_id, amount, kind, idempotency_key, payment_id, refund_id, created_at)
SELECT 'acc_before_shops', -amount, 'refund', idempotency_key, payment_id, refund_id, created_at FROM refunds;
CREATE INDEX payments_shop ON payments (shop_account_id);
CREATE INDEX payments_shopper ON payments (shopper_account_id);

-- A shop's credits from payments are not written into its balance row (every payment to the
-- shop would queue on that one row): they wait here, and are folded into the balance under the
-- row's lock when the shop spends (a refund). balance + unfolded credits == sum(ledger).
CREATE TABLE unfolded_credits (
    payment_id   TEXT PRIMARY KEY REFERENCES payments (payment_id),
    account_id   TEXT NOT NULL REFERENCES accounts (account_id),
    amount       BIGINT NOT NULL CHECK (amount > 0)
);
CREATE INDEX unfolded_credits_account ON unfolded_credits (account_id);
