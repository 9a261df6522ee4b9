//! What the shopper sees: the catalogue and cart, then the order page, where the checkout's
//! widget is mounted for the order's session and the shop confirms the payment server-side.

use std::collections::HashMap;

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use crate::catalogue::{self, CATALOGUE, MAX_QUANTITY};
use crate::error::ShopError;
use crate::pages::{Section, layout, rub};
use crate::store::{Order, OrderState};
use crate::{Shop, orders};

/// `GET /`: the catalogue as one cart form. Its hidden token makes a double submit one order.
pub async fn catalogue_page() -> Markup {
    let cart_token = uuid::Uuid::new_v4();
    layout(
        "Магазин",
        Section::Storefront,
        html! {
            section.panel {
                h1 { "Каталог" }
                form.cart method="post" action="/orders" {
                    input type="hidden" name="cart_token" value=(cart_token);
                    ul.products {
                        @for product in &CATALOGUE {
                            li.product {
                                div {
                                    div.product-name { (product.name) }
                                    div.product-note { (product.description) }
                                }
                                div.product-price { (rub(product.price)) }
                                label.quantity {
                                    span.visually-hidden { "Количество" }
                                    input type="number" name=(format!("qty_{}", product.sku))
                                        min="0" max=(MAX_QUANTITY) value="0" inputmode="numeric";
                                }
                            }
                        }
                    }
                    button.primary.checkout type="submit" { "Оформить заказ" }
                }
            }
        },
    )
}

/// `POST /orders`: the order of this cart (made once per form), then its page.
pub async fn place_order(
    State(shop): State<Shop>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, ShopError> {
    let items = catalogue::cart(&form).map_err(ShopError::BadInput)?;
    let cart_token = form
        .get("cart_token")
        .filter(|t| uuid::Uuid::parse_str(t).is_ok())
        .ok_or_else(|| ShopError::BadInput("Форма устарела: обновите страницу".into()))?;
    let order = orders::place(&shop, cart_token, &items).await?;
    Ok(Redirect::to(&format!("/orders/{}", order.id)).into_response())
}

/// `GET /orders/{id}`: the order and, while it has a session, the widget paying it.
pub async fn order_page(
    State(shop): State<Shop>,
    Path(order_id): Path<String>,
) -> Result<Markup, ShopError> {
    let order = orders::get(&shop, &order_id).await?;
    Ok(layout(
        &format!("Заказ {}", order.id),
        Section::Storefront,
        html! { div.order-page {
            section.panel {
                h1 { "Заказ " span.order-number { (order.id) } }
                (order_lines(&order))
                (order_state(&order))
                p.muted { "После оплаты магазин сам сверит платёж с платёжным сервисом." }
            }
            @match (&order.state, &order.checkout_session_id) {
                // Nothing left to pay with: the session lapsed.
                (OrderState::Expired, _) => {
                    section.panel {
                        a.primary href="/" { "Вернуться в каталог" }
                    }
                },
                (_, Some(session_id)) => {
                    section.payment {
                        div #checkout data-checkout-session=(session_id) data-order=(order.id) {}
                    }
                    // The page's own script first: it listens before the widget can speak.
                    script type="module" src="/assets/shop.js" {}
                    script src=(format!("{}v1/checkout.js", shop.checkout.base())) {}
                },
                (_, None) => {
                    section.panel {
                        p.error role="alert" { "Не удалось начать оплату: платёжный сервис не ответил." }
                        form method="post" action=(format!("/orders/{}/checkout-session", order.id)) {
                            button.primary type="submit" { "Попробовать ещё раз" }
                        }
                    }
                },
            }
        } },
    ))
}

/// `POST /orders/{id}/checkout-session`: tries again to open the order's session (same key).
pub async fn retry_session(
    State(shop): State<Shop>,
    Path(order_id): Path<String>,
) -> Result<Redirect, ShopError> {
    let order = orders::get(&shop, &order_id).await?;
    let order = orders::open_session(&shop, order).await?;
    Ok(Redirect::to(&format!("/orders/{}", order.id)))
}

/// `POST /orders/{id}/confirm`: the page heard `checkout:paid`; the shop asks the checkout.
pub async fn confirm(State(shop): State<Shop>, Path(order_id): Path<String>) -> Response {
    let confirmed = async {
        let order = orders::get(&shop, &order_id).await?;
        orders::confirm(&shop, order).await
    }
    .await;
    match confirmed {
        Ok(order) => axum::Json(serde_json::json!({
            "order_id": order.id,
            "state": state_name(&order),
            "payment_id": order.payment_id,
        }))
        .into_response(),
        Err(error) => error.json(),
    }
}

pub fn order_lines(order: &Order) -> Markup {
    html! {
        ul.lines {
            @for item in &order.items {
                li {
                    span { (item.name) " × " (item.quantity) }
                    span.line-total { (rub(item.total().unwrap_or(0))) }
                }
            }
        }
        p.order-total { "Итого: " strong { (rub(order.amount)) } }
    }
}

fn order_state(order: &Order) -> Markup {
    html! {
        p #order-state .order-state data-state=(state_name(order)) role="status" {
            @match order.state {
                OrderState::Paid => "Заказ оплачен",
                OrderState::AwaitingPayment => "Ожидает оплаты",
                OrderState::Expired => "Срок оплаты истёк: оформите заказ заново",
            }
        }
    }
}

pub fn state_name(order: &Order) -> &'static str {
    match order.state {
        OrderState::Paid => "paid",
        OrderState::AwaitingPayment => "awaiting_payment",
        OrderState::Expired => "expired",
    }
}
