//! Demo mode's endpoint: `POST /api/demo/checkout-session` (a session of the demo shop for one
//! of its carts). Its shoppers are test shoppers (`api::shoppers`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use checkout_idempotency::{KeyedRequest, NoHooks, Outcome};
use checkout_shared::{CheckoutSession, CreateCheckoutSession, DemoCart, LineItem, ShopView};

use crate::api::AppState;
use crate::api::extract::JsonBody;
use crate::api::sessions;
use crate::operations::authentication::{self, DEFAULT_CURRENCY};
use crate::operations::demo::{DEMO_SHOP_ACCOUNT, DEMO_SHOP_NAME, cart};
use crate::operations::error::OperationError;
use crate::operations::sessions::NewCheckoutSession;
use crate::store::AccountKind;

pub fn demo_only(app: &AppState) -> Result<(), OperationError> {
    if app.demo {
        Ok(())
    } else {
        Err(OperationError::NotFound(
            "demo mode is off (set CHECKOUT_DEMO=1)".into(),
        ))
    }
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
) -> Result<(StatusCode, Json<CheckoutSession>), OperationError> {
    demo_only(&app)?;
    Ok((
        StatusCode::CREATED,
        Json(demo_session(&app, body.value.cart).await?),
    ))
}

/// A session of the demo shop for its cart `number`, made as a shop's server makes one: keyed,
/// through the protocol (with a key made here).
pub async fn demo_session(app: &AppState, number: u32) -> Result<CheckoutSession, OperationError> {
    let items = cart(number);
    let order_id = format!("ORD-{:08X}", uuid::Uuid::new_v4().as_u128() as u32);
    let request = CreateCheckoutSession {
        order_id,
        amount: items.iter().filter_map(LineItem::total).sum(),
        currency: None,
        description: Some(format!("Заказ в «{DEMO_SHOP_NAME}»")),
        items: Some(items),
        return_url: None,
    };
    let shop = authentication::Principal {
        account_id: DEMO_SHOP_ACCOUNT.into(),
        currency: DEFAULT_CURRENCY.into(),
        kind: AccountKind::Shop,
        livemode: false,
        origins: Vec::new(),
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
        return Err(OperationError::Contended);
    };
    // The shop's answer is the public view but for the shop's name, which is the demo shop's.
    let mut made: CheckoutSession =
        serde_json::from_str(&response.body).map_err(|_| OperationError::Contended)?;
    made.shop = Some(ShopView {
        name: DEMO_SHOP_NAME.into(),
    });
    Ok(made)
}
