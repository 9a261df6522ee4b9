-- Rotation without a gap. A rolled secret key stops at once, unless the operator asks for an
-- overlap (`shop roll-key --overlap 1h`): then the old key's hash waits here, working until
-- `expires_at`. A rolled signing secret (`shop roll-webhook-secret --overlap 24h`) keeps signing
-- beside the new one until its overlap ends, so a shop's endpoint can move to the new one while
-- every event still verifies with the old (Standard Webhooks: one signature per secret).
CREATE TABLE retired_keys (
    token_hash  TEXT PRIMARY KEY,               -- SHA-256 of the old key, never the key
    account_id  TEXT NOT NULL REFERENCES accounts (account_id),
    expires_at  BIGINT NOT NULL
);
CREATE INDEX retired_keys_account ON retired_keys (account_id);
ALTER TABLE shops ADD COLUMN old_signing_secret TEXT;
ALTER TABLE shops ADD COLUMN old_signing_secret_until BIGINT;
