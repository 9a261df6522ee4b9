-- The delivery worker's claim looks at each shop's first due events and at the ones it has in
-- flight, never at the whole backlog: with thousands of events waiting, a claim costs what a
-- handful of rows cost.
CREATE INDEX webhook_events_shop_due
    ON webhook_events (shop_account_id, next_attempt_at, seq) WHERE status = 'pending';
CREATE INDEX webhook_events_shop_leased
    ON webhook_events (shop_account_id, locked_until)
 WHERE status = 'pending' AND locked_until IS NOT NULL;
