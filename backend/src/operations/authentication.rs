//! Accounts: who the caller is (a test shopper's token, a live shopper's sign-in, or a shop's
//! secret key of one mode, each stored only as its hash), of which mode, and their balance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::operations::error::OperationError;
use crate::store::{AccountKind, Store};

pub const DEFAULT_CURRENCY: &str = "RUB";

/// The authenticated account a request acts for: a shopper or a shop.
#[derive(Clone, Debug)]
pub struct Principal {
    pub account_id: String,
    pub currency: String,
    pub kind: AccountKind,
    /// Live money (`true`) or test money.
    pub livemode: bool,
    /// A shop's registered origins (its pages; where its `return_url`s may lead); none for
    /// others.
    pub origins: Vec<String>,
}

impl Principal {
    /// Only shoppers pay.
    pub fn as_shopper(&self) -> Result<&Principal, OperationError> {
        match self.kind {
            AccountKind::Shopper => Ok(self),
            _ => Err(OperationError::Forbidden(
                "only a shopper can do this; a shop acts with its secret key on its own endpoints"
                    .into(),
            )),
        }
    }

    /// Only shops create checkout sessions and refund.
    pub fn as_shop(&self) -> Result<&Principal, OperationError> {
        match self.kind {
            AccountKind::Shop => Ok(self),
            _ => Err(OperationError::Forbidden(
                "only a shop can do this, with its secret key (sk_…)".into(),
            )),
        }
    }
}

/// How long a live shopper's sign-in lasts: unused for `idle`, or older than `absolute`, it
/// stops working.
#[derive(Clone, Copy, Debug)]
pub struct SignInLimits {
    pub idle: Duration,
    pub absolute: Duration,
}

impl Default for SignInLimits {
    fn default() -> Self {
        SignInLimits {
            idle: Duration::from_secs(30 * 60),
            absolute: Duration::from_secs(12 * 3600),
        }
    }
}

/// A sign-in's last use is written again only after this long (not at every request).
const TOUCH_EVERY_MS: i64 = 60_000;

/// Recently seen test shoppers' tokens, so that a test payment costs no database round trip to
/// authenticate: such a token names the same account for ever, so a cached entry cannot be
/// wrong. Nothing else is cached: a shop's key is rolled and a live shopper's sign-in expires or
/// is revoked, and every instance must see that at once (a key rolled with an overlap is found
/// among the retired keys until the overlap ends).
#[derive(Debug, Default)]
pub struct PrincipalCache {
    entries: Mutex<HashMap<String, (Principal, Instant)>>,
    limits: SignInLimits,
}

impl PrincipalCache {
    const TTL: Duration = Duration::from_secs(60);
    const CAPACITY: usize = 10_000;

    pub fn new(limits: SignInLimits) -> Self {
        PrincipalCache {
            entries: Mutex::default(),
            limits,
        }
    }

    /// How long a sign-in lasts (a live shopper's, a shop member's).
    pub fn limits(&self) -> SignInLimits {
        self.limits
    }

    /// The account holding the token with this hash, from the cache or the database.
    pub async fn authenticate(
        &self,
        store: &Store,
        token_hash: &str,
    ) -> Result<Principal, OperationError> {
        if let Some(principal) = self.get(token_hash) {
            return Ok(principal);
        }
        let now = crate::clock::now_ms();
        let holder = store
            .account_by_token_hash(token_hash, now)
            .await?
            .ok_or(OperationError::Unauthorized)?;
        let principal = Principal {
            account_id: holder.account_id,
            currency: holder.currency,
            kind: holder.kind,
            livemode: holder.livemode,
            origins: holder.origins,
        };
        // A live shopper from before e-mail codes, never confirmed: no live money moves for it.
        if !holder.confirmed {
            return Err(OperationError::EmailUnconfirmed(
                "this shopper has not confirmed its e-mail: sign up again with it and enter the \
                 code mailed to it"
                    .into(),
            ));
        }
        let Some((signed_in_at, last_used_at)) = holder.sign_in else {
            if principal.kind == AccountKind::Shopper && !principal.livemode {
                self.put(token_hash.to_owned(), principal.clone());
            }
            return Ok(principal);
        };
        let within = |since: i64, limit: Duration| now - since < limit.as_millis() as i64;
        if !within(signed_in_at, self.limits.absolute) || !within(last_used_at, self.limits.idle) {
            return Err(OperationError::Unauthorized);
        }
        if now - last_used_at >= TOUCH_EVERY_MS && !store.touch_sign_in(token_hash, now).await? {
            return Err(OperationError::Unauthorized);
        }
        Ok(principal)
    }

    fn get(&self, token_hash: &str) -> Option<Principal> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(token_hash)
            .filter(|(_, at)| at.elapsed() < Self::TTL)
            .map(|(principal, _)| principal.clone())
    }

    fn put(&self, token_hash: String, principal: Principal) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= Self::CAPACITY {
            entries.retain(|_, (_, at)| at.elapsed() < Self::TTL);
            if entries.len() >= Self::CAPACITY {
                entries.clear();
            }
        }
        entries.insert(token_hash, (principal, Instant::now()));
    }
}

/// Tokens and secret keys are random (244 bits), so one unsalted SHA-256 is enough to make a
/// stolen copy of the database useless for logging in.
pub fn token_hash(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

/// A new random credential: `prefix` and 244 random bits in hex.
pub fn new_secret(prefix: &str) -> String {
    format!(
        "{prefix}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}
