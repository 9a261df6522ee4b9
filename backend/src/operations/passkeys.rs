//! Passkeys (WebAuthn, by webauthn-rs): a live shopper makes one while signed in (right after
//! the sign-up's code, or a recovery's), and signs in with it without typing anything: the
//! browser offers the passkeys it holds for the checkout's origin (a discoverable credential),
//! and the one chosen names its account. The relying party is the checkout's own origin
//! (`CHECKOUT_PUBLIC_ORIGIN`), so a passkey works only in the account window on that origin,
//! never on a page a shop (or a look-alike) serves.
//!
//! Each ceremony's server half waits in the database (any instance finishes it), for five
//! minutes, and is used once: a replayed answer finds no ceremony.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use url::Url;
use webauthn_rs::prelude::{
    CredentialID, DiscoverableAuthentication, Passkey, PasskeyRegistration, PublicKeyCredential,
    RegisterPublicKeyCredential, Uuid,
};
use webauthn_rs::{Webauthn, WebauthnBuilder};
use webauthn_rs_proto::ResidentKeyRequirement;

use checkout_shared::{PasskeyChallenge, PasskeyView};

use crate::clock;
use crate::operations::authentication::{new_secret, token_hash};
use crate::operations::error::OperationError;
use crate::operations::shoppers::SignedIn;
use crate::store::passkeys::PasskeyRow;
use crate::store::{Store, StoreError};

/// How long a browser has to answer a challenge.
pub const CEREMONY_TTL_MS: i64 = 5 * 60 * 1000;

/// The checkout as a WebAuthn relying party.
#[derive(Clone)]
pub struct RelyingParty(Webauthn);

impl std::fmt::Debug for RelyingParty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelyingParty")
    }
}

impl RelyingParty {
    /// The relying party of the checkout served at `origin` (its host is the passkeys' RP ID).
    /// `http://localhost` accepts any port (development and tests); any other origin only
    /// itself, exactly.
    pub fn new(origin: &Url) -> Result<RelyingParty, String> {
        let host = origin
            .domain()
            .ok_or_else(|| {
                format!("{origin} has no domain name (passkeys need one, not an IP address)")
            })?
            .to_owned();
        let builder = WebauthnBuilder::new(&host, origin)
            .map_err(|e| format!("passkeys cannot use {origin}: {e}"))?
            .rp_name("Оплата заказов")
            .allow_any_port(host == "localhost");
        builder
            .build()
            .map(RelyingParty)
            .map_err(|e| format!("passkeys cannot use {origin}: {e}"))
    }
}

/// A registration's server half, with the user handle the new passkey gets.
#[derive(Serialize, Deserialize)]
struct Registration {
    user_handle: Uuid,
    state: PasskeyRegistration,
}

fn rejected(why: impl std::fmt::Display) -> OperationError {
    OperationError::PasskeyRejected(why.to_string())
}

fn stored(error: serde_json::Error) -> OperationError {
    OperationError::Store(StoreError::Other(error.to_string().into()))
}

fn challenge(
    ceremony_id: String,
    options: impl Serialize,
) -> Result<PasskeyChallenge, OperationError> {
    Ok(PasskeyChallenge {
        ceremony_id,
        options: serde_json::to_value(options).map_err(stored)?,
    })
}

/// The challenge for a new passkey of `account_id` (whose e-mail names it on the device). The
/// account's passkeys are excluded (the same authenticator does not make a second one), and
/// the credential must be discoverable: that is what lets the shopper sign in typing nothing.
pub async fn begin_registration(
    store: &Store,
    party: &RelyingParty,
    account_id: &str,
    email: &str,
) -> Result<PasskeyChallenge, OperationError> {
    let kept = store.passkeys_of(account_id).await?;
    let user_handle = kept
        .first()
        .and_then(|p| Uuid::parse_str(&p.user_handle).ok())
        .unwrap_or_else(Uuid::new_v4);
    let exclude = kept
        .iter()
        .filter_map(|p| URL_SAFE_NO_PAD.decode(&p.credential_id).ok())
        .map(CredentialID::from)
        .collect::<Vec<_>>();
    let (mut options, state) = party
        .0
        .start_passkey_registration(user_handle, email, email, Some(exclude))
        .map_err(rejected)?;
    if let Some(selection) = options.public_key.authenticator_selection.as_mut() {
        selection.resident_key = Some(ResidentKeyRequirement::Required);
        selection.require_resident_key = true;
    }
    let ceremony_id = new_secret("pkc_");
    let state = serde_json::to_string(&Registration { user_handle, state }).map_err(stored)?;
    store
        .begin_ceremony(
            &ceremony_id,
            Some(account_id),
            &state,
            clock::now_ms() + CEREMONY_TTL_MS,
        )
        .await?;
    challenge(ceremony_id, options)
}

/// The browser's answer to a registration challenge: the passkey is kept for the account.
pub async fn finish_registration(
    store: &Store,
    party: &RelyingParty,
    account_id: &str,
    ceremony_id: &str,
    credential: &RegisterPublicKeyCredential,
) -> Result<PasskeyView, OperationError> {
    let now_ms = clock::now_ms();
    let ceremony = store
        .take_ceremony(ceremony_id, now_ms)
        .await?
        .filter(|c| c.account_id.as_deref() == Some(account_id))
        .ok_or_else(|| {
            rejected(
                "no such registration in progress for this account (expired, used, or another's)",
            )
        })?;
    let Registration { user_handle, state } =
        serde_json::from_str(&ceremony.state).map_err(stored)?;
    let passkey = party
        .0
        .finish_passkey_registration(credential, &state)
        .map_err(rejected)?;
    let row = PasskeyRow {
        credential_id: URL_SAFE_NO_PAD.encode(passkey.cred_id()),
        account_id: account_id.to_owned(),
        user_handle: user_handle.to_string(),
        passkey: serde_json::to_string(&passkey).map_err(stored)?,
        created_at: now_ms,
        last_used_at: None,
    };
    if !store.insert_passkey(row.clone()).await? {
        return Err(rejected("this passkey is kept already"));
    }
    Ok(view(&row))
}

/// A sign-in challenge for whichever passkey of this origin the browser offers.
pub async fn begin_sign_in(
    store: &Store,
    party: &RelyingParty,
) -> Result<PasskeyChallenge, OperationError> {
    let (options, state) = party
        .0
        .start_discoverable_authentication()
        .map_err(rejected)?;
    let ceremony_id = new_secret("pkc_");
    let state = serde_json::to_string(&state).map_err(stored)?;
    store
        .begin_ceremony(
            &ceremony_id,
            None,
            &state,
            clock::now_ms() + CEREMONY_TTL_MS,
        )
        .await?;
    challenge(ceremony_id, options)
}

/// The browser's answer to a sign-in challenge: the passkey it used names the account, its
/// signature is checked against the key kept, and a new sign-in begins.
pub async fn finish_sign_in(
    store: &Store,
    party: &RelyingParty,
    ceremony_id: &str,
    credential: &PublicKeyCredential,
) -> Result<SignedIn, OperationError> {
    let now_ms = clock::now_ms();
    let ceremony = store
        .take_ceremony(ceremony_id, now_ms)
        .await?
        .filter(|c| c.account_id.is_none())
        .ok_or_else(|| rejected("no such sign-in in progress (expired or used)"))?;
    let state: DiscoverableAuthentication =
        serde_json::from_str(&ceremony.state).map_err(stored)?;
    let (user_handle, credential_id) = party
        .0
        .identify_discoverable_authentication(credential)
        .map_err(rejected)?;
    let row = store
        .passkey_by_credential(&URL_SAFE_NO_PAD.encode(credential_id))
        .await?
        .filter(|row| row.user_handle == user_handle.to_string())
        .ok_or_else(|| rejected("no account has this passkey"))?;
    let mut passkey: Passkey = serde_json::from_str(&row.passkey).map_err(stored)?;
    let result = party
        .0
        .finish_discoverable_authentication(credential, state, &[(&passkey).into()])
        .map_err(rejected)?;
    passkey.update_credential(&result);
    let kept = serde_json::to_string(&passkey).map_err(stored)?;
    let token = new_secret("tok_live_");
    let hash = token_hash(&token);
    let (credential_id, account_id) = (row.credential_id, row.account_id.clone());
    store
        .write(move |tx| {
            Box::pin(async move {
                tx.passkey_used(&credential_id, &kept, now_ms).await?;
                tx.insert_sign_in(&hash, &account_id, now_ms).await
            })
        })
        .await?;
    Ok(SignedIn {
        token,
        account_id: row.account_id,
    })
}

/// The account's passkeys, oldest first.
pub async fn list(store: &Store, account_id: &str) -> Result<Vec<PasskeyView>, OperationError> {
    Ok(store
        .passkeys_of(account_id)
        .await?
        .iter()
        .map(view)
        .collect())
}

fn view(row: &PasskeyRow) -> PasskeyView {
    PasskeyView {
        passkey_id: row.credential_id.clone(),
        created_at: clock::rfc3339(row.created_at),
        last_used_at: row.last_used_at.map(clock::rfc3339),
    }
}
