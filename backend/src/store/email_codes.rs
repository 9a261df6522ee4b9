//! One-time codes mailed to a live shopper's address (a sign-up's, a recovery's): one per
//! (address, purpose), kept as a hash, with its expiry and how many tries it has had.

use super::row::Arg;
use super::{Store, StoreError, Tx};

/// A new code for the address replaces any earlier one (and its tries) of the same purpose.
pub const PUT_CODE: &str = "\
    INSERT INTO email_codes (email, purpose, code_hash, password_hash, attempts, expires_at, \
                             created_at) \
    VALUES ($1, $2, $3, $4, 0, $5, $6) \
    ON CONFLICT (email, purpose) DO UPDATE SET code_hash = excluded.code_hash, \
        password_hash = excluded.password_hash, attempts = 0, expires_at = excluded.expires_at, \
        created_at = excluded.created_at";

/// One try of a live code, counted before the code is checked (so that tries sent side by side
/// are each counted): its hash, if it is unexpired and has tries left.
pub const TAKE_TRY: &str = "\
    UPDATE email_codes SET attempts = attempts + 1 \
     WHERE email = $1 AND purpose = $2 AND attempts < $3 AND expires_at > $4 \
    RETURNING code_hash, password_hash";

/// The code is used: only the request whose delete finds it goes on (two at once: one).
pub const USE_CODE: &str = "\
    DELETE FROM email_codes WHERE email = $1 AND purpose = $2 AND code_hash = $3";

/// Codes that expired are of no use to anyone.
pub const SWEEP_EXPIRED_CODES: &str = "DELETE FROM email_codes WHERE expires_at <= $1";

/// What a code is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A new live shopper proves the address (the chosen password waits with the code).
    SignUp,
    /// A confirmed shopper sets a new password.
    Recovery,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::SignUp => "sign_up",
            Purpose::Recovery => "recovery",
        }
    }
}

/// A code as kept.
pub struct NewCode {
    pub email: String,
    pub purpose: Purpose,
    pub code_hash: String,
    /// A sign-up's chosen password (its hash), set on the account with the code.
    pub password_hash: Option<String>,
    pub expires_at: i64,
    pub created_at: i64,
}

/// A code that had a try left: its hash, and the password waiting with it.
pub struct TriedCode {
    pub code_hash: String,
    pub password_hash: Option<String>,
}

impl Store {
    /// Keeps a new code, in a transaction of its own.
    pub async fn put_code(&self, code: NewCode) -> Result<(), StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(
                    PUT_CODE,
                    &[
                        Arg::Text(&code.email),
                        Arg::Text(code.purpose.as_str()),
                        Arg::Text(&code.code_hash),
                        Arg::OptText(code.password_hash.as_deref()),
                        Arg::Int(code.expires_at),
                        Arg::Int(code.created_at),
                    ],
                )
                .await
                .map(|_| ())
            })
        })
        .await
    }

    /// Counts a try of the address's code; `None` when there is no live code with tries left.
    pub async fn take_code_try(
        &self,
        email: &str,
        purpose: Purpose,
        max_attempts: i64,
        now_ms: i64,
    ) -> Result<Option<TriedCode>, StoreError> {
        let email = email.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                tx.fetch_optional(
                    TAKE_TRY,
                    &[
                        Arg::Text(&email),
                        Arg::Text(purpose.as_str()),
                        Arg::Int(max_attempts),
                        Arg::Int(now_ms),
                    ],
                    |row| {
                        Ok(TriedCode {
                            code_hash: row.text("code_hash")?,
                            password_hash: row.opt_text("password_hash")?,
                        })
                    },
                )
                .await
            })
        })
        .await
    }

    /// Deletes the codes that expired before `now_ms`; how many.
    pub async fn sweep_expired_codes(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.write(move |tx| {
            Box::pin(async move { tx.execute(SWEEP_EXPIRED_CODES, &[Arg::Int(now_ms)]).await })
        })
        .await
    }
}

impl Tx {
    /// Uses the code whose hash this is: `false` if another request used it first.
    pub async fn use_code(
        &mut self,
        email: &str,
        purpose: Purpose,
        code_hash: &str,
    ) -> Result<bool, StoreError> {
        let used = self
            .execute(
                USE_CODE,
                &[
                    Arg::Text(email),
                    Arg::Text(purpose.as_str()),
                    Arg::Text(code_hash),
                ],
            )
            .await?;
        Ok(used == 1)
    }
}
