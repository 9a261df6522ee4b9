-- A live shopper's passkeys (WebAuthn, relying party: the checkout's own origin). Each is
-- found by its credential id when the browser offers it (a discoverable sign-in: no e-mail
-- typed); `passkey` is the verifying half as webauthn-rs keeps it (public key, signature
-- counter), JSON. `user_handle` is the account's WebAuthn user id, the same for all its
-- passkeys (the authenticator gives it back, and it must match).
CREATE TABLE passkeys (
    credential_id  TEXT PRIMARY KEY,            -- base64url, unpadded
    account_id     TEXT NOT NULL REFERENCES accounts (account_id),
    user_handle    TEXT NOT NULL,
    passkey        TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    last_used_at   BIGINT
);
CREATE INDEX passkeys_by_account ON passkeys (account_id);

-- A ceremony begun (a challenge sent to a browser) and not yet finished: the server's half of
-- it, kept in the database (not in memory) so that any instance can finish it, used once, and
-- swept when it expires. `account_id`: whose passkey a registration makes; NULL for a sign-in.
CREATE TABLE passkey_ceremonies (
    ceremony_id    TEXT PRIMARY KEY,
    account_id     TEXT REFERENCES accounts (account_id),
    state          TEXT NOT NULL,
    expires_at     BIGINT NOT NULL
);
