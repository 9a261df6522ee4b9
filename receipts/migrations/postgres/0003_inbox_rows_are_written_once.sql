-- A batch claims its messages late (checkout-idempotency's `claims_late`): each new message's
-- row is inserted once, done, with its outcome, and never updated after; only a redelivery's
-- fallback (a claim, then its outcome) updates a row. The room 0002 left in every page for the
-- update beside it (`fillfactor = 50`) now only made the inbox twice as many pages.
ALTER TABLE inbox RESET (fillfactor);
