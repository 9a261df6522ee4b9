-- Each attempt's lease has an id: only the attempt holding it records how it ended, so that a
-- shop's redelivery request made while an attempt is in flight is not undone by that attempt.
ALTER TABLE webhook_events ADD COLUMN lease_id TEXT;
