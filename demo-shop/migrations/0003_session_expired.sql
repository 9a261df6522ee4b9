-- When the checkout said the order's session lapsed unpaid (`checkout_session.expired`): the
-- order can no longer be paid (the shopper orders again). A payment that was made before the
-- lapse still wins: `state` stays the truth about money, this only says why nothing came.
ALTER TABLE orders ADD COLUMN session_expired_at INTEGER;
