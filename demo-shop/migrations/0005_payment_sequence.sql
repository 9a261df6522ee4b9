-- The highest `sequence` of the order's payment events applied (0: none carried one): a
-- refund's event older than one already applied (a redelivery) leaves the totals as they are.
ALTER TABLE orders ADD COLUMN payment_sequence INTEGER NOT NULL DEFAULT 0;
