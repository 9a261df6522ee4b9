//! Demo mode (`CHECKOUT_DEMO=1`): fresh shoppers holding 1 000,00 ₽, and one demo shop whose
//! carts become checkout sessions made here, on the server, exactly as a shop's server makes
//! them (the browser names a cart, never an amount). The demo shop's secret key is new at every
//! start and handed over only through a file (`CHECKOUT_DEMO_SHOP_FILE`), never an endpoint.

use std::path::Path;

use checkout_shared::LineItem;

use crate::operations::accounts::{DEFAULT_CURRENCY, new_secret, token_hash};
use crate::operations::shops::{self, NewShop, ShopError};
use crate::store::{AccountKind, EntryKind, LedgerEntry, Store, StoreError};
use crate::{clock, ids};

/// A demo shopper's opening balance: 1 000,00 ₽.
pub const DEMO_OPENING_BALANCE: i64 = 100_000;
pub const DEMO_SHOP_ID: &str = "shop_demo";
pub const DEMO_SHOP_ACCOUNT: &str = "acc_demo_shop";
pub const DEMO_SHOP_NAME: &str = "Кофейня «Зерно»";

/// The demo shop, made if missing, with a new secret key; written to `credentials` (readable by
/// its owner only) when given, for the demo shop's own process.
pub async fn provision_shop(
    store: &Store,
    credentials: Option<&Path>,
    webhook_url: Option<&str>,
    origins: &[String],
) -> Result<NewShop, ShopError> {
    let shop = shops::ensure_with_new_key(
        store,
        DEMO_SHOP_ID,
        DEMO_SHOP_ACCOUNT,
        DEMO_SHOP_NAME,
        webhook_url,
        origins,
    )
    .await?;
    if let Some(path) = credentials {
        write_private(
            path,
            &serde_json::to_string(&shop).expect("credentials serialize"),
        )
        .map_err(|e| ShopError::Credentials(format!("{}: {e}", path.display())))?;
    }
    Ok(shop)
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(text.as_bytes())
}

/// The demo shop's carts, in turn: the second costs more than what is left after the first, so
/// a demo shows a decline too.
pub fn cart(number: u32) -> Vec<LineItem> {
    let item = |name: &str, quantity, unit_price| LineItem {
        name: name.into(),
        quantity,
        unit_price,
    };
    match number % 3 {
        0 => vec![
            item("Кофе в зёрнах «Эфиопия», 250 г", 2, 15_000),
            item("Фильтры для пуровера, 100 шт.", 1, 15_000),
        ],
        1 => vec![item("Кофемолка ручная", 1, 70_000)],
        _ => vec![item("Шоколад горький 72 %", 3, 4_000)],
    }
}

/// A fresh demo shopper with its opening credit, in one transaction so that balance ==
/// sum(ledger) holds from its first moment: its token (shown once) and account id.
pub async fn new_shopper(store: &Store) -> Result<(String, String), StoreError> {
    let account_id = ids::new_id("acc_");
    let token = new_secret("tok_");
    let now_ms = clock::now_ms();
    let (account, hash) = (account_id.clone(), token_hash(&token));
    store
        .write(move |tx| {
            Box::pin(async move {
                tx.insert_account(
                    &account,
                    &hash,
                    AccountKind::Shopper,
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
    Ok((token, account_id))
}
