//! Shops: merchant accounts that act with a secret key (`sk_…`, stored hashed), create checkout
//! sessions for their orders, are paid into, and refund. An operator adds one with
//! `checkout-server shop add --name NAME [--webhook-url URL] [--origin URL…]`, which prints the
//! secrets once.

use base64::Engine;
use serde::Serialize;

use crate::clock;
use crate::ids;
use crate::operations::accounts::{DEFAULT_CURRENCY, new_secret, token_hash};
use crate::operations::addresses;
use crate::store::{AccountKind, ShopRow, Store, StoreError};

/// What `shop add` prints, as one JSON line: the only time the secrets are shown.
#[derive(Clone, Debug, Serialize)]
pub struct NewShop {
    pub shop_id: String,
    pub secret_key: String,
    /// Standard Webhooks' form: `whsec_` and the base64 of 32 random bytes.
    pub signing_secret: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error("the shop's name must be 1 to 200 characters")]
    Name,
    #[error("the webhook URL must be an https URL (http only to a loopback address): {0}")]
    WebhookUrl(String),
    #[error("an origin must be an https origin (http only on a loopback address), no path: {0}")]
    Origin(String),
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

/// Where a shop's events may go (see [`addresses::secure_url`]). Redirects are never followed
/// when sending, so this is where the events really go.
pub fn validate_webhook_url(url: &str) -> Result<(), ShopError> {
    addresses::secure_url(url)
        .map(|_| ())
        .map_err(|why| ShopError::WebhookUrl(format!("{url}: {why}")))
}

/// The origins whose pages may frame the shop's payment pages, as browsers spell them,
/// without repeats.
pub fn validate_origins(origins: &[String]) -> Result<Vec<String>, ShopError> {
    let mut valid = Vec::new();
    for text in origins {
        let origin =
            addresses::origin(text).map_err(|why| ShopError::Origin(format!("{text}: {why}")))?;
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

/// Sets (`Some`) or clears (`None`) a shop's webhook URL; its undelivered events follow.
pub async fn set_webhook_url(
    store: &Store,
    shop_id: &str,
    webhook_url: Option<&str>,
) -> Result<(), ShopError> {
    if let Some(url) = webhook_url {
        validate_webhook_url(url)?;
    }
    if store.set_shop_webhook_url(shop_id, webhook_url).await? {
        Ok(())
    } else {
        Err(ShopError::UnknownShop(shop_id.to_owned()))
    }
}

fn new_signing_secret() -> String {
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

/// Adds a shop: its account (balance 0) and its secrets, in one transaction.
pub async fn add(
    store: &Store,
    name: &str,
    webhook_url: Option<&str>,
    origins: &[String],
) -> Result<NewShop, ShopError> {
    validate(name, webhook_url)?;
    let origins = validate_origins(origins)?;
    let shop = ShopRow {
        shop_id: ids::new_id("shop_"),
        account_id: ids::new_id("acc_"),
        name: name.trim().to_owned(),
        webhook_url: webhook_url.map(str::to_owned),
        signing_secret: new_signing_secret(),
        origins,
    };
    let secret_key = new_secret("sk_");
    let created = NewShop {
        shop_id: shop.shop_id.clone(),
        secret_key: secret_key.clone(),
        signing_secret: shop.signing_secret.clone(),
    };
    store
        .write(move |tx| {
            Box::pin(async move {
                let now = clock::now_ms();
                tx.insert_account(
                    &shop.account_id,
                    &token_hash(&secret_key),
                    AccountKind::Shop,
                    DEFAULT_CURRENCY,
                    0,
                    now,
                )
                .await?;
                tx.insert_shop(&shop, now).await
            })
        })
        .await?;
    Ok(created)
}

/// The shop with this id, made if missing, with a fresh secret key (the old one stops working)
/// and this webhook URL: for a shop whose key is handed over at every start (the demo shop).
pub async fn ensure_with_new_key(
    store: &Store,
    shop_id: &str,
    account_id: &str,
    name: &str,
    webhook_url: Option<&str>,
    origins: &[String],
) -> Result<NewShop, ShopError> {
    validate(name, webhook_url)?;
    let origins = validate_origins(origins)?;
    let secret_key = new_secret("sk_");
    let (shop_id, account_id, name) = (shop_id.to_owned(), account_id.to_owned(), name.to_owned());
    let webhook_url = webhook_url.map(str::to_owned);
    let hash = token_hash(&secret_key);
    let (shop_id, signing_secret) = store
        .write(move |tx| {
            Box::pin(async move {
                if let Some(shop) = tx.shop(&shop_id).await? {
                    tx.set_token_hash(&shop.account_id, &hash).await?;
                    // Its endpoint and origins follow the settings, start after start.
                    tx.set_webhook_url(&shop_id, webhook_url.as_deref()).await?;
                    tx.set_origins(&shop_id, &origins).await?;
                    return Ok((shop_id, shop.signing_secret));
                }
                let now = clock::now_ms();
                let shop = ShopRow {
                    shop_id: shop_id.clone(),
                    account_id,
                    name,
                    webhook_url,
                    signing_secret: new_signing_secret(),
                    origins,
                };
                tx.insert_account(
                    &shop.account_id,
                    &hash,
                    AccountKind::Shop,
                    DEFAULT_CURRENCY,
                    0,
                    now,
                )
                .await?;
                tx.insert_shop(&shop, now).await?;
                Ok((shop_id, shop.signing_secret))
            })
        })
        .await?;
    Ok(NewShop {
        shop_id,
        secret_key,
        signing_secret,
    })
}
