-- The money and the keys live in one database so that they commit together.
-- Amounts are integer kopecks; timestamps are Unix milliseconds bound from Rust.

CREATE TABLE accounts (
    account_id  TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,           -- SHA-256 of the bearer token, never the token
    currency    TEXT NOT NULL,
    balance     BIGINT NOT NULL CHECK (balance >= 0),
    created_at  BIGINT NOT NULL
);

-- Every change of a balance is one row here: balance == sum(amount) per account, always.
CREATE TABLE ledger (
    entry_id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    amount           BIGINT NOT NULL,           -- signed: a debit is negative
    kind             TEXT NOT NULL CHECK (kind IN ('opening', 'payment', 'refund')),
    idempotency_key  TEXT,                      -- the key that moved the money (NULL for opening)
    claim_id         TEXT UNIQUE,               -- one money movement per claim of a key
    payment_id       TEXT,
    refund_id        TEXT,
    created_at       BIGINT NOT NULL
);
CREATE INDEX ledger_account ON ledger (account_id);

CREATE TABLE payments (
    payment_id       TEXT PRIMARY KEY,
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    order_id         TEXT NOT NULL,
    amount           BIGINT NOT NULL CHECK (amount > 0),
    currency         TEXT NOT NULL,
    refunded         BIGINT NOT NULL DEFAULT 0 CHECK (refunded >= 0 AND refunded <= amount),
    balance_after    BIGINT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    UNIQUE (account_id, order_id)               -- an order is paid at most once
);

CREATE TABLE refunds (
    refund_id             TEXT PRIMARY KEY,
    payment_id            TEXT NOT NULL REFERENCES payments (payment_id),
    amount                BIGINT NOT NULL CHECK (amount > 0),
    refunded_total_after  BIGINT NOT NULL,
    balance_after         BIGINT NOT NULL,
    idempotency_key       TEXT NOT NULL,
    created_at            BIGINT NOT NULL
);
CREATE INDEX refunds_payment ON refunds (payment_id);

-- Keys are scoped per account: the same string from two accounts is two keys.
-- A claim's row is written and completed inside the transaction that moves the money.
CREATE TABLE idempotency_keys (
    account_id       TEXT NOT NULL REFERENCES accounts (account_id),
    idempotency_key  TEXT NOT NULL,
    claim_id         TEXT NOT NULL,
    request_hash     TEXT NOT NULL,             -- catches "same key, other request"
    status           TEXT NOT NULL CHECK (status IN ('in_progress', 'done')),
    response_status  BIGINT,
    response_body    TEXT,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (account_id, idempotency_key),
    CHECK (status = 'in_progress' OR (response_status IS NOT NULL AND response_body IS NOT NULL))
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
