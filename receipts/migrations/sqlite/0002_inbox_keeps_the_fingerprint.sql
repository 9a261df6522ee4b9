-- The inbox keeps each message's fingerprint (request_hash), not the event itself: the event is
-- the checkout's, and its receipt records what it said. A message id that comes again with
-- another body is still told by the fingerprint (and dead-lettered); only the names of the
-- fields that differ are not given. Half of what the inbox wrote per message was this copy.
-- Its rows, small now, live in their key's own B-tree (WITHOUT ROWID): one tree written per
-- message instead of a table and its key's index.
CREATE TABLE inbox_by_key (
    consumer         TEXT NOT NULL,              -- whose inbox: the queue's name
    message_id       TEXT NOT NULL,
    claim_id         TEXT NOT NULL,
    request_hash     TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('in_progress', 'done')),
    response_status  INTEGER,
    response_body    TEXT,
    created_at       INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
INSERT INTO inbox_by_key (consumer, message_id, claim_id, request_hash, status, response_status,
                          response_body, created_at)
SELECT consumer, message_id, claim_id, request_hash, status, response_status, response_body,
       created_at
  FROM inbox;
DROP TABLE inbox;
ALTER TABLE inbox_by_key RENAME TO inbox;
