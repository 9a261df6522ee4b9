-- The first request's canonical JSON body, kept with its key: a later request under the same
-- key with another body is told which top-level fields differ (never their values).
ALTER TABLE idempotency_keys ADD COLUMN request_body TEXT;
