-- The shop's dashboard: its staff, their sign-ins, who did what, and each delivery attempt.

-- A member of a shop's staff, by e-mail (lower-cased), with one role: an owner manages keys,
-- endpoints and staff; staff also refund; a viewer only looks. `password_hash` (Argon2id, PHC)
-- is NULL until the invitation is accepted.
CREATE TABLE staff (
    staff_id       TEXT PRIMARY KEY,
    shop_id        TEXT NOT NULL,
    email          TEXT NOT NULL,
    role           TEXT NOT NULL CHECK (role IN ('owner', 'staff', 'viewer')),
    password_hash  TEXT,
    created_at     BIGINT NOT NULL,
    UNIQUE (shop_id, email)
);

-- An invitation mailed to an address: its token is in the link, stored here only as its hash,
-- used once, until `expires_at`. `invited_by`: a member's id, or NULL for the operator.
CREATE TABLE staff_invites (
    token_hash   TEXT PRIMARY KEY,
    shop_id      TEXT NOT NULL,
    email        TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('owner', 'staff', 'viewer')),
    invited_by   TEXT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    accepted_at  BIGINT
);

-- A member's sign-in to the dashboard: a cookie's token, stored as its hash; ends unused for the
-- idle limit, older than the absolute one, or when revoked («Выйти»).
CREATE TABLE staff_sign_ins (
    token_hash    TEXT PRIMARY KEY,
    staff_id      TEXT NOT NULL REFERENCES staff (staff_id),
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT NOT NULL,
    revoked_at    BIGINT
);
CREATE INDEX staff_sign_ins_staff ON staff_sign_ins (staff_id);

-- Who did what in a shop's dashboard (or the operator, `staff_id` NULL), newest by `entry_id`.
CREATE TABLE audit_log (
    entry_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    shop_id    TEXT NOT NULL,
    staff_id   TEXT,
    email      TEXT NOT NULL,
    action     TEXT NOT NULL,
    subject    TEXT NOT NULL,
    at         BIGINT NOT NULL
);
CREATE INDEX audit_log_shop ON audit_log (shop_id, entry_id);

-- Every attempt to deliver an event: to which URL, when, how long, what the shop answered (the
-- HTTP status, 0 when none came; the first bytes of its body, or why nothing came).
CREATE TABLE delivery_attempts (
    event_id         TEXT NOT NULL REFERENCES webhook_events (event_id),
    shop_account_id  TEXT NOT NULL,
    url              TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    status      BIGINT NOT NULL,
    latency_ms  BIGINT NOT NULL,
    excerpt     TEXT NOT NULL,
    PRIMARY KEY (event_id, attempt, at)
);
CREATE INDEX delivery_attempts_shop ON delivery_attempts (shop_account_id, at);

-- The dashboard's lists and charts: a shop's payments in the lists' very order (time, then id:
-- a page is a walk down the index that stops after 50, whatever the planner guesses of a date
-- range), the amount in it too (a day's sum reads no table row); by order id (a row or two: no
-- order needed); a payment's ledger rows. Each index is paid for by every payment's insert: no
-- more than these.
CREATE INDEX payments_shop_time ON payments (shop_account_id, created_at, payment_id, amount);
DROP INDEX payments_shop;
CREATE INDEX payments_shop_order ON payments (shop_account_id, order_id);
-- The charts' refunds per day: from the refunds of the days shown, not from all the shop's payments.
CREATE INDEX refunds_time ON refunds (created_at);
CREATE INDEX ledger_payment ON ledger (payment_id);
