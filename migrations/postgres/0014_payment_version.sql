-- A payment's version: 1 when it is made, one more at each refund. Its events carry the
-- version they leave it at as their `sequence`, so that a receiver can tell an event older than
-- one it already applied (a redelivery, a recovery) and drop it.
ALTER TABLE payments ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
UPDATE payments
   SET version = 1 + (SELECT COUNT(*) FROM refunds r WHERE r.payment_id = payments.payment_id);
