-- A live shopper owns the e-mail it signs in with: a sign-up becomes an account only once the
-- code mailed to the address is entered, and a recovery is a code to the confirmed address.
-- Shoppers from before this migration never proved their address: they stay unconfirmed (no
-- deposit, no live payment) until they sign up again with it and enter the code.
ALTER TABLE shoppers ADD COLUMN confirmed_at BIGINT;

-- One live code per (address, purpose), kept as its Argon2id hash: 6 digits are few, so a copy
-- of this table must cost more to search than the code lives (see operations/codes.rs). A
-- sign-up's chosen password waits here (hashed) and reaches the account only with the code.
CREATE TABLE email_codes (
    email          TEXT NOT NULL,
    purpose        TEXT NOT NULL CHECK (purpose IN ('sign_up', 'recovery')),
    code_hash      TEXT NOT NULL,
    password_hash  TEXT,
    attempts       BIGINT NOT NULL DEFAULT 0,
    expires_at     BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (email, purpose)
);
