-- A message that issues a receipt keeps its key on that receipt (whose event_id is the message
-- id already): the queue it came from and its fingerprint, beside it. The inbox keeps only the
-- claims in progress and the other outcomes (a refusal): a row of the inbox per message was
-- half of what a message wrote. Receipts issued before keep their key in the inbox, where it
-- already is.
ALTER TABLE receipts ADD COLUMN consumer TEXT;
ALTER TABLE receipts ADD COLUMN request_hash TEXT;
