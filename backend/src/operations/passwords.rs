//! Argon2id, for what a person chooses or is mailed: live shoppers' passwords, and the one-time
//! codes (six digits are a million guesses: a stolen copy of the table must cost more to search
//! than a code lives). OWASP's current minimum (19 MiB of memory, 2 passes, 1 lane: the crate's
//! defaults), on a blocking thread: each takes tens of milliseconds of one core.

use std::sync::OnceLock;

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

use crate::operations::accounts::new_secret;
use crate::operations::error::ApiError;
use crate::store::StoreError;

fn failed(error: impl ToString) -> ApiError {
    ApiError::Store(StoreError::Other(error.to_string().into()))
}

/// The PHC string of `secret`'s hash, with a fresh salt.
pub async fn hash(secret: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(secret.as_bytes(), &salt)
            .map(|hash| hash.to_string())
    })
    .await
    .map_err(failed)?
    .map_err(failed)
}

/// Whether `secret` is the one `hash` was made from.
pub async fn verify(secret: String, hash: String) -> Result<bool, ApiError> {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash)
            .map(|parsed| {
                Argon2::default()
                    .verify_password(secret.as_bytes(), &parsed)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .map_err(failed)
}

/// A hash of nothing anyone knows, made once: what is checked when there is nothing to check
/// against (an unknown e-mail, no live code), so that it costs what a wrong guess costs and the
/// two cannot be told apart by time.
pub async fn decoy() -> Result<&'static str, ApiError> {
    static DECOY: OnceLock<String> = OnceLock::new();
    if let Some(hash) = DECOY.get() {
        return Ok(hash);
    }
    let made = hash(new_secret("decoy_")).await?;
    Ok(DECOY.get_or_init(|| made))
}
