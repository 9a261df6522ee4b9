//! Shops: merchants with an account in each mode, test and live, each acting with its own secret
//! key (`sk_test_…`, `sk_live_…`, stored hashed) and signing its events with its own secret.
//! A shop creates checkout sessions for its orders (of its key's mode), is paid into, and
//! refunds. An operator adds one with `checkout-server shop add --name NAME [--webhook-url URL]
//! [--origin URL…]`, which prints the secrets of both modes once.

use std::time::Duration;

use base64::Engine;
use serde::Serialize;

use crate::clock;
use crate::ids;
use crate::operations::authentication::{DEFAULT_CURRENCY, new_secret, token_hash};
use crate::operations::urls;
use crate::store::{AccountKind, ShopRow, Store, StoreError};

/// A shop's credentials in one mode, shown once: its secret key and its signing secret.
#[derive(Clone, Debug, Serialize)]
pub struct ModeKeys {
    /// `sk_test_…` or `sk_live_…`.
    pub secret_key: String,
    /// Standard Webhooks' form: `whsec_` and the base64 of 32 random bytes.
    pub signing_secret: String,
}

/// What `shop add` prints, as one JSON line: the only time the secrets are shown.
#[derive(Clone, Debug, Serialize)]
pub struct NewShop {
    pub shop_id: String,
    pub test: ModeKeys,
    pub live: ModeKeys,
}

/// The demo shop's credentials as its process reads them: test mode only.
#[derive(Clone, Debug, Serialize)]
pub struct ShopCredentials {
    pub shop_id: String,
    pub secret_key: String,
    pub signing_secret: String,
}

/// A secret key's prefix in each mode.
pub fn key_prefix(livemode: bool) -> &'static str {
    if livemode { "sk_live_" } else { "sk_test_" }
}

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error("the shop's name must be 1 to 200 characters")]
    Name,
    #[error("the webhook URL must be an https URL (http only to a loopback address): {0}")]
    WebhookUrl(String),
    #[error("an origin must be an https origin (http only on a loopback address), no path: {0}")]
    Origin(String),
    #[error("unknown event type {0}: one of {types}", types = crate::operations::events::SHOP_EVENT_TYPES.join(", "))]
    EventType(String),
    #[error("there is no shop {0}")]
    UnknownShop(String),
    #[error("cannot hand over the shop's credentials: {0}")]
    Credentials(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub fn validate_name(name: &str) -> Result<(), ShopError> {
    let length = name.trim().chars().count();
    if (1..=200).contains(&length) && !name.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(ShopError::Name)
    }
}

/// Where a shop's events may go (see [`urls::secure_url`]). Redirects are never followed
/// when sending, so this is where the events really go.
pub fn validate_webhook_url(url: &str) -> Result<(), ShopError> {
    urls::secure_url(url)
        .map(|_| ())
        .map_err(|why| ShopError::WebhookUrl(format!("{url}: {why}")))
}

/// The origins whose pages may frame the shop's payment pages, as browsers spell them,
/// without repeats.
pub fn validate_origins(origins: &[String]) -> Result<Vec<String>, ShopError> {
    let mut valid = Vec::new();
    for text in origins {
        let origin =
            urls::origin(text).map_err(|why| ShopError::Origin(format!("{text}: {why}")))?;
        if !valid.contains(&origin) {
            valid.push(origin);
        }
    }
    Ok(valid)
}

/// Replaces the origins whose pages may frame the shop's payment pages (none: not framable;
/// the full page still works).
pub async fn set_origins(
    store: &Store,
    shop_id: &str,
    origins: &[String],
) -> Result<Vec<String>, ShopError> {
    let origins = validate_origins(origins)?;
    if store.set_shop_origins(shop_id, &origins).await? {
        Ok(origins)
    } else {
        Err(ShopError::UnknownShop(shop_id.to_owned()))
    }
}

/// Sets (`Some`) or clears (`None`) a shop's webhook URL in one mode, or both (`mode` None);
/// its undelivered events follow.
pub async fn set_webhook_url(
    store: &Store,
    shop_id: &str,
    mode: Option<bool>,
    webhook_url: Option<&str>,
) -> Result<(), ShopError> {
    if let Some(url) = webhook_url {
        validate_webhook_url(url)?;
    }
    let modes = mode.map_or(vec![false, true], |livemode| vec![livemode]);
    for livemode in modes {
        if !store
            .set_shop_webhook_url(shop_id, livemode, webhook_url)
            .await?
        {
            return Err(ShopError::UnknownShop(shop_id.to_owned()));
        }
    }
    Ok(())
}

/// A new secret key for the shop in one mode. The old one stops working at once on every
/// instance or, given an `overlap`, when it has passed (the old key's end is returned then, in
/// Unix ms): time to put the new key everywhere the shop uses it.
pub async fn roll_key(
    store: &Store,
    shop_id: &str,
    livemode: bool,
    overlap: Duration,
) -> Result<(String, Option<i64>), ShopError> {
    let secret_key = new_secret(key_prefix(livemode));
    let (shop_id, hash) = (shop_id.to_owned(), token_hash(&secret_key));
    let old_key_until =
        (!overlap.is_zero()).then(|| clock::now_ms().saturating_add(overlap.as_millis() as i64));
    let rolled = store
        .write(move |tx| {
            Box::pin(async move {
                let Some(shop) = tx.shop(&shop_id, livemode).await? else {
                    return Ok(false);
                };
                if let Some(until) = old_key_until {
                    tx.retire_key(&shop.account_id, until).await?;
                }
                tx.set_token_hash(&shop.account_id, &hash).await?;
                Ok(true)
            })
        })
        .await?;
    if rolled {
        Ok((secret_key, old_key_until))
    } else {
        Err(ShopError::UnknownShop("no such shop".into()))
    }
}

pub(crate) fn new_signing_secret() -> String {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// A shop's name and, if it has one, its webhook URL, as an operator gives them.
fn validate(name: &str, webhook_url: Option<&str>) -> Result<(), ShopError> {
    validate_name(name)?;
    webhook_url.map_or(Ok(()), validate_webhook_url)
}

/// Adds a shop: an account in each mode (balance 0) with its secrets, in one transaction.
pub async fn add(
    store: &Store,
    name: &str,
    webhook_url: Option<&str>,
    origins: &[String],
) -> Result<NewShop, ShopError> {
    validate(name, webhook_url)?;
    let origins = validate_origins(origins)?;
    let shop_id = ids::new_id("shop_");
    let rows: Vec<(ShopRow, ModeKeys)> = [false, true]
        .into_iter()
        .map(|livemode| {
            let row = ShopRow {
                shop_id: shop_id.clone(),
                account_id: ids::new_id("acc_"),
                name: name.trim().to_owned(),
                webhook_url: webhook_url.map(str::to_owned),
                signing_secret: new_signing_secret(),
                old_signing_secret: None,
                origins: origins.clone(),
                livemode,
            };
            let keys = ModeKeys {
                secret_key: new_secret(key_prefix(livemode)),
                signing_secret: row.signing_secret.clone(),
            };
            (row, keys)
        })
        .collect();
    let written: Vec<(ShopRow, String)> = rows
        .iter()
        .map(|(row, keys)| (row.clone(), token_hash(&keys.secret_key)))
        .collect();
    store
        .write(move |tx| {
            Box::pin(async move {
                let now = clock::now_ms();
                for (row, hash) in &written {
                    tx.insert_account(
                        &row.account_id,
                        hash,
                        AccountKind::Shop,
                        row.livemode,
                        DEFAULT_CURRENCY,
                        0,
                        now,
                    )
                    .await?;
                    tx.insert_shop(row, now).await?;
                }
                Ok(())
            })
        })
        .await?;
    let mut keys = rows.into_iter().map(|(_, keys)| keys);
    Ok(NewShop {
        shop_id,
        test: keys.next().expect("a test row"),
        live: keys.next().expect("a live row"),
    })
}

/// The shop with this id, made if missing, with a fresh **test** secret key (the old one stops
/// working) and this webhook URL and these origins: for a shop whose key is handed over at
/// every start (the demo shop, which runs on test money). Its live account is made with no
/// usable key (`shop roll-key --live` gives one).
pub async fn ensure_test_shop(
    store: &Store,
    shop_id: &str,
    account_id: &str,
    name: &str,
    webhook_url: Option<&str>,
    origins: &[String],
) -> Result<ShopCredentials, ShopError> {
    validate(name, webhook_url)?;
    let origins = validate_origins(origins)?;
    let secret_key = new_secret(key_prefix(false));
    let (shop_id, account_id, name) = (shop_id.to_owned(), account_id.to_owned(), name.to_owned());
    let webhook_url = webhook_url.map(str::to_owned);
    let hash = token_hash(&secret_key);
    let (shop_id, signing_secret) = store
        .write(move |tx| {
            Box::pin(async move {
                if let Some(shop) = tx.shop(&shop_id, false).await? {
                    tx.set_token_hash(&shop.account_id, &hash).await?;
                    // Its endpoint and origins follow the settings, start after start.
                    tx.set_webhook_url(&shop_id, false, webhook_url.as_deref())
                        .await?;
                    tx.set_origins(&shop_id, &origins).await?;
                    return Ok((shop_id, shop.signing_secret));
                }
                let now = clock::now_ms();
                let test = ShopRow {
                    shop_id: shop_id.clone(),
                    account_id,
                    name,
                    webhook_url,
                    signing_secret: new_signing_secret(),
                    old_signing_secret: None,
                    origins,
                    livemode: false,
                };
                let live = ShopRow {
                    account_id: ids::new_id("acc_"),
                    webhook_url: None,
                    signing_secret: new_signing_secret(),
                    livemode: true,
                    ..test.clone()
                };
                for (row, hash) in [
                    (&test, hash.clone()),
                    (&live, format!("no key yet: {}", live.account_id)),
                ] {
                    tx.insert_account(
                        &row.account_id,
                        &hash,
                        AccountKind::Shop,
                        row.livemode,
                        DEFAULT_CURRENCY,
                        0,
                        now,
                    )
                    .await?;
                    tx.insert_shop(row, now).await?;
                }
                Ok((shop_id, test.signing_secret))
            })
        })
        .await?;
    Ok(ShopCredentials {
        shop_id,
        secret_key,
        signing_secret,
    })
}
