-- Test money and live money, and live shoppers (see the SQLite twin for the why of each part).

-- Every account is of one mode (0 test, 1 live); a funding account alone may go below 0.
ALTER TABLE accounts ADD COLUMN livemode BIGINT NOT NULL DEFAULT 0 CHECK (livemode IN (0, 1));
ALTER TABLE accounts DROP CONSTRAINT accounts_kind_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_kind_check
    CHECK (kind IN ('shopper', 'shop', 'system', 'funding'));
ALTER TABLE accounts DROP CONSTRAINT accounts_balance_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_balance_check CHECK (balance >= 0 OR kind = 'funding');

ALTER TABLE ledger DROP CONSTRAINT ledger_kind_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_kind_check
    CHECK (kind IN ('opening', 'payment', 'refund', 'deposit'));
ALTER TABLE ledger ADD COLUMN deposit_id TEXT;

-- A shop has an account in each mode.
ALTER TABLE shops ADD COLUMN livemode BIGINT NOT NULL DEFAULT 0 CHECK (livemode IN (0, 1));
ALTER TABLE shops DROP CONSTRAINT shops_pkey;
ALTER TABLE shops ADD PRIMARY KEY (shop_id, livemode);
INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind, livemode)
SELECT 'acc_' || md5(random()::text || shop_id), 'no key yet: ' || shop_id, 'RUB', 0, created_at,
       'shop', 1 FROM shops;
INSERT INTO shops (shop_id, livemode, account_id, name, webhook_url, signing_secret, created_at,
                   origins)
SELECT s.shop_id, 1, a.account_id, s.name, NULL,
       'whsec_' || encode(decode(md5(random()::text) || md5(random()::text), 'hex'), 'base64'),
       s.created_at, s.origins
  FROM shops s JOIN accounts a ON a.token_hash = 'no key yet: ' || s.shop_id;

CREATE TABLE shoppers (
    account_id     TEXT PRIMARY KEY REFERENCES accounts (account_id),
    email          TEXT NOT NULL UNIQUE,
    password_hash  TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);

CREATE TABLE sign_ins (
    token_hash    TEXT PRIMARY KEY,
    account_id    TEXT NOT NULL REFERENCES accounts (account_id),
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT NOT NULL,
    revoked_at    BIGINT
);
CREATE INDEX sign_ins_account ON sign_ins (account_id);

CREATE TABLE deposits (
    deposit_id       TEXT PRIMARY KEY,
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    amount           BIGINT NOT NULL CHECK (amount > 0),
    balance_after    BIGINT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    created_at       BIGINT NOT NULL
);

ALTER TABLE checkout_sessions ADD COLUMN livemode BIGINT NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN livemode BIGINT NOT NULL DEFAULT 0;

ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_type_check;
ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_type_check
    CHECK (type IN ('payment.succeeded', 'refund.succeeded', 'checkout_session.expired',
                    'deposit.succeeded'));

-- The source of live money: every deposit is a transfer from it.
INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind, livemode)
VALUES ('acc_live_funding', 'no token: the source of live money', 'RUB', 0, 0, 'funding', 1);
