//! The widget's whole state as plain data: the cart, the payment intent, the shop's refunds, and the
//! words the shopper reads. Everything here is persisted in `sessionStorage` as one JSON value,
//! inside a versioned envelope ([`Saved`]): a state this release cannot read is never silently
//! replaced, its intent is recovered from what can be salvaged of it ([`salvage`]).

use checkout_shared::{
    CheckoutSession, CreatePayment, ErrorCode, Payment, PaymentDetails, Refund, format_rub,
};
use serde::{Deserialize, Serialize};

use crate::intent::{Intent, Phase, RetryReason, new_key};
use crate::json::{self, Node};
use crate::messages;

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

/// The order in the cart: the shop's checkout session, whose amount the shop fixed. The payment
/// names only the session; the items are shown, never sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Empty until the shop's session has been fetched: nothing can be paid before.
    #[serde(default)]
    pub checkout_session_id: String,
    /// Who is paid, as the session names it: the shopper sees it before paying.
    #[serde(default)]
    pub shop_name: Option<String>,
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
            checkout_session_id: self.checkout_session_id.clone(),
        }
    }

    pub fn is_fetched(&self) -> bool {
        !self.checkout_session_id.is_empty()
    }

    pub fn of_session(session: &CheckoutSession) -> Order {
        Order {
            checkout_session_id: session.session_id.clone(),
            shop_name: session.shop.as_ref().map(|shop| shop.name.clone()),
            order_id: session.order_id.clone(),
            items: session
                .items
                .iter()
                .map(|item| Item {
                    name: item.name.clone(),
                    quantity: item.quantity,
                    unit_price: item.unit_price,
                })
                .collect(),
            currency: session.currency.clone(),
        }
    }
}

pub type PaymentIntent = Intent<Order, Payment>;

/// Random bytes for a new intent: its key.
#[derive(Clone, Copy, Debug)]
pub struct Seed {
    pub key: [u8; 16],
}

/// Everything the widget remembers across refreshes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkout {
    pub payment: PaymentIntent,
    /// Refunds made against this payment, in order.
    pub refunds: Vec<Refund>,
    /// Something the shopper must be told that is not the status of an intent.
    #[serde(default)]
    pub notice: Option<String>,
    /// The payment intent was salvaged from a state that could not be read: if the server
    /// never saw its key, it waits for a click instead of being sent on its own.
    #[serde(default)]
    pub recovering: bool,
}

impl Checkout {
    /// A new purchase: its key, made now, once; its order is the shop's session, fetched next.
    pub fn new(seed: Seed, now_ms: i64) -> Checkout {
        let order = Order {
            checkout_session_id: String::new(),
            shop_name: None,
            order_id: String::new(),
            items: Vec::new(),
            currency: "RUB".into(),
        };
        Checkout {
            payment: Intent::new(new_key(seed.key), order, now_ms),
            refunds: Vec::new(),
            notice: None,
            recovering: false,
        }
    }

    /// Nothing sent yet, and no session: the shop's session is still to be fetched.
    pub fn awaits_session(&self) -> bool {
        !self.payment.request.is_fetched() && self.payment.phase == Phase::Created
    }

    /// The shop's session is wanted: none yet, or the items of it were lost (an intent salvaged
    /// from a write cut short keeps its session id, not always its items).
    pub fn wants_session(&self) -> bool {
        let order = &self.payment.request;
        self.awaits_session() || (order.is_fetched() && order.items.is_empty())
    }

    /// The shop's session for this purchase. Taken whole while nothing has been sent (the key
    /// stays, the order becomes the session's); for an intent that has this session but lost
    /// its items, only what is shown. `false` if nothing was taken.
    pub fn adopt_session(&mut self, session: &CheckoutSession) -> bool {
        let order = Order::of_session(session);
        if self.awaits_session() {
            self.payment.request = order;
            return true;
        }
        let ours = &mut self.payment.request;
        if ours.checkout_session_id == order.checkout_session_id && ours.items.is_empty() {
            ours.items = order.items;
            ours.shop_name = order.shop_name;
            return true;
        }
        false
    }

    pub fn receipt(&self) -> Option<&Payment> {
        match &self.payment.phase {
            Phase::Succeeded { receipt } => Some(receipt),
            _ => None,
        }
    }

    /// The payment's refunds as the server has them (the truth, e.g. after another tab refunded).
    pub fn sync_refunds(&mut self, details: &PaymentDetails) {
        if self.receipt().map(|p| &p.payment_id) == Some(&details.payment.payment_id) {
            self.refunds = details.refunds.clone();
        }
    }
}

/// The version of [`Saved`] this release writes.
pub const STATE_VERSION: u32 = 2;

/// The saved state's envelope. Version 1 was a bare [`Checkout`] (without the fields added
/// since, which default).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Saved {
    pub version: u32,
    pub checkout: Checkout,
}

/// What a saved text turned out to be.
#[derive(Clone, Debug, PartialEq)]
pub enum Read {
    Current(Checkout),
    /// An older version, brought up to this one.
    Migrated(Checkout),
    /// Not a state this release can read: keep it aside, and salvage what can be.
    Unreadable,
}

pub fn read_saved(text: &str) -> Read {
    if let Some(saved) = json::from_str::<Saved>(text) {
        if saved.version == STATE_VERSION {
            return Read::Current(saved.checkout);
        }
        return Read::Unreadable;
    }
    match json::from_str::<Checkout>(text) {
        Some(v1) => Read::Migrated(v1),
        None => Read::Unreadable,
    }
}

pub fn write_saved(checkout: &Checkout) -> String {
    json::to_string(&Saved {
        version: STATE_VERSION,
        checkout: checkout.clone(),
    })
    .unwrap_or_default()
}

/// The state a page starts from, and whether the saved text must be kept aside (never
/// overwritten) because it could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct Restored {
    pub checkout: Checkout,
    pub keep_aside: bool,
}

/// From what `sessionStorage` held (if anything) to the state to start from: the saved state,
/// migrated if old; or, if it cannot be read, the intent salvaged from it (to be looked up);
/// or a new purchase, with the shopper told that something could not be read.
pub fn restore(saved: Option<&str>, seed: Seed, now_ms: i64) -> Restored {
    let fresh = |notice: Option<&str>| {
        let mut checkout = Checkout::new(seed, now_ms);
        checkout.notice = notice.map(str::to_owned);
        checkout
    };
    let Some(text) = saved else {
        return Restored {
            checkout: fresh(None),
            keep_aside: false,
        };
    };
    match read_saved(text) {
        Read::Current(checkout) | Read::Migrated(checkout) => Restored {
            checkout,
            keep_aside: false,
        },
        Read::Unreadable => Restored {
            checkout: salvage(text, now_ms)
                .unwrap_or_else(|| fresh(Some(messages::STATE_UNREADABLE_NOTHING_FOUND))),
            keep_aside: true,
        },
    }
}

/// The payment intent found in a state that cannot be read as a whole (a renamed field, a
/// truncated write): its key and its order, wherever they are. The intent's fate is then
/// learned from the server before anything is offered again; nothing is sent without that.
pub fn salvage(text: &str, now_ms: i64) -> Option<Checkout> {
    let (key, order_id, items, session) = match json::parse(text) {
        Some(value) => {
            let intent = find_payment_intent(&value)?;
            let request = intent.field("request")?;
            (
                intent.field("key")?.as_text()?,
                request.field("order_id")?.as_text()?,
                request.field("items").and_then(|items| items.decode()),
                request
                    .field("checkout_session_id")
                    .and_then(|id| id.as_text()),
            )
        }
        // Not JSON (a write cut short): the payment intent comes first in the saved text, so its
        // key and order are usually still there.
        None => (
            text_field(text, "\"key\":\"")?,
            text_field(text, "\"order_id\":\"")?,
            None,
            text_field(text, "\"checkout_session_id\":\""),
        ),
    };
    checkout_shared::IdempotencyKey::parse(&key).ok()?;
    checkout_shared::validate_order_id(&order_id).ok()?;
    let order = Order {
        checkout_session_id: session.unwrap_or_default(),
        shop_name: None,
        order_id,
        items: items.unwrap_or_default(),
        currency: "RUB".into(),
    };
    let mut payment = Intent::new(key, order, now_ms);
    // Whether it was ever sent is unknown: the server is asked.
    payment.phase = Phase::LookingUp;
    Some(Checkout {
        payment,
        refunds: Vec::new(),
        notice: Some(messages::STATE_UNREADABLE.into()),
        recovering: true,
    })
}

/// The text after the first `prefix`, up to the next `"`, `,` or `}`.
fn text_field(text: &str, prefix: &str) -> Option<String> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let end = rest.find(['"', ',', '}'])?;
    Some(rest[..end].to_owned())
}

/// The first object holding a `key` and a `request` with an `order_id`.
fn find_payment_intent<N: Node>(value: &N) -> Option<N> {
    let is_intent = value.field("key").and_then(|k| k.as_text()).is_some()
        && value
            .field("request")
            .and_then(|r| r.field("order_id"))
            .and_then(|id| id.as_text())
            .is_some();
    if is_intent {
        return Some(value.clone());
    }
    value.children().iter().find_map(find_payment_intent)
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
        Phase::LookingUp => "Проверяем, прошёл ли платёж…".into(),
        Phase::Confirming { .. } => "Заказ уже оплачен, загружаем чек…".into(),
        Phase::Reconciling => "Проверяем, прошёл ли платёж…".into(),
        Phase::NeedsSession => "Обновляем демо-сессию…".into(),
        Phase::Succeeded { .. } => "Оплачено".into(),
        Phase::Declined { problem } => match problem.code {
            ErrorCode::InsufficientFunds => match problem.balance {
                Some(balance) => format!(
                    "Отказ: недостаточно средств (на счёте {})",
                    format_rub(balance)
                ),
                None => "Отказ: недостаточно средств".into(),
            },
            code => format!("Отказ: {}", messages::refusal(code)),
        },
        Phase::Failed {
            retryable: true, ..
        } => "Нет связи с сервером. Повторите: дважды деньги не спишутся.".into(),
        Phase::Failed { message, .. } => format!("Платёж не прошёл: {message}"),
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
    use serde_json::Value;

    fn seed(n: u8) -> Seed {
        Seed { key: [n; 16] }
    }

    fn shop_session(
        order_id: &str,
        items: &[(&str, u32, i64)],
    ) -> checkout_shared::CheckoutSession {
        let items: Vec<_> = items
            .iter()
            .map(|&(name, quantity, unit_price)| checkout_shared::LineItem {
                name: name.into(),
                quantity,
                unit_price,
            })
            .collect();
        checkout_shared::CheckoutSession {
            session_id: format!("cs_{}", "a".repeat(32)),
            shop: None,
            order_id: order_id.into(),
            amount: items
                .iter()
                .map(|i| i.unit_price * i64::from(i.quantity))
                .sum(),
            currency: "RUB".into(),
            description: None,
            items,
            status: checkout_shared::CheckoutSessionStatus::Open,
            expires_at: "2026-12-03T12:00:00Z".into(),
            payment_id: None,
        }
    }

    /// A new purchase whose shop session has arrived.
    fn with_session(n: u8) -> Checkout {
        let mut checkout = Checkout::new(seed(n), 0);
        let session = shop_session(
            "ORD-SHOP",
            &[("Кофе в зёрнах", 2, 15_000), ("Фильтры", 1, 15_000)],
        );
        assert!(checkout.adopt_session(&session));
        checkout
    }

    fn receipt_of(checkout: &Checkout) -> Payment {
        Payment {
            checkout_session_id: None,
            payment_id: "pay_1".into(),
            order_id: checkout.payment.request.order_id.clone(),
            amount: checkout.payment.request.total(),
            currency: "RUB".into(),
            status: PaymentStatus::Succeeded,
            balance: Some(55_000),
            created_at: "2026-12-02T10:00:00Z".into(),
        }
    }

    fn paid(checkout: &mut Checkout) {
        checkout.payment.start_attempt();
        let body = serde_json::to_string(&receipt_of(checkout)).unwrap();
        checkout.payment.finish_attempt(
            &Attempt::answered(201, body),
            &RetryPolicy::WIDGET,
            0.0,
            0,
        );
    }

    #[test]
    fn a_purchase_has_one_key_and_takes_its_order_from_the_shops_session() {
        let mut checkout = Checkout::new(seed(1), 0);
        assert!(
            !checkout.payment.request.is_fetched() && checkout.payment.request.items.is_empty(),
            "nothing to show or pay before the shop's session arrives"
        );
        let session = shop_session("ORD-SHOP", &[("Кофе", 1, 45_000)]);
        let key = checkout.payment.key.clone();
        assert!(checkout.adopt_session(&session));
        assert_eq!(checkout.payment.key, key, "the key stays with the intent");
        assert_eq!(checkout.payment.request.order_id, "ORD-SHOP");
        assert_eq!(checkout.payment.request.total(), 45_000);
        assert_eq!(
            checkout.payment.request.request().checkout_session_id,
            session.session_id,
            "the payment names the session, never an amount"
        );
        assert!(!checkout.adopt_session(&session), "taken once");
        paid(&mut checkout);
        assert!(!checkout.adopt_session(&session), "never after the payment");
    }

    #[test]
    fn saved_states_are_versioned_and_the_old_version_migrates() {
        let mut checkout = with_session(3);
        paid(&mut checkout);
        let saved = write_saved(&checkout);
        assert!(saved.starts_with("{\"version\":2,"));
        assert_eq!(read_saved(&saved), Read::Current(checkout.clone()));

        // Version 1: the bare state, without the intents' times and the notice.
        let mut v1: Value = serde_json::to_value(&checkout).unwrap();
        v1.as_object_mut().unwrap().remove("notice");
        v1["payment"]
            .as_object_mut()
            .unwrap()
            .remove("created_at_ms");
        v1["payment"]
            .as_object_mut()
            .unwrap()
            .remove("key_expires_at_ms");
        let Read::Migrated(migrated) = read_saved(&v1.to_string()) else {
            panic!("version 1 migrates")
        };
        assert_eq!(migrated.payment.key, checkout.payment.key);
        assert_eq!(
            migrated.payment.key_expires_at_ms, None,
            "an expiry never learned"
        );

        assert_eq!(
            read_saved("{\"version\":3,\"checkout\":{}}"),
            Read::Unreadable
        );
        assert_eq!(read_saved("{\"vers"), Read::Unreadable);
    }

    #[test]
    fn an_unreadable_state_gives_up_its_intent_to_be_looked_up_never_a_new_key() {
        let mut checkout = with_session(5);
        checkout.payment.start_attempt();
        let saved = write_saved(&checkout).replace("\"payment\"", "\"payment_v9\"");
        assert_eq!(read_saved(&saved), Read::Unreadable);
        let recovered = salvage(&saved, 9).expect("the intent is found");
        assert_eq!(recovered.payment.key, checkout.payment.key, "the same key");
        assert_eq!(
            recovered.payment.request, checkout.payment.request,
            "the same order"
        );
        assert!(
            matches!(recovered.payment.phase, Phase::LookingUp),
            "asked, not sent"
        );
        assert_eq!(
            recovered.notice.as_deref(),
            Some(messages::STATE_UNREADABLE)
        );
        assert_eq!(salvage("{\"version\":2,\"chec", 0), None);
        let saved_text = write_saved(&checkout);
        let cut = &saved_text[..saved_text.find("\"items\"").unwrap()];
        let from_cut = salvage(cut, 0).expect("a cut write still names the key and the order");
        assert_eq!(from_cut.payment.key, checkout.payment.key);
        assert_eq!(from_cut.payment.request.order_id, "ORD-SHOP");
        assert!(from_cut.payment.request.items.is_empty(), "cut off");
        let mut from_cut = from_cut;
        assert!(from_cut.wants_session(), "the items are fetched again");
        let session = shop_session(
            "ORD-SHOP",
            &[("Кофе в зёрнах", 2, 15_000), ("Фильтры", 1, 15_000)],
        );
        assert!(from_cut.adopt_session(&session));
        assert_eq!(from_cut.payment.request, checkout.payment.request);
        assert_eq!(
            from_cut.payment.key, checkout.payment.key,
            "the key never changes"
        );
        assert!(!from_cut.wants_session());
        assert_eq!(
            salvage("{\"key\": \"not a key\", \"request\": {}}", 0),
            None
        );
    }

    #[test]
    fn the_status_line_says_what_is_happening_in_russian() {
        let mut checkout = with_session(1);
        assert_eq!(payment_status(&checkout.payment), "");
        checkout.payment.start_attempt();
        assert_eq!(payment_status(&checkout.payment), "Оплачиваем…");
        checkout
            .payment
            .finish_attempt(&Attempt::NetworkError, &RetryPolicy::WIDGET, 0.0, 0);
        assert_eq!(
            payment_status(&checkout.payment),
            "Соединение потеряно, повторяем… (попытка 2)"
        );
        checkout.payment.start_attempt();
        let busy =
            serde_json::to_string(&Problem::new(409, ErrorCode::IdempotencyKeyInUse, "d")).unwrap();
        checkout.payment.finish_attempt(
            &Attempt::answered(409, busy),
            &RetryPolicy::WIDGET,
            0.0,
            0,
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
            &Attempt::answered(402, body),
            &RetryPolicy::WIDGET,
            0.0,
            0,
        );
        assert_eq!(
            payment_status(&checkout.payment),
            "Отказ: недостаточно средств (на счёте 100,00\u{a0}₽)"
        );
        let mut refused = with_session(2);
        refused.payment.start_attempt();
        let english = Problem::new(400, ErrorCode::InvalidRequest, "amount must be an integer");
        refused.payment.finish_attempt(
            &Attempt::answered(400, serde_json::to_string(&english).unwrap()),
            &RetryPolicy::WIDGET,
            0.0,
            0,
        );
        let status = payment_status(&refused.payment);
        assert!(!status.contains("amount"), "{status}");
    }

    #[test]
    fn a_page_starts_from_what_was_saved_and_never_drops_an_unreadable_state() {
        let nothing = restore(None, seed(1), 0);
        assert!(!nothing.keep_aside && nothing.checkout.notice.is_none());
        let mut checkout = with_session(2);
        checkout.payment.start_attempt();
        let saved = write_saved(&checkout);
        assert_eq!(restore(Some(&saved), seed(3), 0).checkout, checkout);
        let broken = saved.replace("\"payment\"", "\"pay\"");
        let recovered = restore(Some(&broken), seed(3), 0);
        assert!(recovered.keep_aside);
        assert_eq!(recovered.checkout.payment.key, checkout.payment.key);
        let garbage = restore(Some("{\"versio"), seed(3), 0);
        assert!(
            garbage.keep_aside,
            "kept aside even when nothing could be salvaged"
        );
        assert_eq!(
            garbage.checkout.notice.as_deref(),
            Some(messages::STATE_UNREADABLE_NOTHING_FOUND)
        );
    }

    #[test]
    fn the_whole_state_survives_session_storage() {
        let mut checkout = with_session(3);
        paid(&mut checkout);
        let saved = write_saved(&checkout);
        assert_eq!(read_saved(&saved), Read::Current(checkout));
    }
}
