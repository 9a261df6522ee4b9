-- A message that issues a receipt keeps its key on that receipt (whose event_id is the message
-- id already): the queue it came from and its fingerprint, beside it. The inbox keeps only the
-- claims in progress and the other outcomes (a refusal): a second row for every message was
-- what the inbox cost PostgreSQL (a heap tuple, an index entry and their WAL records, whatever
-- their width). Receipts issued before keep their key in the inbox, where it already is.
ALTER TABLE receipts ADD COLUMN consumer TEXT, ADD COLUMN request_hash TEXT,
    ADD CONSTRAINT receipts_key_whole CHECK ((consumer IS NULL) = (request_hash IS NULL));
