//! What the shop does with the checkout, each step safe to repeat: place an order and open its
//! checkout session (with the order's own idempotency key), confirm a payment by asking the
//! checkout (never the browser), refund with the back office form's key.

use checkout_shared::{CheckoutSessionStatus, CreateCheckoutSession, ErrorCode, LineItem, Problem};

use crate::checkout_api::CallError;
use crate::error::ShopError;
use crate::store::{NewOrder, Order, OrderState, RefundRequest, RefundState};
use crate::{Shop, now_ms};

/// The order of a cart form (one per `cart_token`: a double submit makes one), with its
/// checkout session if the checkout could be reached now.
pub async fn place(shop: &Shop, cart_token: &str, items: &[LineItem]) -> Result<Order, ShopError> {
    let amount = items
        .iter()
        .map(|item| item.total())
        .sum::<Option<i64>>()
        .ok_or_else(|| ShopError::BadInput("Слишком большой заказ".into()))?;
    let id = new_order_id();
    let session_key = uuid::Uuid::new_v4().to_string();
    let order = shop
        .store
        .place_order(NewOrder {
            id: &id,
            cart_token,
            items,
            amount,
            session_key: &session_key,
            now_ms: now_ms(),
        })
        .await?;
    match open_session(shop, order.clone()).await {
        Ok(order) => Ok(order),
        // The order stands; its page offers to try again (with the same key).
        Err(ShopError::Checkout(CallError::Unavailable(why))) => {
            tracing::warn!(order = %order.id, "no checkout session yet: {why}");
            Ok(order)
        }
        Err(error) => Err(error),
    }
}

/// Opens the order's checkout session unless it has one. Always with the order's own key, so
/// a lost answer (or a shop restarted mid-call) ends on the one session.
pub async fn open_session(shop: &Shop, order: Order) -> Result<Order, ShopError> {
    if order.checkout_session_id.is_some() {
        return Ok(order);
    }
    let request = CreateCheckoutSession {
        order_id: order.id.clone(),
        amount: order.amount,
        currency: None,
        description: Some(format!("Заказ {}", order.id)),
        items: Some(order.items.clone()),
        // The checkout's full payment page (a shopper without the frame) comes back here.
        return_url: shop
            .public_url
            .join(&format!("orders/{}", order.id))
            .ok()
            .map(String::from),
    };
    let session_id = match shop
        .checkout
        .create_session(&order.session_key, &request)
        .await
    {
        Ok(session) => session.session_id,
        // Made before under another key: it is still this order's session.
        Err(CallError::Refused(Problem {
            code: ErrorCode::OrderSessionExists,
            checkout_session_id: Some(existing),
            ..
        })) => existing,
        Err(error) => return Err(error.into()),
    };
    shop.store.set_session(&order.id, &session_id).await?;
    get(shop, &order.id).await
}

/// Asks the checkout whether the order was paid, and marks it so if it was: the session says
/// paid, and the payment it names, read with the shop's secret key, is this order's, of its
/// amount. What the browser said is only a hint to ask.
pub async fn confirm(shop: &Shop, order: Order) -> Result<Order, ShopError> {
    let (OrderState::AwaitingPayment, Some(session_id)) =
        (&order.state, &order.checkout_session_id)
    else {
        return Ok(order);
    };
    let session = shop.checkout.session(session_id).await?;
    let (CheckoutSessionStatus::Paid, Some(payment_id)) = (session.status, &session.payment_id)
    else {
        return Ok(order);
    };
    let details = shop.checkout.payment(payment_id).await?;
    let payment = &details.payment;
    if payment.order_id != order.id
        || payment.amount != order.amount
        || payment.checkout_session_id.as_deref() != Some(session_id.as_str())
    {
        return Err(ShopError::Mismatch(format!(
            "order {} ({}) vs payment {} of order {} ({})",
            order.id, order.amount, payment.payment_id, payment.order_id, payment.amount
        )));
    }
    if shop
        .store
        .mark_paid(&order.id, &payment.payment_id, now_ms())
        .await?
    {
        tracing::info!(order = %order.id, payment = %payment.payment_id, "order paid");
    }
    shop.store
        .set_refunded(&order.id, details.refunded_total)
        .await?;
    get(shop, &order.id).await
}

/// Refunds `amount` of a paid order under the back office form's `key`. The request is recorded
/// first; a second submission of the same form finds it and resends the same key, so the
/// checkout refunds once however often it is sent or its answer is lost.
pub async fn refund(
    shop: &Shop,
    order_id: &str,
    key: &str,
    amount: i64,
) -> Result<RefundRequest, ShopError> {
    let order = get(shop, order_id).await?;
    let Some(payment_id) = order.payment_id.clone() else {
        return Err(ShopError::Conflict(
            "Заказ ещё не оплачен: возвращать нечего".into(),
        ));
    };
    if uuid::Uuid::parse_str(key).is_err() {
        return Err(ShopError::BadInput(
            "Форма возврата устарела: обновите страницу".into(),
        ));
    }
    if amount <= 0 {
        return Err(ShopError::BadInput(
            "Сумма возврата должна быть больше нуля".into(),
        ));
    }
    let request = shop
        .store
        .claim_refund(key, order_id, amount, now_ms())
        .await?
        .ok_or_else(|| {
            ShopError::Conflict(
                "По этому заказу уже есть возврат без ответа кассы: сначала нажмите «Повторить» у него"
                    .into(),
            )
        })?;
    if request.order_id != order_id || request.amount != amount {
        return Err(ShopError::Conflict(
            "Эта форма уже отправлена с другой суммой: обновите страницу".into(),
        ));
    }
    if request.state != RefundState::Pending {
        return Ok(request);
    }
    match shop.checkout.refund(&payment_id, key, amount).await {
        Ok(refund) => {
            shop.store.refund_succeeded(key, &refund.refund_id).await?;
            shop.store
                .set_refunded(order_id, refund.refunded_total)
                .await?;
        }
        Err(CallError::Refused(problem)) => {
            shop.store.refund_failed(key, refusal(problem.code)).await?;
        }
        Err(error) => return Err(error.into()),
    }
    shop.store
        .claim_refund(key, order_id, amount, now_ms())
        .await?
        .ok_or(ShopError::NotFound)
}

/// Why the checkout refused a refund, for the shop's staff.
fn refusal(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::RefundExceedsPayment => "Сумма больше, чем осталось вернуть по заказу",
        ErrorCode::InsufficientFunds => "На счёте магазина недостаточно средств",
        ErrorCode::IdempotencyKeyReused => "Форма уже отправлена с другой суммой",
        ErrorCode::NotFound => "Платёж не найден",
        _ => "Платёжный сервис отказал в возврате",
    }
}

/// The order with this id, or `404`.
pub async fn get(shop: &Shop, order_id: &str) -> Result<Order, ShopError> {
    shop.store.order(order_id).await?.ok_or(ShopError::NotFound)
}

/// `ORD-` and 10 random characters of Crockford's base32: unique at the checkout as well,
/// even when the shop's database starts over.
fn new_order_id() -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut bits = uuid::Uuid::new_v4().as_u128();
    let tail: String = (0..10)
        .map(|_| {
            let ch = ALPHABET[(bits % 32) as usize] as char;
            bits /= 32;
            ch
        })
        .collect();
    format!("ORD-{tail}")
}
