-- The demo shop's own database: its orders and the refunds its staff asked for.

CREATE TABLE orders (
    id TEXT PRIMARY KEY,                      -- ORD-…, random: unique at the checkout too
    -- The storefront form's one-time token: a cart submitted twice makes one order.
    cart_token TEXT NOT NULL UNIQUE,
    items TEXT NOT NULL,                      -- JSON line items, as sent to the checkout
    amount INTEGER NOT NULL CHECK (amount > 0),
    -- Our Idempotency-Key for creating the order's checkout session: every retry resends it.
    session_key TEXT NOT NULL UNIQUE,
    checkout_session_id TEXT UNIQUE,
    state TEXT NOT NULL DEFAULT 'awaiting_payment'
        CHECK (state IN ('awaiting_payment', 'paid')),
    payment_id TEXT UNIQUE,
    refunded INTEGER NOT NULL DEFAULT 0 CHECK (refunded >= 0 AND refunded <= amount),
    created_at INTEGER NOT NULL,
    paid_at INTEGER,
    CHECK ((state = 'paid') = (payment_id IS NOT NULL))
);

CREATE TABLE refunds (
    -- The back office form's key, sent as the Idempotency-Key: a double click refunds once.
    idempotency_key TEXT PRIMARY KEY,
    order_id TEXT NOT NULL REFERENCES orders (id),
    amount INTEGER NOT NULL CHECK (amount > 0),
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'failed')),
    refund_id TEXT UNIQUE,
    failure TEXT,
    created_at INTEGER NOT NULL
);

CREATE INDEX refunds_by_order ON refunds (order_id, created_at);
