-- An event the broker routed to no queue (published `mandatory`, and returned) is not published:
-- it is offered again later, each time later (1 s, doubling, at most 5 minutes), so that a
-- consumer that binds its queue after the event was written still gets it, and events that are
-- routed are never held up behind it. `broker_returns` counts the returns.
ALTER TABLE webhook_events ADD COLUMN broker_returns BIGINT NOT NULL DEFAULT 0;
ALTER TABLE webhook_events ADD COLUMN broker_retry_at BIGINT;
