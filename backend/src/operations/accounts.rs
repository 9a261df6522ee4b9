//! Accounts: who the caller is (a shopper's bearer token or a shop's secret key, each stored
//! only as its hash), and their balance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::operations::error::ApiError;
use crate::store::{AccountKind, Store};

pub const DEFAULT_CURRENCY: &str = "RUB";

/// The authenticated account a request acts for: a shopper or a shop.
#[derive(Clone, Debug)]
pub struct Principal {
    pub account_id: String,
    pub currency: String,
    pub kind: AccountKind,
}

impl Principal {
    /// Only shoppers pay.
    pub fn as_shopper(&self) -> Result<&Principal, ApiError> {
        match self.kind {
            AccountKind::Shopper => Ok(self),
            _ => Err(ApiError::Forbidden(
                "only a shopper can do this; a shop acts with its secret key on its own endpoints"
                    .into(),
            )),
        }
    }

    /// Only shops create checkout sessions and refund.
    pub fn as_shop(&self) -> Result<&Principal, ApiError> {
        match self.kind {
            AccountKind::Shop => Ok(self),
            _ => Err(ApiError::Forbidden(
                "only a shop can do this, with its secret key (sk_…)".into(),
            )),
        }
    }
}

/// Recently seen tokens, so that a request costs no database round trip to authenticate. A
/// token always names the same account and an account never changes currency, so a cached
/// entry cannot be wrong; entries still expire, so that a revoked token would stop working.
#[derive(Debug, Default)]
pub struct PrincipalCache {
    entries: Mutex<HashMap<String, (Principal, Instant)>>,
}

impl PrincipalCache {
    const TTL: Duration = Duration::from_secs(60);
    const CAPACITY: usize = 10_000;

    /// The account holding the token with this hash, from the cache or the database.
    pub async fn authenticate(
        &self,
        store: &Store,
        token_hash: &str,
    ) -> Result<Principal, ApiError> {
        if let Some(principal) = self.get(token_hash) {
            return Ok(principal);
        }
        let (account_id, currency, kind) = store
            .account_by_token_hash(token_hash)
            .await?
            .ok_or(ApiError::Unauthorized)?;
        let principal = Principal {
            account_id,
            currency,
            kind,
        };
        self.put(token_hash.to_owned(), principal.clone());
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
