//! Shoppers, of two kinds. A **test shopper** is made by anyone, holds 1 000,00 ₽ of test money,
//! and pays test sessions only. A **live shopper** signs up and signs in with an e-mail and a
//! password (kept as an Argon2id hash) on the checkout's own origin; each sign-in is a token
//! (stored as its hash) that expires (see [`SignInLimits`]) or is revoked by «Выйти»; its money
//! comes only from an operator's deposit, and it pays live sessions only.
//!
//! [`SignInLimits`]: crate::operations::accounts::SignInLimits

use std::sync::OnceLock;

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::Serialize;

use crate::operations::accounts::{DEFAULT_CURRENCY, new_secret, token_hash};
use crate::operations::error::ApiError;
use crate::store::{AccountKind, EntryKind, LedgerEntry, Store, StoreError};
use crate::{clock, ids};

/// A test shopper's opening balance: 1 000,00 ₽ of test money.
pub const TEST_OPENING_BALANCE: i64 = 100_000;
const MIN_PASSWORD_CHARS: usize = 8;
const MAX_PASSWORD_BYTES: usize = 256;

/// A shopper's credential as handed over once: the token, and the account it acts for.
#[derive(Clone, Debug)]
pub struct SignedIn {
    pub token: String,
    pub account_id: String,
}

/// A fresh test shopper with its opening credit, in one transaction so that balance ==
/// sum(ledger) holds from its first moment.
pub async fn new_test_shopper(store: &Store) -> Result<SignedIn, StoreError> {
    let account_id = ids::new_id("acc_");
    let token = new_secret("tok_test_");
    let now_ms = clock::now_ms();
    let (account, hash) = (account_id.clone(), token_hash(&token));
    store
        .write(move |tx| {
            Box::pin(async move {
                tx.insert_account(
                    &account,
                    &hash,
                    AccountKind::Shopper,
                    false,
                    DEFAULT_CURRENCY,
                    TEST_OPENING_BALANCE,
                    now_ms,
                )
                .await?;
                tx.insert_ledger(&LedgerEntry {
                    account_id: &account,
                    amount: TEST_OPENING_BALANCE,
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
    Ok(SignedIn { token, account_id })
}

/// An e-mail as the checkout keeps it: trimmed, lower-cased, one `@` with text on both sides.
pub fn normalize_email(email: &str) -> Result<String, ApiError> {
    let email = email.trim().to_lowercase();
    let valid = email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(email.split_once('@'), Some((user, domain))
            if !user.is_empty() && domain.contains('.') && !domain.contains('@'));
    if valid {
        Ok(email)
    } else {
        Err(ApiError::InvalidRequest(
            "email must be an e-mail address (name@example.ru)".into(),
        ))
    }
}

fn check_password(password: &str) -> Result<(), ApiError> {
    if password.chars().count() < MIN_PASSWORD_CHARS || password.len() > MAX_PASSWORD_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "password must be at least {MIN_PASSWORD_CHARS} characters (and at most {MAX_PASSWORD_BYTES} bytes)"
        )));
    }
    Ok(())
}

/// Argon2id with OWASP's current minimum (19 MiB of memory, 2 passes, 1 lane: the crate's
/// defaults), on a blocking thread: it takes tens of milliseconds of one core.
async fn hash_password(password: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|hash| hash.to_string())
    })
    .await
    .map_err(|e| StoreError::Other(e.to_string().into()))?
    .map_err(|e| ApiError::Store(StoreError::Other(e.to_string().into())))
}

/// Whether `password` is the one `hash` was made from, on a blocking thread.
async fn verify_password(password: String, hash: String) -> Result<bool, ApiError> {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash)
            .map(|parsed| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .map_err(|e| ApiError::Store(StoreError::Other(e.to_string().into())))
}

/// A hash of no one's password, made once: an unknown e-mail is checked against it, so that
/// it costs what a wrong password costs and the two cannot be told apart by time.
async fn decoy_hash() -> Result<&'static str, ApiError> {
    static DECOY: OnceLock<String> = OnceLock::new();
    if let Some(hash) = DECOY.get() {
        return Ok(hash);
    }
    let made = hash_password(new_secret("decoy_")).await?;
    Ok(DECOY.get_or_init(|| made))
}

/// A new live shopper (no money yet: an operator deposits it), signed in.
pub async fn sign_up(store: &Store, email: &str, password: &str) -> Result<SignedIn, ApiError> {
    let email = normalize_email(email)?;
    check_password(password)?;
    let hash = hash_password(password.to_owned()).await?;
    let account_id = ids::new_id("acc_");
    let now_ms = clock::now_ms();
    let account = account_id.clone();
    let created = store
        .write(move |tx| {
            Box::pin(async move {
                // A live shopper has no bearer token of its own: it signs in.
                tx.insert_account(
                    &account,
                    &format!("no token: signs in ({account})"),
                    AccountKind::Shopper,
                    true,
                    DEFAULT_CURRENCY,
                    0,
                    now_ms,
                )
                .await?;
                tx.insert_shopper(&account, &email, &hash, now_ms).await
            })
        })
        .await?;
    if !created {
        return Err(ApiError::EmailTaken);
    }
    start_sign_in(store, account_id).await
}

/// A sign-in by e-mail and password: a new token. A wrong password and an unknown e-mail are
/// the same answer after the same work.
pub async fn sign_in(store: &Store, email: &str, password: &str) -> Result<SignedIn, ApiError> {
    let email = normalize_email(email).map_err(|_| ApiError::InvalidCredentials)?;
    let found = store.shopper_by_email(&email).await?;
    let hash = match &found {
        Some((_, hash)) => hash.clone(),
        None => decoy_hash().await?.to_owned(),
    };
    let matches = verify_password(password.to_owned(), hash).await?;
    match found {
        Some((account_id, _)) if matches => start_sign_in(store, account_id).await,
        _ => Err(ApiError::InvalidCredentials),
    }
}

async fn start_sign_in(store: &Store, account_id: String) -> Result<SignedIn, ApiError> {
    let token = new_secret("tok_live_");
    store
        .insert_sign_in(&token_hash(&token), &account_id, clock::now_ms())
        .await?;
    Ok(SignedIn { token, account_id })
}

/// «Выйти»: this sign-in's token stops working.
pub async fn sign_out(store: &Store, token: &str) -> Result<(), ApiError> {
    store
        .revoke_sign_in(&token_hash(token), clock::now_ms())
        .await?;
    Ok(())
}

/// What `checkout-server shopper show` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ShopperView {
    pub account_id: String,
    pub email: String,
    pub balance: i64,
    pub currency: String,
    pub livemode: bool,
}

pub async fn show(store: &Store, email: &str) -> Result<ShopperView, ApiError> {
    let email = normalize_email(email)?;
    let Some((account_id, _)) = store.shopper_by_email(&email).await? else {
        return Err(ApiError::NotFound(format!("there is no shopper {email}")));
    };
    let account = store
        .account(&account_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("there is no shopper {email}")))?;
    Ok(ShopperView {
        account_id,
        email,
        balance: account.balance,
        currency: account.currency,
        livemode: account.livemode,
    })
}
