-- Events to the shops: a transactional outbox. Each payment, refund and lapsed session writes
-- its event in the transaction that makes it, so there is no event without its change and no
-- change without its event; a worker in every server instance delivers them (webhooks).
CREATE TABLE webhook_events (
    -- The `webhook-id`: stable across retries, the shop's key for its inbox.
    event_id         TEXT PRIMARY KEY,
    -- Delivery order: events of one subject go out in this order.
    seq              BIGSERIAL NOT NULL UNIQUE,
    shop_account_id  TEXT NOT NULL REFERENCES accounts (account_id),
    type             TEXT NOT NULL
        CHECK (type IN ('payment.succeeded', 'refund.succeeded', 'checkout_session.expired')),
    -- A payment's events (its own and its refunds') share its id; a session's, the session's.
    subject_id       TEXT NOT NULL,
    -- The JSON body sent, exactly: the signature covers these bytes.
    body             TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    -- `no_endpoint`: the shop had no webhook URL when it happened (listed, never sent unless
    -- asked for again once it has one).
    status           TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'dead', 'no_endpoint')),
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    -- A worker's lease while it sends: another instance takes the event over only after it.
    locked_until     BIGINT,
    last_error       TEXT,
    delivered_at     BIGINT
);
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_events_subject ON webhook_events (subject_id, seq);
CREATE INDEX webhook_events_shop ON webhook_events (shop_account_id, seq);
