//! Deposits: live money entering a live shopper's account from the funding account, by an
//! operator, in double entry (the funding account's balance is minus all it funded).

use super::row::Arg;
use super::{StoreError, Tx};

pub const INSERT_DEPOSIT: &str = "\
    INSERT INTO deposits (deposit_id, account_id, amount, balance_after, idempotency_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6)";

/// One side of a deposit in the ledger (the shopper's carries the key's claim).
pub const INSERT_DEPOSIT_LEDGER: &str = "\
    INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, deposit_id, created_at) \
    VALUES ($1, $2, 'deposit', $3, $4, $5, $6)";

/// A live shopper by e-mail, inside a transaction: the account, its address, whether it is
/// confirmed.
pub const LIVE_SHOPPER_BY_EMAIL: &str = "\
    SELECT s.account_id, s.email, s.confirmed_at FROM shoppers s \
      JOIN accounts a ON a.account_id = s.account_id \
     WHERE s.email = $1 AND a.livemode = 1";

/// The same, by account id.
pub const LIVE_SHOPPER_BY_ACCOUNT: &str = "\
    SELECT s.account_id, s.email, s.confirmed_at FROM shoppers s \
      JOIN accounts a ON a.account_id = s.account_id \
     WHERE s.account_id = $1 AND a.livemode = 1";

/// Who a deposit would go to.
pub struct LiveShopper {
    pub account_id: String,
    pub email: String,
    /// Only a confirmed address receives money.
    pub confirmed: bool,
}

pub struct NewDeposit<'a> {
    pub deposit_id: &'a str,
    pub account_id: &'a str,
    pub amount: i64,
    pub balance_after: i64,
    pub idempotency_key: &'a str,
    pub created_at: i64,
}

impl Tx {
    /// A live shopper by e-mail, or by account id when `by_account`.
    pub async fn live_shopper(
        &mut self,
        email_or_account: &str,
        by_account: bool,
    ) -> Result<Option<LiveShopper>, StoreError> {
        let statement = if by_account {
            LIVE_SHOPPER_BY_ACCOUNT
        } else {
            LIVE_SHOPPER_BY_EMAIL
        };
        self.fetch_optional(statement, &[Arg::Text(email_or_account)], |row| {
            Ok(LiveShopper {
                account_id: row.text("account_id")?,
                email: row.text("email")?,
                confirmed: row.opt_int("confirmed_at")?.is_some(),
            })
        })
        .await
    }

    pub async fn insert_deposit(&mut self, deposit: &NewDeposit<'_>) -> Result<(), StoreError> {
        self.execute(
            INSERT_DEPOSIT,
            &[
                Arg::Text(deposit.deposit_id),
                Arg::Text(deposit.account_id),
                Arg::Int(deposit.amount),
                Arg::Int(deposit.balance_after),
                Arg::Text(deposit.idempotency_key),
                Arg::Int(deposit.created_at),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn insert_deposit_ledger(
        &mut self,
        account_id: &str,
        amount: i64,
        claim: Option<&checkout_idempotency::Claim>,
        deposit_id: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            INSERT_DEPOSIT_LEDGER,
            &[
                Arg::Text(account_id),
                Arg::Int(amount),
                Arg::OptText(claim.map(|c| c.key.as_str())),
                Arg::OptText(claim.map(|c| c.claim_id.as_str())),
                Arg::Text(deposit_id),
                Arg::Int(now_ms),
            ],
        )
        .await
        .map(|_| ())
    }
}
