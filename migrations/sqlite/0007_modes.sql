-- no-transaction
-- Test money and live money, and live shoppers. Run with foreign keys off (SQLite changes a
-- CHECK only by rebuilding the table; see 0003), in one transaction, the keys checked after.

-- Every account is of one mode (0 test, 1 live). A funding account is where live money comes
-- from (an operator's deposit): its balance is minus what it funded, so it alone may go below 0.
CREATE TABLE accounts_v2 (
    account_id  TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,           -- SHA-256 of the bearer token, never the token
    currency    TEXT NOT NULL,
    balance     BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    kind        TEXT NOT NULL DEFAULT 'shopper'
        CHECK (kind IN ('shopper', 'shop', 'system', 'funding')),
    livemode    BIGINT NOT NULL DEFAULT 0 CHECK (livemode IN (0, 1)),
    CHECK (balance >= 0 OR kind = 'funding')
);
-- Everything before modes was demo money: test.
INSERT INTO accounts_v2 (account_id, token_hash, currency, balance, created_at, kind, livemode)
SELECT account_id, token_hash, currency, balance, created_at, kind, 0 FROM accounts;
DROP TABLE accounts;
ALTER TABLE accounts_v2 RENAME TO accounts;

-- A deposit is live money entering a shopper's account from the funding account.
CREATE TABLE ledger_v2 (
    entry_id         INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    amount           BIGINT NOT NULL,           -- signed: a debit is negative
    kind             TEXT NOT NULL CHECK (kind IN ('opening', 'payment', 'refund', 'deposit')),
    idempotency_key  TEXT,                      -- the key that moved the money (NULL for opening)
    claim_id         TEXT UNIQUE,               -- one money movement per claim of a key
    payment_id       TEXT,
    refund_id        TEXT,
    created_at       BIGINT NOT NULL,
    deposit_id       TEXT
);
INSERT INTO ledger_v2 (entry_id, account_id, amount, kind, idempotency_key, claim_id, payment_id,
                       refund_id, created_at)
SELECT entry_id, account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id,
       created_at FROM ledger;
DROP TABLE ledger;
ALTER TABLE ledger_v2 RENAME TO ledger;
CREATE INDEX ledger_account ON ledger (account_id);

-- A shop has an account in each mode: its secret key (sk_test_… / sk_live_…), signing secret
-- and webhook URL are per mode; its name and origins are the shop's, the same in both rows.
CREATE TABLE shops_v2 (
    shop_id          TEXT NOT NULL,
    livemode         BIGINT NOT NULL CHECK (livemode IN (0, 1)),
    account_id       TEXT NOT NULL UNIQUE REFERENCES accounts (account_id),
    name             TEXT NOT NULL,
    webhook_url      TEXT,
    -- Not hashed: the server signs webhooks with it (Standard Webhooks, HMAC-SHA256).
    signing_secret   TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    origins          TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (shop_id, livemode)
);
INSERT INTO shops_v2 (shop_id, livemode, account_id, name, webhook_url, signing_secret, created_at,
                      origins)
SELECT shop_id, 0, account_id, name, webhook_url, signing_secret, created_at, origins FROM shops;
-- A shop made before modes gets a live account with no usable key yet (`shop roll-key --live`
-- gives one) and a signing secret of its own.
INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind, livemode)
SELECT 'acc_' || lower(hex(randomblob(16))), 'no key yet: ' || shop_id, 'RUB', 0, created_at,
       'shop', 1 FROM shops;
INSERT INTO shops_v2 (shop_id, livemode, account_id, name, webhook_url, signing_secret, created_at,
                      origins)
SELECT s.shop_id, 1, a.account_id, s.name, NULL, 'whsec_' || hex(randomblob(24)), s.created_at,
       s.origins
  FROM shops s JOIN accounts a ON a.token_hash = 'no key yet: ' || s.shop_id;
DROP TABLE shops;
ALTER TABLE shops_v2 RENAME TO shops;

-- Live shoppers: an e-mail and an Argon2id hash of the password (PHC string).
CREATE TABLE shoppers (
    account_id     TEXT PRIMARY KEY REFERENCES accounts (account_id),
    email          TEXT NOT NULL UNIQUE,        -- as given, lower-cased
    password_hash  TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);

-- A live shopper's sign-ins: each a token (stored as its hash) that expires when unused for the
-- idle limit or older than the absolute one (both in the settings), or is revoked («Выйти»).
CREATE TABLE sign_ins (
    token_hash    TEXT PRIMARY KEY,
    account_id    TEXT NOT NULL REFERENCES accounts (account_id),
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT NOT NULL,
    revoked_at    BIGINT
);
CREATE INDEX sign_ins_account ON sign_ins (account_id);

-- An operator's deposit: live money into a shopper's account, keyed like every money movement.
CREATE TABLE deposits (
    deposit_id       TEXT PRIMARY KEY,
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    amount           BIGINT NOT NULL CHECK (amount > 0),
    balance_after    BIGINT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    created_at       BIGINT NOT NULL
);

-- A session (and its payment) is of its shop account's mode; kept on the row for the answers.
ALTER TABLE checkout_sessions ADD COLUMN livemode BIGINT NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN livemode BIGINT NOT NULL DEFAULT 0;

-- Events: a deposit's too (to the funding account: never sent to a shop).
CREATE TABLE webhook_events_v2 (
    event_id         TEXT PRIMARY KEY,
    seq              INTEGER NOT NULL UNIQUE,
    shop_account_id  TEXT NOT NULL REFERENCES accounts (account_id),
    type             TEXT NOT NULL CHECK (type IN ('payment.succeeded', 'refund.succeeded',
                                                    'checkout_session.expired', 'deposit.succeeded')),
    subject_id       TEXT NOT NULL,
    body             TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'dead', 'no_endpoint')),
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    locked_until     BIGINT,
    last_error       TEXT,
    delivered_at     BIGINT,
    lease_id         TEXT
);
INSERT INTO webhook_events_v2 SELECT event_id, seq, shop_account_id, type, subject_id, body,
       created_at, status, attempts, next_attempt_at, locked_until, last_error, delivered_at,
       lease_id FROM webhook_events;
DROP TABLE webhook_events;
ALTER TABLE webhook_events_v2 RENAME TO webhook_events;
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_events_subject ON webhook_events (subject_id, seq);
CREATE INDEX webhook_events_shop ON webhook_events (shop_account_id, seq);

-- The source of live money: every deposit is a transfer from it.
INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind, livemode)
VALUES ('acc_live_funding', 'no token: the source of live money', 'RUB', 0, 0, 'funding', 1);
