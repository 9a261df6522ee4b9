//! Shoppers, of two kinds. A **test shopper** is made by anyone, holds 1 000,00 ₽ of test money,
//! and pays test sessions only. A **live shopper** signs up with an e-mail and a password (kept
//! as an Argon2id hash) on the checkout's own origin, and is an account only once it enters the
//! code mailed to that address (so live money reaches only the address's owner); it recovers
//! its account by a code to the same address. Each sign-in is a token
//! (stored as its hash) that expires (see [`SignInLimits`]) or is revoked by «Выйти»; its money
//! comes only from an operator's deposit, and it pays live sessions only.
//!
//! [`SignInLimits`]: crate::operations::authentication::SignInLimits

use checkout_shared::CodeSent;
use serde::Serialize;

use crate::mail::Mailer;
use crate::operations::authentication::{DEFAULT_CURRENCY, new_secret, token_hash};
use crate::operations::error::OperationError;
use crate::operations::{email_codes, passwords};
use crate::store::email_codes::Purpose;
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
pub fn normalize_email(email: &str) -> Result<String, OperationError> {
    let email = email.trim().to_lowercase();
    let valid = email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(email.split_once('@'), Some((user, domain))
            if !user.is_empty() && domain.contains('.') && !domain.contains('@'));
    if valid {
        Ok(email)
    } else {
        Err(OperationError::InvalidRequest(
            "email must be an e-mail address (name@example.ru)".into(),
        ))
    }
}

pub fn check_password(password: &str) -> Result<(), OperationError> {
    if password.chars().count() < MIN_PASSWORD_CHARS || password.len() > MAX_PASSWORD_BYTES {
        return Err(OperationError::InvalidRequest(format!(
            "password must be at least {MIN_PASSWORD_CHARS} characters (and at most {MAX_PASSWORD_BYTES} bytes)"
        )));
    }
    Ok(())
}

/// A live shopper signs up: nothing is made yet but a code, mailed to the address; the account
/// is made (with this password) only when the code comes back ([`confirm_sign_up`]). The answer
/// is the same whether or not the address has an account (to one that has, the mail says so
/// instead of carrying a code), after the same work: two Argon2id hashes and one mail.
pub async fn sign_up(
    store: &Store,
    mailer: Option<&Mailer>,
    email: &str,
    password: Option<&str>,
) -> Result<CodeSent, OperationError> {
    let email = normalize_email(email)?;
    if let Some(password) = password {
        check_password(password)?;
    }
    let code = email_codes::new_code();
    // No password: one that no one knows (so none signs in), the same work as a chosen one.
    let password = password.map_or_else(|| new_secret("nopassword_"), str::to_owned);
    let password_hash = passwords::hash(password).await?;
    let code_hash = passwords::hash(code.clone()).await?;
    let confirmed = has_confirmed_account(store, &email).await?;
    let mail = if confirmed {
        email_codes::already_signed_up()
    } else {
        let now_ms = clock::now_ms();
        email_codes::keep(
            store,
            &email,
            Purpose::SignUp,
            &code_hash,
            Some(&password_hash),
            now_ms,
        )
        .await?;
        email_codes::sign_up_code(&code)
    };
    email_codes::send(mailer, &email, mail).await?;
    Ok(code_sent())
}

/// Whether the address has an account whose owner proved it.
async fn has_confirmed_account(store: &Store, email: &str) -> Result<bool, OperationError> {
    let shopper = store.shopper_by_email(email).await?;
    Ok(shopper.is_some_and(|shopper| shopper.confirmed))
}

fn code_sent() -> CodeSent {
    CodeSent {
        status: "code_sent".into(),
        expires_in: email_codes::CODE_TTL_SECS,
    }
}

/// The sign-up's code comes back: the account is made, confirmed, with the password chosen at
/// sign-up, and signed in. A shopper from before codes existed is confirmed instead (with that
/// password; its old sign-ins end).
pub async fn confirm_sign_up(
    store: &Store,
    email: &str,
    code: &str,
) -> Result<SignedIn, OperationError> {
    let email = normalize_email(email).map_err(|_| OperationError::InvalidCode)?;
    let now_ms = clock::now_ms();
    let kept = email_codes::check(store, &email, Purpose::SignUp, code, now_ms).await?;
    let password_hash = kept.password_hash.ok_or(OperationError::InvalidCode)?;
    let token = new_secret("tok_live_");
    let token_hash = token_hash(&token);
    let new_account = ids::new_id("acc_");
    let account_id = store
        .write(move |tx| {
            Box::pin(async move {
                if !tx
                    .use_code(&email, Purpose::SignUp, &kept.code_hash)
                    .await?
                {
                    return Ok(None); // another request used it first
                }
                let account_id = match tx.shopper_by_email(&email).await? {
                    None => {
                        // A live shopper has no bearer token of its own: it signs in.
                        tx.insert_account(
                            &new_account,
                            &format!("no token: signs in ({new_account})"),
                            AccountKind::Shopper,
                            true,
                            DEFAULT_CURRENCY,
                            0,
                            now_ms,
                        )
                        .await?;
                        if !tx
                            .insert_shopper(&new_account, &email, &password_hash, now_ms)
                            .await?
                        {
                            return Ok(None);
                        }
                        new_account
                    }
                    Some(old) if !old.confirmed => {
                        if !tx
                            .confirm_shopper(&old.account_id, &password_hash, now_ms)
                            .await?
                        {
                            return Ok(None);
                        }
                        tx.revoke_all_sign_ins(&old.account_id, now_ms).await?;
                        old.account_id
                    }
                    Some(_) => return Ok(None), // confirmed meanwhile, with another code
                };
                tx.insert_sign_in(&token_hash, &account_id, now_ms).await?;
                Ok(Some(account_id))
            })
        })
        .await?
        .ok_or(OperationError::InvalidCode)?;
    Ok(SignedIn { token, account_id })
}

/// A confirmed shopper asks to recover its account: a code to the address. The answer is the
/// same for any address (one without a confirmed account is mailed that there is none), after
/// the same work.
pub async fn request_recovery(
    store: &Store,
    mailer: Option<&Mailer>,
    email: &str,
) -> Result<CodeSent, OperationError> {
    let email = normalize_email(email)?;
    let code = email_codes::new_code();
    let code_hash = passwords::hash(code.clone()).await?;
    let confirmed = has_confirmed_account(store, &email).await?;
    let mail = if confirmed {
        let now_ms = clock::now_ms();
        email_codes::keep(store, &email, Purpose::Recovery, &code_hash, None, now_ms).await?;
        email_codes::recovery_code(&code)
    } else {
        email_codes::nothing_to_recover()
    };
    email_codes::send(mailer, &email, mail).await?;
    Ok(code_sent())
}

/// The recovery's code comes back with a new password (or none: the shopper makes a new passkey
/// next, with the sign-in this starts): it is set, every sign-in of the account ends (whoever held one, a thief included, is signed out everywhere), and a new one begins.
pub async fn recover(
    store: &Store,
    email: &str,
    code: &str,
    password: Option<&str>,
) -> Result<SignedIn, OperationError> {
    if let Some(password) = password {
        check_password(password)?;
    }
    let email = normalize_email(email).map_err(|_| OperationError::InvalidCode)?;
    let now_ms = clock::now_ms();
    let kept = email_codes::check(store, &email, Purpose::Recovery, code, now_ms).await?;
    let password_hash = match password {
        Some(password) => Some(passwords::hash(password.to_owned()).await?),
        None => None,
    };
    let token = new_secret("tok_live_");
    let token_hash = token_hash(&token);
    let account_id = store
        .write(move |tx| {
            Box::pin(async move {
                if !tx
                    .use_code(&email, Purpose::Recovery, &kept.code_hash)
                    .await?
                {
                    return Ok(None);
                }
                let Some(shopper) = tx.shopper_by_email(&email).await? else {
                    return Ok(None);
                };
                if let Some(password_hash) = &password_hash {
                    tx.set_password(&shopper.account_id, password_hash).await?;
                }
                tx.revoke_all_sign_ins(&shopper.account_id, now_ms).await?;
                tx.insert_sign_in(&token_hash, &shopper.account_id, now_ms)
                    .await?;
                Ok(Some(shopper.account_id))
            })
        })
        .await?
        .ok_or(OperationError::InvalidCode)?;
    Ok(SignedIn { token, account_id })
}

/// A sign-in by e-mail and password: a new token. A wrong password and an unknown e-mail are
/// the same answer after the same work. The right password of a shopper that never confirmed
/// its e-mail is told so: it signs up again with it, and enters the code.
pub async fn sign_in(
    store: &Store,
    email: &str,
    password: &str,
) -> Result<SignedIn, OperationError> {
    let email = normalize_email(email).map_err(|_| OperationError::InvalidCredentials)?;
    let found = store.shopper_by_email(&email).await?;
    let hash = match &found {
        Some(shopper) => shopper.password_hash.clone(),
        None => passwords::decoy().await?.to_owned(),
    };
    let matches = passwords::verify(password.to_owned(), hash).await?;
    match found {
        Some(shopper) if matches && !shopper.confirmed => Err(unconfirmed(&email)),
        Some(shopper) if matches => start_sign_in(store, shopper.account_id).await,
        _ => Err(OperationError::InvalidCredentials),
    }
}

/// What a shopper that never proved its e-mail is told.
pub fn unconfirmed(email: &str) -> OperationError {
    OperationError::EmailUnconfirmed(format!(
        "the e-mail {email} is not confirmed: sign up again with it and enter the code mailed to it"
    ))
}

async fn start_sign_in(store: &Store, account_id: String) -> Result<SignedIn, OperationError> {
    let token = new_secret("tok_live_");
    store
        .insert_sign_in(&token_hash(&token), &account_id, clock::now_ms())
        .await?;
    Ok(SignedIn { token, account_id })
}

/// «Выйти»: this sign-in's token stops working.
pub async fn sign_out(store: &Store, token: &str) -> Result<(), OperationError> {
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
    /// Whether the shopper proved the e-mail (only then can it be funded and pay).
    pub confirmed: bool,
}

pub async fn show(store: &Store, email: &str) -> Result<ShopperView, OperationError> {
    let email = normalize_email(email)?;
    let missing = || OperationError::NotFound(format!("there is no shopper {email}"));
    let shopper = store.shopper_by_email(&email).await?.ok_or_else(missing)?;
    let account = store
        .account(&shopper.account_id)
        .await?
        .ok_or_else(missing)?;
    Ok(ShopperView {
        account_id: shopper.account_id,
        email,
        balance: account.balance,
        currency: account.currency,
        livemode: account.livemode,
        confirmed: shopper.confirmed,
    })
}
