//! Demo mode (`CHECKOUT_DEMO=1`) only provisions one demo shop, on test money, whose carts
//! become checkout sessions made here, on the server, exactly as a shop's server makes them
//! (the browser names a cart, never an amount). The demo shop's test secret key is new at every
//! start and handed over only through a file (`CHECKOUT_DEMO_SHOP_FILE`), never an endpoint.
//! Its shoppers are test shoppers, which exist with or without demo mode
//! ([`crate::operations::shoppers`]).

use std::path::Path;

use checkout_shared::LineItem;

use crate::operations::shops::{self, ShopCredentials, ShopError};
use crate::store::Store;

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
) -> Result<ShopCredentials, ShopError> {
    let shop = shops::ensure_test_shop(
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
