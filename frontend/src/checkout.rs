//! The widget's whole state as plain data: the cart, the payment intent, the refunds, and the
//! words the shopper reads. Everything here is persisted in `sessionStorage` as one JSON value.

use checkout_shared::{CreatePayment, CreateRefund, ErrorCode, Payment, Refund, format_rub};
use serde::{Deserialize, Serialize};

use crate::intent::{Intent, Phase, RetryReason, new_key};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub name: String,
    pub quantity: u32,
    /// Kopecks.
    pub unit_price: i64,
}

impl Item {
    pub fn total(&self) -> i64 {
        self.unit_price * i64::from(self.quantity)
    }
}

/// The order in the cart: what is paid for, fixed once the intent exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub items: Vec<Item>,
    pub currency: String,
}

impl Order {
    pub fn total(&self) -> i64 {
        self.items.iter().map(Item::total).sum()
    }

    pub fn request(&self) -> CreatePayment {
        CreatePayment {
            order_id: self.order_id.clone(),
            amount: self.total(),
            currency: Some(self.currency.clone()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundOrder {
    pub payment_id: String,
    pub amount: i64,
}

impl RefundOrder {
    pub fn request(&self) -> CreateRefund {
        CreateRefund {
            amount: self.amount,
        }
    }
}

pub type PaymentIntent = Intent<Order, Payment>;
pub type RefundIntent = Intent<RefundOrder, Refund>;

/// The demo shop's carts, one per purchase in turn: the second one costs more than what is
/// left after the first, so a demo shows a decline too.
fn demo_cart(purchase: u32) -> Vec<Item> {
    let item = |name: &str, quantity, unit_price| Item {
        name: name.into(),
        quantity,
        unit_price,
    };
    match purchase % 3 {
        0 => vec![
            item("Кофе в зёрнах «Эфиопия», 250 г", 2, 15_000),
            item("Фильтры для пуровера, 100 шт.", 1, 15_000),
        ],
        1 => vec![item("Кофемолка ручная", 1, 70_000)],
        _ => vec![item("Шоколад горький 72 %", 3, 4_000)],
    }
}

/// Random bytes for a new intent: its key, and its order number.
#[derive(Clone, Copy, Debug)]
pub struct Seed {
    pub key: [u8; 16],
    pub order: [u8; 4],
}

/// Everything the widget remembers across refreshes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkout {
    /// How many purchases this session started before this one.
    pub purchase: u32,
    pub payment: PaymentIntent,
    /// The refund being made, or the last one made, until the shopper asks for another.
    pub refund: Option<RefundIntent>,
    /// Refunds made against this payment, in order.
    pub refunds: Vec<Refund>,
}

impl Checkout {
    /// A new purchase: a new order and a new key, both made now, once.
    pub fn new(purchase: u32, seed: Seed) -> Checkout {
        let order_id = format!(
            "ORD-{}",
            seed.order
                .iter()
                .map(|b| format!("{b:02X}"))
                .collect::<String>()
        );
        let order = Order {
            order_id,
            items: demo_cart(purchase),
            currency: "RUB".into(),
        };
        Checkout {
            purchase,
            payment: Intent::new(new_key(seed.key), order),
            refund: None,
            refunds: Vec::new(),
        }
    }

    /// «Новая покупка»: only once this one has an outcome, never while its outcome is unknown.
    pub fn next_purchase(&self, seed: Seed) -> Option<Checkout> {
        (!self.payment.is_pending()).then(|| Checkout::new(self.purchase + 1, seed))
    }

    pub fn receipt(&self) -> Option<&Payment> {
        match &self.payment.phase {
            Phase::Succeeded { receipt } => Some(receipt),
            _ => None,
        }
    }

    /// What may still be refunded of the payment.
    pub fn refundable(&self) -> i64 {
        let refunded = self.refunds.last().map_or(0, |r| r.refunded_total);
        self.receipt().map_or(0, |p| p.amount - refunded)
    }

    /// Makes a refund intent with its own key, unless one is already unsettled: a second click
    /// reuses it instead of making another key. Returns whether the intent may be sent.
    pub fn begin_refund(&mut self, amount: i64, key_seed: [u8; 16]) -> bool {
        let Some(payment_id) = self.receipt().map(|p| p.payment_id.clone()) else {
            return false;
        };
        if self.refund.as_ref().is_some_and(|r| r.is_pending()) {
            return true;
        }
        self.refund = Some(Intent::new(
            new_key(key_seed),
            RefundOrder { payment_id, amount },
        ));
        true
    }

    /// Files a succeeded refund under the payment once, however often its answer arrives.
    pub fn settle_refund(&mut self) {
        if let Some(Phase::Succeeded { receipt }) = self.refund.as_ref().map(|r| &r.phase)
            && !self
                .refunds
                .iter()
                .any(|r| r.refund_id == receipt.refund_id)
        {
            self.refunds.push(receipt.clone());
        }
    }

    /// «Ещё один возврат»: clears a settled refund so that the form shows again.
    pub fn clear_refund(&mut self) {
        if !self.refund.as_ref().is_some_and(|r| r.is_pending()) {
            self.refund = None;
        }
    }
}

/// Roubles as a shopper types them («150», «150,5», «1 200.50») → kopecks.
pub fn parse_rub(text: &str) -> Option<i64> {
    let cleaned: String = text
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '₽')
        .collect();
    let (roubles, kopecks) = match cleaned.split_once([',', '.']) {
        Some((r, k)) => (r, k),
        None => (cleaned.as_str(), ""),
    };
    if roubles.is_empty() || !roubles.chars().all(|c| c.is_ascii_digit()) || roubles.len() > 10 {
        return None;
    }
    if kopecks.len() > 2 || !kopecks.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let kopecks = format!("{kopecks:0<2}").parse::<i64>().ok()?;
    Some(roubles.parse::<i64>().ok()? * 100 + kopecks)
}

fn attempt_suffix(attempt: u32) -> String {
    format!(" (попытка {attempt})")
}

/// The status line under the pay button.
pub fn payment_status(intent: &PaymentIntent) -> String {
    match &intent.phase {
        Phase::Created => String::new(),
        Phase::Sending { after: None, .. } => "Оплачиваем…".into(),
        Phase::Sending {
            attempt,
            after: Some(reason),
        } => retry_text(*reason, *attempt, "Платёж"),
        Phase::Retrying { attempt, reason } => retry_text(*reason, attempt + 1, "Платёж"),
        Phase::Succeeded { .. } => "Оплачено".into(),
        Phase::Declined { problem } => match problem.code {
            ErrorCode::InsufficientFunds => match problem.balance {
                Some(balance) => format!(
                    "Отказ: недостаточно средств (на счёте {})",
                    format_rub(balance)
                ),
                None => "Отказ: недостаточно средств".into(),
            },
            ErrorCode::OrderAlreadyPaid => "Этот заказ уже оплачен".into(),
            _ => format!("Отказ: {}", problem.detail),
        },
        Phase::Failed {
            retryable: true, ..
        } => "Нет связи с сервером. Повторите: дважды деньги не спишутся.".into(),
        Phase::Failed { message, .. } => format!("Платёж не прошёл: {message}"),
    }
}

/// The status line of the refund control.
pub fn refund_status(intent: &RefundIntent) -> String {
    match &intent.phase {
        Phase::Created => String::new(),
        Phase::Sending { after: None, .. } => "Возвращаем…".into(),
        Phase::Sending {
            attempt,
            after: Some(reason),
        } => retry_text(*reason, *attempt, "Возврат"),
        Phase::Retrying { attempt, reason } => retry_text(*reason, attempt + 1, "Возврат"),
        Phase::Succeeded { receipt } => format!("Возвращено {}", format_rub(receipt.amount)),
        Phase::Declined { problem } => match (problem.code, problem.refundable) {
            (ErrorCode::RefundExceedsPayment, Some(left)) => {
                format!(
                    "Нельзя вернуть больше остатка: доступно {}",
                    format_rub(left)
                )
            }
            _ => format!("Возврат отклонён: {}", problem.detail),
        },
        Phase::Failed {
            retryable: true, ..
        } => "Нет связи с сервером. Повторите: дважды деньги не вернутся.".into(),
        Phase::Failed { message, .. } => format!("Возврат не прошёл: {message}"),
    }
}

fn retry_text(reason: RetryReason, attempt: u32, what: &str) -> String {
    match reason {
        RetryReason::ConnectionLost => {
            format!("Соединение потеряно, повторяем…{}", attempt_suffix(attempt))
        }
        RetryReason::ServerError => {
            format!("Сервер не ответил, повторяем…{}", attempt_suffix(attempt))
        }
        RetryReason::InProgress => format!("{what} выполняется, ждём…"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::{Attempt, RetryPolicy};
    use checkout_shared::{PaymentStatus, Problem};

    fn seed(n: u8) -> Seed {
        Seed {
            key: [n; 16],
            order: [n; 4],
        }
    }

    fn paid(checkout: &mut Checkout) {
        checkout.payment.start_attempt();
        let receipt = Payment {
            payment_id: "pay_1".into(),
            order_id: checkout.payment.request.order_id.clone(),
            amount: checkout.payment.request.total(),
            currency: "RUB".into(),
            status: PaymentStatus::Succeeded,
            balance: 55_000,
            created_at: "2026-12-02T10:00:00Z".into(),
        };
        let body = serde_json::to_string(&receipt).unwrap();
        checkout.payment.finish_attempt(
            &Attempt::Answered {
                status: 201,
                body,
                retry_after: None,
            },
            &RetryPolicy::WIDGET,
            0.0,
        );
    }

    #[test]
    fn a_purchase_has_one_order_and_one_key_until_the_next() {
        let mut checkout = Checkout::new(0, seed(1));
        assert_eq!(checkout.payment.request.order_id, "ORD-01010101");
        assert_eq!(checkout.payment.request.total(), 45_000);
        assert_eq!(checkout.payment.request.request().amount, 45_000);
        assert!(
            checkout.next_purchase(seed(2)).is_none(),
            "no new purchase while this one is unsettled"
        );
        paid(&mut checkout);
        let next = checkout.next_purchase(seed(2)).unwrap();
        assert_ne!(next.payment.key, checkout.payment.key);
        assert_ne!(
            next.payment.request.order_id,
            checkout.payment.request.order_id
        );
        assert_eq!(
            next.payment.request.total(),
            70_000,
            "the second demo cart exceeds what is left"
        );
    }

    #[test]
    fn a_second_refund_click_reuses_the_unsettled_refund() {
        let mut checkout = Checkout::new(0, seed(1));
        assert!(
            !checkout.begin_refund(100, [9; 16]),
            "nothing to refund before the payment"
        );
        paid(&mut checkout);
        assert!(checkout.begin_refund(10_000, [9; 16]));
        let key = checkout.refund.as_ref().unwrap().key.clone();
        assert!(checkout.begin_refund(10_000, [10; 16]));
        assert_eq!(
            checkout.refund.as_ref().unwrap().key,
            key,
            "same key on the second click"
        );

        let refund = checkout.refund.as_mut().unwrap();
        refund.start_attempt();
        let body = serde_json::to_string(&Refund {
            refund_id: "ref_1".into(),
            payment_id: "pay_1".into(),
            amount: 10_000,
            refunded_total: 10_000,
            balance: 65_000,
            created_at: "t".into(),
        })
        .unwrap();
        refund.finish_attempt(
            &Attempt::Answered {
                status: 201,
                body,
                retry_after: None,
            },
            &RetryPolicy::WIDGET,
            0.0,
        );
        checkout.settle_refund();
        checkout.settle_refund();
        assert_eq!(checkout.refunds.len(), 1, "a refund is filed once");
        assert_eq!(checkout.refundable(), 35_000);
        checkout.clear_refund();
        assert!(checkout.begin_refund(5_000, [11; 16]));
        assert_ne!(
            checkout.refund.as_ref().unwrap().key,
            key,
            "a new refund is a new key"
        );
    }

    #[test]
    fn the_status_line_says_what_is_happening() {
        let mut checkout = Checkout::new(0, seed(1));
        assert_eq!(payment_status(&checkout.payment), "");
        checkout.payment.start_attempt();
        assert_eq!(payment_status(&checkout.payment), "Оплачиваем…");
        checkout
            .payment
            .finish_attempt(&Attempt::NetworkError, &RetryPolicy::WIDGET, 0.0);
        assert_eq!(
            payment_status(&checkout.payment),
            "Соединение потеряно, повторяем… (попытка 2)"
        );
        checkout.payment.start_attempt();
        assert_eq!(
            payment_status(&checkout.payment),
            "Соединение потеряно, повторяем… (попытка 2)"
        );
        let busy =
            serde_json::to_string(&Problem::new(409, ErrorCode::IdempotencyKeyInUse, "d")).unwrap();
        checkout.payment.finish_attempt(
            &Attempt::Answered {
                status: 409,
                body: busy,
                retry_after: None,
            },
            &RetryPolicy::WIDGET,
            0.0,
        );
        assert_eq!(
            payment_status(&checkout.payment),
            "Платёж выполняется, ждём…"
        );
        checkout.payment.start_attempt();
        let mut decline = Problem::new(402, ErrorCode::InsufficientFunds, "d");
        decline.balance = Some(10_000);
        let body = serde_json::to_string(&decline).unwrap();
        checkout.payment.finish_attempt(
            &Attempt::Answered {
                status: 402,
                body,
                retry_after: None,
            },
            &RetryPolicy::WIDGET,
            0.0,
        );
        assert_eq!(
            payment_status(&checkout.payment),
            "Отказ: недостаточно средств (на счёте 100,00\u{a0}₽)"
        );
    }

    #[test]
    fn roubles_parse_as_a_shopper_types_them() {
        assert_eq!(parse_rub("150"), Some(15_000));
        assert_eq!(parse_rub("150,5"), Some(15_050));
        assert_eq!(parse_rub(" 1 200.05 ₽"), Some(120_005));
        assert_eq!(parse_rub("0,01"), Some(1));
        for bad in ["", ",5", "1,234", "abc", "-5", "1e3", "12345678901"] {
            assert_eq!(parse_rub(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_whole_state_survives_session_storage() {
        let mut checkout = Checkout::new(4, seed(3));
        paid(&mut checkout);
        checkout.begin_refund(1_000, [5; 16]);
        let saved = serde_json::to_string(&checkout).unwrap();
        assert_eq!(serde_json::from_str::<Checkout>(&saved).unwrap(), checkout);
    }
}
