-- The payment page runs in a frame on the checkout's origin: a shop registers the origins of its
-- pages that may frame it (a JSON array of origins, `[]`: none, not framable), and a session may
-- name where its full page returns the shopper after the outcome.
ALTER TABLE shops ADD COLUMN origins TEXT NOT NULL DEFAULT '[]';
ALTER TABLE checkout_sessions ADD COLUMN return_url TEXT;
