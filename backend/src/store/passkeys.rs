//! A live shopper's passkeys, and the WebAuthn ceremonies begun and not yet finished (kept here,
//! not in one instance's memory, so that any instance finishes what another began).

use super::row::{Arg, Row, RowError};
use super::{Store, StoreError, Tx};

pub const INSERT_CEREMONY: &str = "\
    INSERT INTO passkey_ceremonies (ceremony_id, account_id, state, expires_at) \
    VALUES ($1, $2, $3, $4)";

/// A ceremony is finished once: the request whose delete finds it unexpired goes on.
pub const TAKE_CEREMONY: &str = "\
    DELETE FROM passkey_ceremonies WHERE ceremony_id = $1 AND expires_at > $2 \
    RETURNING account_id, state";

pub const SWEEP_EXPIRED_CEREMONIES: &str = "DELETE FROM passkey_ceremonies WHERE expires_at <= $1";

pub const PASSKEYS_OF: &str = "\
    SELECT credential_id, account_id, user_handle, passkey, created_at, last_used_at \
      FROM passkeys WHERE account_id = $1 ORDER BY created_at, credential_id";

pub const PASSKEY_BY_CREDENTIAL: &str = "\
    SELECT credential_id, account_id, user_handle, passkey, created_at, last_used_at \
      FROM passkeys WHERE credential_id = $1";

/// A credential id is the authenticator's: the same one twice is one passkey.
pub const INSERT_PASSKEY: &str = "\
    INSERT INTO passkeys (credential_id, account_id, user_handle, passkey, created_at) \
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT (credential_id) DO NOTHING";

/// After a sign-in: its signature counter and flags, as webauthn-rs updated them.
pub const PASSKEY_USED: &str = "\
    UPDATE passkeys SET passkey = $2, last_used_at = $3 WHERE credential_id = $1";

/// A ceremony's server half.
pub struct Ceremony {
    pub account_id: Option<String>,
    /// webauthn-rs's state, JSON.
    pub state: String,
}

/// A passkey as kept.
#[derive(Clone, Debug)]
pub struct PasskeyRow {
    pub credential_id: String,
    pub account_id: String,
    pub user_handle: String,
    /// webauthn-rs's `Passkey`, JSON.
    pub passkey: String,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}

impl PasskeyRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(PasskeyRow {
            credential_id: row.text("credential_id")?,
            account_id: row.text("account_id")?,
            user_handle: row.text("user_handle")?,
            passkey: row.text("passkey")?,
            created_at: row.int("created_at")?,
            last_used_at: row.opt_int("last_used_at")?,
        })
    }
}

impl Store {
    pub async fn begin_ceremony(
        &self,
        ceremony_id: &str,
        account_id: Option<&str>,
        state: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let (id, account, state) = (
            ceremony_id.to_owned(),
            account_id.map(str::to_owned),
            state.to_owned(),
        );
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(
                    INSERT_CEREMONY,
                    &[
                        Arg::Text(&id),
                        Arg::OptText(account.as_deref()),
                        Arg::Text(&state),
                        Arg::Int(expires_at),
                    ],
                )
                .await
                .map(|_| ())
            })
        })
        .await
    }

    /// The ceremony, taken (no one can finish it again); `None` if unknown, used or expired.
    pub async fn take_ceremony(
        &self,
        ceremony_id: &str,
        now_ms: i64,
    ) -> Result<Option<Ceremony>, StoreError> {
        let id = ceremony_id.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                tx.fetch_optional(TAKE_CEREMONY, &[Arg::Text(&id), Arg::Int(now_ms)], |row| {
                    Ok(Ceremony {
                        account_id: row.opt_text("account_id")?,
                        state: row.text("state")?,
                    })
                })
                .await
            })
        })
        .await
    }

    pub async fn sweep_expired_ceremonies(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(SWEEP_EXPIRED_CEREMONIES, &[Arg::Int(now_ms)])
                    .await
            })
        })
        .await
    }

    pub async fn passkeys_of(&self, account_id: &str) -> Result<Vec<PasskeyRow>, StoreError> {
        self.read(PASSKEYS_OF, &[Arg::Text(account_id)], PasskeyRow::read)
            .await
    }

    pub async fn passkey_by_credential(
        &self,
        credential_id: &str,
    ) -> Result<Option<PasskeyRow>, StoreError> {
        let rows = self
            .read(
                PASSKEY_BY_CREDENTIAL,
                &[Arg::Text(credential_id)],
                PasskeyRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Keeps a new passkey; `false` if that credential is kept already.
    pub async fn insert_passkey(&self, passkey: PasskeyRow) -> Result<bool, StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                let inserted = tx
                    .execute(
                        INSERT_PASSKEY,
                        &[
                            Arg::Text(&passkey.credential_id),
                            Arg::Text(&passkey.account_id),
                            Arg::Text(&passkey.user_handle),
                            Arg::Text(&passkey.passkey),
                            Arg::Int(passkey.created_at),
                        ],
                    )
                    .await?;
                Ok(inserted == 1)
            })
        })
        .await
    }
}

impl Tx {
    pub async fn passkey_used(
        &mut self,
        credential_id: &str,
        passkey: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            PASSKEY_USED,
            &[
                Arg::Text(credential_id),
                Arg::Text(passkey),
                Arg::Int(now_ms),
            ],
        )
        .await
        .map(|_| ())
    }
}
