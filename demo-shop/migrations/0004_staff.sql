-- The staff's signed-in sessions: a random token in an HttpOnly, SameSite=Strict cookie (kept
-- here only as its SHA-256), and the session's CSRF token, which every back office form carries.
CREATE TABLE staff_sessions (
    token_hash  TEXT PRIMARY KEY,
    csrf        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
