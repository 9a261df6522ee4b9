-- The outbox's events are also published to a broker when CHECKOUT_AMQP_URL is set: when the
-- broker confirmed each (NULL: not yet). Published at least once; the consumers' inboxes absorb
-- a second copy.
ALTER TABLE webhook_events ADD COLUMN published_at BIGINT;
CREATE INDEX webhook_events_unpublished ON webhook_events (seq) WHERE published_at IS NULL;
