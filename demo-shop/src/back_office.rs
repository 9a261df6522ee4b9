//! What the shop's staff see, once signed in (see [`crate::staff`]): every order with its
//! payment state, a refund form per paid order (each rendering carries a fresh idempotency key: a
//! double click refunds once), and the refund requests with what the checkout answered. A
//! refund whose answer never came keeps its key: «Повторить» resends it, and no new refund of
//! that order is taken until it is settled (by that answer, or by the checkout's event).

use std::collections::HashMap;

use axum::Form;
use axum::extract::{Path, State};
use axum::response::Redirect;
use checkout_shared::parse_rub;
use maud::{Markup, html};

use crate::error::ShopError;
use crate::pages::{Section, layout, rub, when};
use crate::staff::Staff;
use crate::store::{Order, OrderState, RefundRequest, RefundState};
use crate::storefront::state_name;
use crate::{Shop, orders};

const SHOWN: i64 = 100;

/// `GET /admin`.
pub async fn page(State(shop): State<Shop>, staff: Staff) -> Result<Markup, ShopError> {
    let orders = shop.store.orders(SHOWN).await?;
    let refunds = shop.store.refunds(SHOWN).await?;
    let pending: HashMap<String, RefundRequest> = shop
        .store
        .pending_refunds()
        .await?
        .into_iter()
        .map(|refund| (refund.order_id.clone(), refund))
        .collect();
    let inbox = shop.store.inbox_entries(SHOWN).await?;
    Ok(layout(
        "Бэк-офис",
        Section::BackOffice,
        html! {
            form.logout method="post" action="/admin/logout" {
                input type="hidden" name="csrf" value=(staff.csrf);
                button.secondary type="submit" { "Выйти" }
            }
            section.panel.wide {
                h1 { "Заказы" }
                @if orders.is_empty() {
                    p.muted { "Заказов пока нет." }
                } @else {
                    table.orders {
                        thead { tr {
                            th { "Заказ" } th { "Создан" } th.num { "Сумма" } th { "Оплата" }
                            th.num { "Возвращено" } th.num { "Бонус" } th { "Действие" }
                        } }
                        tbody {
                            @for order in &orders { (order_row(order, pending.get(&order.id), &staff)) }
                        }
                    }
                }
            }
            section.panel.wide {
                h2 { "Уведомления кассы" }
                p.muted { "Каждое событие применяется один раз: повторная доставка находит его здесь и ничего не меняет." }
                @if inbox.is_empty() {
                    p.muted { "Уведомлений пока не было." }
                } @else {
                    table.inbox {
                        thead { tr { th { "Получено" } th { "Событие" } th { "Заказ" } th { "webhook-id" } } }
                        tbody {
                            @for entry in &inbox {
                                @let event: serde_json::Value = entry.event.as_deref()
                                    .and_then(|e| serde_json::from_str(e).ok()).unwrap_or_default();
                                tr.inbox-entry {
                                    td { (when(entry.created_at)) }
                                    td { (event_name(event["type"].as_str().unwrap_or(""))) }
                                    td { (event["data"]["order_id"].as_str().unwrap_or("—")) }
                                    td.mono { (entry.webhook_id) }
                                }
                            }
                        }
                    }
                }
            }
            section.panel.wide {
                h2 { "Возвраты" }
                @if refunds.is_empty() {
                    p.muted { "Возвратов не было." }
                } @else {
                    table.refunds {
                        thead { tr {
                            th { "Когда" } th { "Заказ" } th.num { "Сумма" } th { "Состояние" } th { "Возврат в кассе" }
                        } }
                        tbody {
                            @for refund in &refunds {
                                tr.refund data-state=(match refund.state {
                                    RefundState::Pending => "pending",
                                    RefundState::Succeeded => "succeeded",
                                    RefundState::Failed => "failed",
                                }) {
                                    td { (when(refund.created_at)) }
                                    td { (refund.order_id) }
                                    td.num { (rub(refund.amount)) }
                                    td { @match refund.state {
                                        RefundState::Pending => {
                                            span.pending { "Ждёт ответа кассы" }
                                            " " (retry_form(refund, &staff))
                                        },
                                        RefundState::Succeeded => span.ok { "Выполнен" },
                                        RefundState::Failed => span.bad { "Отказ: " (refund.failure.as_deref().unwrap_or("")) },
                                    } }
                                    td.mono { (refund.refund_id.as_deref().unwrap_or("—")) }
                                }
                            }
                        }
                    }
                }
            }
        },
    ))
}

/// «Повторить»: the waiting refund sent again with its own key (the checkout refunds once,
/// however often it is sent).
fn retry_form(refund: &RefundRequest, staff: &Staff) -> Markup {
    html! {
        form.retry-refund-form method="post" action=(format!("/admin/orders/{}/refunds", refund.order_id)) {
            input type="hidden" name="csrf" value=(staff.csrf);
            input type="hidden" name="key" value=(refund.idempotency_key);
            input type="hidden" name="amount" value=(rub(refund.amount).trim_end_matches(" ₽").trim_end_matches("\u{a0}₽"));
            button.retry-refund type="submit" { "Повторить" }
        }
    }
}

fn order_row(order: &Order, pending: Option<&RefundRequest>, staff: &Staff) -> Markup {
    let left = order.amount - order.refunded;
    html! {
        tr.order id=(order.id) data-state=(state_name(order)) {
            td.mono { a href=(format!("/orders/{}", order.id)) { (order.id) } }
            td { (when(order.created_at)) }
            td.num { (rub(order.amount)) }
            td { @match (&order.state, &order.payment_id) {
                (OrderState::Paid, Some(payment_id)) => {
                    span.ok { "Оплачен" }
                    span.muted.paid-via { @match order.paid_via.as_deref() {
                        Some("webhook") => " · из уведомления кассы",
                        Some("page") => " · подтверждён со страницы",
                        _ => "",
                    } }
                    br; span.mono.payment { (payment_id) }
                },
                (OrderState::Expired, _) => span.muted.expired { "Срок оплаты истёк" },
                _ => span.pending { "Ожидает оплаты" },
            } }
            td.num.refunded { (rub(order.refunded)) }
            td.num.bonus { @match order.bonus { Some(points) => { (points) " б." }, None => "—" } }
            td {
                @match order.state {
                    OrderState::Paid if pending.is_some() => {
                        @if let Some(refund) = pending {
                            span.pending.refund-pending { "Возврат " (rub(refund.amount)) " ждёт ответа кассы" }
                            (retry_form(refund, staff))
                        }
                    },
                    OrderState::Paid if left > 0 => {
                        form.refund-form method="post" action=(format!("/admin/orders/{}/refunds", order.id)) {
                            input type="hidden" name="csrf" value=(staff.csrf);
                            // A new key for each rendering of the form; every submission of
                            // this one (a double click, a resend) carries the same.
                            input type="hidden" name="key" value=(uuid::Uuid::new_v4());
                            label {
                                span.visually-hidden { "Сумма возврата" }
                                input type="text" name="amount" inputmode="decimal" size="9"
                                    value=(rub(left).trim_end_matches(" ₽").trim_end_matches("\u{a0}₽"));
                            }
                            button.refund type="submit" { "Вернуть" }
                        }
                    },
                    OrderState::Paid => span.muted { "Возвращён полностью" },
                    OrderState::Expired => span.muted { "—" },
                    OrderState::AwaitingPayment => {
                        form method="post" action=(format!("/admin/orders/{}/confirm", order.id)) {
                            input type="hidden" name="csrf" value=(staff.csrf);
                            button.secondary type="submit" { "Проверить оплату" }
                        }
                    },
                }
            }
        }
    }
}

fn event_name(event_type: &str) -> &str {
    match event_type {
        "payment.succeeded" => "Оплата",
        "refund.succeeded" => "Возврат",
        "checkout_session.expired" => "Сессия истекла",
        other => other,
    }
}

/// `POST /admin/orders/{id}/refunds` (`amount` in roubles, `key`): refunds once per key.
pub async fn refund(
    State(shop): State<Shop>,
    staff: Staff,
    Path(order_id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Redirect, ShopError> {
    staff.check(&form)?;
    let amount = form
        .get("amount")
        .and_then(|a| parse_rub(a))
        .ok_or_else(|| ShopError::BadInput("Сумма возврата указана неверно".into()))?;
    let key = form.get("key").map(String::as_str).unwrap_or("");
    orders::refund(&shop, &order_id, key, amount).await?;
    Ok(Redirect::to("/admin"))
}

/// `POST /admin/orders/{id}/confirm`: asks the checkout whether the order was paid (for a
/// shopper who closed the tab before the page could tell the shop).
pub async fn confirm(
    State(shop): State<Shop>,
    staff: Staff,
    Path(order_id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Redirect, ShopError> {
    staff.check(&form)?;
    let order = orders::get(&shop, &order_id).await?;
    orders::confirm(&shop, order).await?;
    Ok(Redirect::to("/admin"))
}
