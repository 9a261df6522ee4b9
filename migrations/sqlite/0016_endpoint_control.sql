-- no-transaction
-- A shop's control of its endpoint, per mode: which event types it takes (`event_types`, a list
-- written `,a,b,`; empty: every type), whether it is disabled (by its owner, or by the checkout
-- after it failed for days: `webhook_disabled_at` and why), and since when it has failed without
-- a success between (`webhook_failing_since`). Run with foreign keys off: the events' table is
-- rebuilt (SQLite changes a CHECK only so; see 0003).
ALTER TABLE shops ADD COLUMN event_types TEXT NOT NULL DEFAULT '';
ALTER TABLE shops ADD COLUMN webhook_disabled_at BIGINT;
ALTER TABLE shops ADD COLUMN webhook_disabled_reason TEXT;
ALTER TABLE shops ADD COLUMN webhook_failing_since BIGINT;

-- Two events that are the endpoint's own business: a test its owner sends, and the alert that
-- the checkout disabled it. An event of a type the endpoint does not take is `filtered`: listed,
-- never sent unless asked for again.
CREATE TABLE webhook_events_v2 (
    event_id         TEXT PRIMARY KEY,
    seq              INTEGER NOT NULL UNIQUE,
    shop_account_id  TEXT NOT NULL REFERENCES accounts (account_id),
    type             TEXT NOT NULL CHECK (type IN ('payment.succeeded', 'refund.succeeded',
                                                    'checkout_session.expired', 'deposit.succeeded',
                                                    'webhook.test', 'webhook_endpoint.disabled')),
    subject_id       TEXT NOT NULL,
    body             TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'dead', 'no_endpoint', 'filtered')),
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    locked_until     BIGINT,
    last_error       TEXT,
    delivered_at     BIGINT,
    lease_id         TEXT,
    published_at     BIGINT,
    broker_returns   BIGINT NOT NULL DEFAULT 0,
    broker_retry_at  BIGINT
);
INSERT INTO webhook_events_v2
SELECT event_id, seq, shop_account_id, type, subject_id, body, created_at, status, attempts,
       next_attempt_at, locked_until, last_error, delivered_at, lease_id, published_at,
       broker_returns, broker_retry_at
  FROM webhook_events;
DROP TABLE webhook_events;
ALTER TABLE webhook_events_v2 RENAME TO webhook_events;
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_events_subject ON webhook_events (subject_id, seq);
CREATE INDEX webhook_events_shop ON webhook_events (shop_account_id, seq);
CREATE INDEX webhook_events_unpublished ON webhook_events (seq) WHERE published_at IS NULL;
CREATE INDEX webhook_events_shop_due
    ON webhook_events (shop_account_id, next_attempt_at, seq) WHERE status = 'pending';
CREATE INDEX webhook_events_shop_leased
    ON webhook_events (shop_account_id, locked_until)
 WHERE status = 'pending' AND locked_until IS NOT NULL;
