-- The consumer's inbox: each message it took from the broker, by `message_id` (the checkout's
-- event id), claimed and completed in the transaction that writes its receipt, through the same
-- protocol as the checkout's keyed requests (checkout-idempotency). A redelivered message finds
-- its row and changes nothing.
CREATE TABLE inbox (
    consumer         TEXT NOT NULL,              -- whose inbox: the queue's name
    message_id       TEXT NOT NULL,
    claim_id         TEXT NOT NULL,
    request_hash     TEXT NOT NULL,
    request_body     TEXT,                       -- the event, as canonical JSON
    status           TEXT NOT NULL CHECK (status IN ('in_progress', 'done')),
    response_status  BIGINT,
    response_body    TEXT,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Fiscal receipts: «приход» for a payment, «возврат прихода» for a refund.
CREATE TABLE receipts (
    receipt_id    TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('income', 'income_return')),
    payment_id    TEXT NOT NULL,
    refund_id     TEXT,
    order_id      TEXT NOT NULL,
    currency      TEXT NOT NULL,
    livemode      BIGINT NOT NULL CHECK (livemode IN (0, 1)),
    lines         TEXT NOT NULL,                 -- JSON: [{name, quantity, unit_price, total}]
    total         BIGINT NOT NULL CHECK (total > 0),
    event_id      TEXT NOT NULL UNIQUE,
    operation_at  TEXT NOT NULL,                 -- when the money moved (the event's time)
    issued_at     BIGINT NOT NULL,              -- ms since the epoch
    CHECK ((kind = 'income') = (refund_id IS NULL))
);
-- The second line of defence behind the inbox: a payment has one «приход», a refund one
-- «возврат прихода», whatever event told of them.
CREATE UNIQUE INDEX receipts_one_per_payment ON receipts (payment_id) WHERE kind = 'income';
CREATE UNIQUE INDEX receipts_one_per_refund ON receipts (refund_id) WHERE refund_id IS NOT NULL;
CREATE INDEX receipts_by_issue ON receipts (issued_at, receipt_id);
