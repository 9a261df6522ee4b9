-- The inbox: each event the checkout sent, by its `webhook-id`, claimed and recorded in the
-- transaction of its effect, through the same protocol as the checkout's own keyed requests
-- (checkout-idempotency). A redelivered event finds its row and changes nothing.
CREATE TABLE inbox (
    sender           TEXT NOT NULL,              -- who sent it: 'checkout'
    webhook_id       TEXT NOT NULL,
    claim_id         TEXT NOT NULL,
    request_hash     TEXT NOT NULL,
    request_body     TEXT,                       -- the event, as canonical JSON
    status           TEXT NOT NULL CHECK (status IN ('in_progress', 'done')),
    response_status  INTEGER,
    response_body    TEXT,
    created_at       INTEGER NOT NULL,
    PRIMARY KEY (sender, webhook_id)
);

-- Loyalty bonus per order, written as a state ("bonus for order X: N points"), never added to:
-- applying the same event twice could not double it even without the inbox.
CREATE TABLE bonuses (
    order_id    TEXT PRIMARY KEY REFERENCES orders (id),
    points      INTEGER NOT NULL CHECK (points >= 0),
    updated_at  INTEGER NOT NULL
);

-- How the shop learned the order was paid: its page's confirmation, or the checkout's webhook.
ALTER TABLE orders ADD COLUMN paid_via TEXT CHECK (paid_via IN ('page', 'webhook'));
