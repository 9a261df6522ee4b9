//! Demo mode (`CHECKOUT_DEMO=1`): fresh shoppers holding 1 000,00 ₽, and one demo shop whose
//! carts become checkout sessions made here, on the server, exactly as a shop's server makes
//! them (the browser names a cart, never an amount). The demo shop's secret key is new at every
//! start and handed over only through a file (`CHECKOUT_DEMO_SHOP_FILE`), never an endpoint.

use std::path::Path;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use std::sync::Arc;

use checkout_idempotency::{KeyedRequest, NoHooks, Outcome};
use checkout_shared::{
    CheckoutSession, CreateCheckoutSession, DemoCart, DemoSession, LineItem, ShopView,
};

use crate::accounts::{DEFAULT_CURRENCY, new_secret, token_hash};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::sessions::{self, NewCheckoutSession};
use crate::shops::{self, NewShop, ShopError};
use crate::store::{AccountKind, EntryKind, LedgerEntry, Store};
use crate::{AppState, accounts, clock, ids};

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
) -> Result<NewShop, ShopError> {
    let shop = shops::ensure_with_new_key(
        store,
        DEMO_SHOP_ID,
        DEMO_SHOP_ACCOUNT,
        DEMO_SHOP_NAME,
        webhook_url,
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

fn demo_only(app: &AppState) -> Result<(), ApiError> {
    if app.demo {
        Ok(())
    } else {
        Err(ApiError::NotFound(
            "demo mode is off (set CHECKOUT_DEMO=1)".into(),
        ))
    }
}

/// `POST /api/demo/session`: a fresh shopper with its opening credit, in one transaction so
/// that balance == sum(ledger) holds from its first moment.
#[utoipa::path(
    post, path = "/api/demo/session", operation_id = "create_demo_shopper", tag = "demo",
    summary = "A fresh demo shopper holding 1 000,00 ₽ (demo mode only)",
    responses(
        (status = 200, description = "The shopper's token and account", body = checkout_shared::DemoSession),
        (status = 404, description = "`not_found`: demo mode is off", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn create_shopper(State(app): State<AppState>) -> Result<Json<DemoSession>, ApiError> {
    demo_only(&app)?;
    let account_id = ids::new_id("acc_");
    let token = new_secret("tok_");
    let now_ms = clock::now_ms();
    let (account, hash) = (account_id.clone(), token_hash(&token));
    app.store
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
    Ok(Json(DemoSession { token, account_id }))
}

/// `POST /api/demo/checkout-session` `{"cart": n}`: a session of the demo shop for demo cart
/// `n`, made through the same keyed path as a shop's own request (with a key made here).
#[utoipa::path(
    post, path = "/api/demo/checkout-session", operation_id = "create_demo_checkout_session", tag = "demo",
    summary = "A session of the demo shop for demo cart `cart` (demo mode only)",
    request_body = DemoCart,
    responses(
        (status = 201, description = "The session", body = checkout_shared::CheckoutSession),
        (status = 400, description = "`invalid_request`", body = checkout_shared::Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: demo mode is off", body = checkout_shared::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn create_checkout_session(
    State(app): State<AppState>,
    body: JsonBody<DemoCart>,
) -> Result<(StatusCode, Json<CheckoutSession>), ApiError> {
    demo_only(&app)?;
    let items = cart(body.value.cart);
    let order_id = format!("ORD-{:08X}", uuid::Uuid::new_v4().as_u128() as u32);
    let request = CreateCheckoutSession {
        order_id,
        amount: items.iter().filter_map(LineItem::total).sum(),
        currency: None,
        description: Some(format!("Заказ в «{DEMO_SHOP_NAME}»")),
        items: Some(items),
    };
    let shop = accounts::Principal {
        account_id: DEMO_SHOP_ACCOUNT.into(),
        currency: DEFAULT_CURRENCY.into(),
        kind: AccountKind::Shop,
    };
    let session = NewCheckoutSession::validate(&shop, request, app.session_ttl)?;
    let body = session.canonical();
    let key = uuid::Uuid::new_v4().to_string();
    let keyed = KeyedRequest {
        scope: &shop.account_id,
        key: &key,
        method: "POST",
        route: sessions::ROUTE,
        body: &body,
    };
    // The demo shop stands for a shop's own server: faults a test injects into the protocol
    // (`Seams::hooks`) are for the shopper's requests, so its sessions are made without them.
    let protocol = app.protocol.clone().with_hooks(Arc::new(NoHooks));
    let Outcome::Executed { response, .. } = protocol.execute(&app.store, keyed, session).await?
    else {
        return Err(ApiError::Contended);
    };
    // The shop's answer is the public view but for the shop's name, which is the demo shop's.
    let mut made: CheckoutSession =
        serde_json::from_str(&response.body).map_err(|_| ApiError::Contended)?;
    made.shop = Some(ShopView {
        name: DEMO_SHOP_NAME.into(),
    });
    Ok((StatusCode::CREATED, Json(made)))
}
