//! Accounts: who the caller is (a bearer token, stored only as its hash), their balance, and
//! demo shoppers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use checkout_shared::{Account, DemoSession};
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::error::ApiError;
use crate::store::{EntryKind, LedgerEntry, Store};
use crate::{clock, ids};

/// A demo shopper's opening balance: 1 000,00 ₽.
pub const DEMO_OPENING_BALANCE: i64 = 100_000;
pub const DEFAULT_CURRENCY: &str = "RUB";

/// The authenticated account a request acts for.
#[derive(Clone, Debug)]
pub struct Principal {
    pub account_id: String,
    pub currency: String,
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
        let (account_id, currency) = store
            .account_by_token_hash(token_hash)
            .await?
            .ok_or(ApiError::Unauthorized)?;
        let principal = Principal {
            account_id,
            currency,
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

/// Tokens are random (244 bits), so one unsalted SHA-256 is enough to make a stolen copy of
/// the database useless for logging in.
pub fn token_hash(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

/// `GET /api/account`
pub async fn get(
    State(app): State<AppState>,
    principal: Principal,
) -> Result<Json<Account>, ApiError> {
    let row = app
        .store
        .account(&principal.account_id)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    Ok(Json(Account {
        account_id: row.account_id,
        balance: row.balance,
        currency: row.currency,
    }))
}

/// `POST /api/demo/session`: a fresh account with its opening credit, in one transaction so
/// that balance == sum(ledger) holds from its first moment.
pub async fn create_demo_session(
    State(app): State<AppState>,
) -> Result<Json<DemoSession>, ApiError> {
    if !app.demo {
        return Err(ApiError::NotFound(
            "demo mode is off (set CHECKOUT_DEMO=1)".into(),
        ));
    }
    let account_id = ids::new_id("acc_");
    let token = format!(
        "tok_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let now_ms = clock::now_ms();
    let (account, hash) = (account_id.clone(), token_hash(&token));
    app.store
        .write(move |tx| {
            Box::pin(async move {
                tx.insert_account(
                    &account,
                    &hash,
                    DEFAULT_CURRENCY,
                    DEMO_OPENING_BALANCE,
                    now_ms,
                )
                .await?;
                tx.insert_ledger(&LedgerEntry {
                    account_id: &account,
                    amount: DEMO_OPENING_BALANCE,
                    kind: EntryKind::Opening,
                    claim: None,
                    payment_id: None,
                    refund_id: None,
                    created_at: now_ms,
                })
                .await
            })
        })
        .await?;
    Ok(Json(DemoSession { token, account_id }))
}
