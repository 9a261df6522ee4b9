-- A shop's control of its endpoint, per mode: which event types it takes (`event_types`, a list
-- written `,a,b,`; empty: every type), whether it is disabled (by its owner, or by the checkout
-- after it failed for days: `webhook_disabled_at` and why), and since when it has failed without
-- a success between (`webhook_failing_since`).
ALTER TABLE shops ADD COLUMN event_types TEXT NOT NULL DEFAULT '';
ALTER TABLE shops ADD COLUMN webhook_disabled_at BIGINT;
ALTER TABLE shops ADD COLUMN webhook_disabled_reason TEXT;
ALTER TABLE shops ADD COLUMN webhook_failing_since BIGINT;

-- Two events that are the endpoint's own business: a test its owner sends, and the alert that
-- the checkout disabled it. An event of a type the endpoint does not take is `filtered`: listed,
-- never sent unless asked for again.
ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_type_check;
ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_type_check
    CHECK (type IN ('payment.succeeded', 'refund.succeeded', 'checkout_session.expired',
                    'deposit.succeeded', 'webhook.test', 'webhook_endpoint.disabled'));
ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_status_check;
ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_status_check
    CHECK (status IN ('pending', 'delivered', 'dead', 'no_endpoint', 'filtered'));
