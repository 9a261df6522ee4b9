//! Deposits: the only way live money comes into being. An operator moves it from the funding
//! account to a live shopper whose e-mail is confirmed (`checkout-server shopper deposit
//! --account acc_… | --email E --amount KOPECKS --key K`), keyed like every money movement: the same key again replays the first answer, another
//! amount under it is refused. Written in double entry (the funding account goes below zero by
//! what it funded) with its event, in one transaction through the protocol.

use checkout_idempotency::{Claim, Decision, KeyedRequest, NoHooks, Operation, Outcome, Protocol};
use serde::Serialize;
use serde_json::json;

use crate::operations::answers;
use crate::operations::error::OperationError;
use crate::operations::events;
use crate::operations::shoppers::normalize_email;
use crate::store::accounts::FUNDING_ACCOUNT;
use crate::store::{NewDeposit, Store, Tx};
use crate::{clock, ids};

/// The route a deposit's key is fingerprinted with (it has no HTTP route: only the operator's
/// command makes one).
pub const ROUTE: &str = "shopper deposit";
/// The most one deposit may be: 10 000 000,00 ₽.
pub const MAX_DEPOSIT: i64 = 1_000_000_000;

/// Who a deposit is for, as the operator named it.
#[derive(Clone, Debug)]
pub enum Recipient {
    /// A live shopper's account id (`acc_…`).
    Account(String),
    /// A live shopper's e-mail: it names an account only once the shopper confirmed it.
    Email(String),
}

/// A validated deposit.
#[derive(Debug)]
pub struct Deposit {
    pub to: Recipient,
    pub amount: i64,
}
/// What a deposit answers (and its event carries).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DepositDone {
    pub deposit_id: String,
    pub account_id: String,
    pub email: String,
    pub amount: i64,
    pub currency: String,
    /// The shopper's balance right after it.
    pub balance: i64,
    pub created_at: String,
    pub livemode: bool,
}

impl Deposit {
    pub fn validate(to: Recipient, amount: i64) -> Result<Deposit, OperationError> {
        if !(1..=MAX_DEPOSIT).contains(&amount) {
            return Err(OperationError::InvalidRequest(format!(
                "amount must be 1 to {MAX_DEPOSIT} kopecks"
            )));
        }
        let to = match to {
            Recipient::Email(email) => Recipient::Email(normalize_email(&email)?),
            Recipient::Account(id) if id.starts_with("acc_") => Recipient::Account(id),
            Recipient::Account(id) => {
                return Err(OperationError::InvalidRequest(format!(
                    "{id} is not an account id (acc_…)"
                )));
            }
        };
        Ok(Deposit { to, amount })
    }

    /// What the key's fingerprint is taken over: the recipient as named, and the amount.
    fn body(&self) -> serde_json::Value {
        match &self.to {
            Recipient::Email(email) => json!({ "email": email, "amount": self.amount }),
            Recipient::Account(id) => json!({ "account_id": id, "amount": self.amount }),
        }
    }
}

impl Operation<Tx> for Deposit {
    type Error = OperationError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, OperationError> {
        let (named, by_account) = match &self.to {
            Recipient::Account(id) => (id, true),
            Recipient::Email(email) => (email, false),
        };
        let Some(found) = tx.live_shopper(named, by_account).await? else {
            return Err(OperationError::NotFound(format!(
                "there is no live shopper {named}; they sign up in the payment page first"
            )));
        };
        // Money reaches only the owner of the address: never an account whose e-mail was not
        // proved with the code mailed to it.
        if !found.confirmed {
            return Err(OperationError::EmailUnconfirmed(format!(
                "the live shopper {named} has not confirmed the e-mail {}; nothing was deposited \
                 (they sign up again with it and enter the code mailed to it)",
                found.email
            )));
        }
        let (shopper, email) = (found.account_id, found.email);
        let deposit_id = ids::new_id("dep_");
        let balance = tx.credit(&shopper, self.amount).await?;
        tx.credit(FUNDING_ACCOUNT, -self.amount).await?;
        tx.insert_deposit(&NewDeposit {
            deposit_id: &deposit_id,
            account_id: &shopper,
            amount: self.amount,
            balance_after: balance,
            idempotency_key: &claim.key,
            created_at: claim.now_ms,
        })
        .await?;
        for (account_id, amount, keyed_side) in [
            (shopper.as_str(), self.amount, Some(claim)),
            (FUNDING_ACCOUNT, -self.amount, None),
        ] {
            tx.insert_deposit_ledger(account_id, amount, keyed_side, &deposit_id, claim.now_ms)
                .await?;
        }
        let done = DepositDone {
            deposit_id,
            account_id: shopper,
            email,
            amount: self.amount,
            currency: crate::operations::authentication::DEFAULT_CURRENCY.into(),
            balance,
            created_at: clock::rfc3339(claim.now_ms),
            livemode: true,
        };
        let data = serde_json::to_value(&done).expect("a deposit serializes");
        events::deposit_succeeded(tx, &done.deposit_id, data, claim.now_ms).await?;
        Ok(Decision::Respond(answers::created(&done)))
    }
}

/// Runs a deposit under the operator's key: the first answer, or its replay. A key used before
/// for another deposit is [`OperationError::KeyReused`].
pub async fn deposit(
    store: &Store,
    protocol: &Protocol,
    key: &str,
    to: Recipient,
    amount: i64,
) -> Result<(DepositDone, bool), OperationError> {
    let deposit = Deposit::validate(to, amount)?;
    checkout_shared::IdempotencyKey::parse(key)
        .map_err(|error| OperationError::InvalidRequest(error.to_string()))?;
    let body = deposit.body();
    let keyed = KeyedRequest {
        scope: FUNDING_ACCOUNT,
        key,
        method: "POST",
        route: ROUTE,
        body: &body,
    };
    let protocol = protocol.clone().with_hooks(std::sync::Arc::new(NoHooks));
    let (response, replayed) = match protocol.execute(store, keyed, deposit).await? {
        Outcome::Executed { response, .. } => (response, false),
        Outcome::Replayed { response, .. } => (response, true),
        Outcome::KeyReused { fields, .. } => return Err(OperationError::KeyReused(fields)),
        Outcome::InUse => return Err(OperationError::KeyInUse),
        Outcome::TryAgain => return Err(OperationError::Contended),
    };
    if response.status != 201 {
        return Err(OperationError::InvalidRequest(response.body));
    }
    let done = serde_json::from_str(&response.body).map_err(|e| {
        OperationError::Store(crate::store::StoreError::Other(e.to_string().into()))
    })?;
    Ok((done, replayed))
}
