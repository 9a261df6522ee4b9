//! The widget's whole state as plain data: the cart, the payment intent, the shop's refunds, and the
//! words the shopper reads. Everything here is persisted in `sessionStorage` as one JSON value,
//! inside a versioned envelope ([`Saved`]): a state this release cannot read is never silently
//! replaced, its intent is recovered from what can be salvaged of it ([`salvage`]).

use checkout_shared::{
    CheckoutSession, CheckoutSessionStatus, CreatePayment, ErrorCode, Payment, PaymentDetails,
    Refund, format_rub,
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
/// names only the session; the amount and items are shown, never sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Empty until the shop's session has been fetched: nothing can be paid before.
    #[serde(default)]
    pub checkout_session_id: String,
    /// Who is paid, as the session names it: the shopper sees it before paying.
    #[serde(default)]
    pub shop_name: Option<String>,
    pub order_id: String,
    /// What is paid, in kopecks: the session's amount (0 in a state saved before it was kept).
    #[serde(default)]
    pub amount: i64,
    /// What the order is, shown when it has no items.
    #[serde(default)]
    pub description: Option<String>,
    /// The amount's breakdown, if the shop gave one.
    pub items: Vec<Item>,
    pub currency: String,
    /// Where the full payment page sends the shopper back to, if the shop said.
    #[serde(default)]
    pub return_url: Option<String>,
    /// Live money (a signed-in shopper pays) or test money, as the session says: taken from it
    /// at every start (never saved: the session is the truth, and the bytes are every shopper's).
    #[serde(skip)]
    pub livemode: bool,
}

impl Order {
    /// What the payment debits: the session's amount (the items are only its breakdown).
    pub fn total(&self) -> i64 {
        if self.amount > 0 {
            self.amount
        } else {
            self.items.iter().map(Item::total).sum()
        }
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
            amount: session.amount,
            description: session.description.clone(),
            return_url: session.return_url.clone(),
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
            livemode: session.livemode,
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
    /// What the session itself says, when that settles the purchase without this intent: paid
    /// (by another shopper, or another tab's intent), or expired.
    #[serde(default)]
    pub session: SessionState,
}

/// The session as the server last told it, where it matters to the shopper.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Open (or not known otherwise): this intent decides.
    #[default]
    Open,
    /// Paid, by this payment, though not by this intent.
    Paid { payment_id: String, amount: i64 },
    /// It can no longer be paid.
    Expired,
}

/// What the page that embeds the widget is told, once per outcome: never a balance, a token or
/// anything else of the shopper's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    Paid(PaidDetail),
    Declined(DeclinedDetail),
}

/// `checkout:paid`'s `detail`: which payment paid the session, and how much.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(Serialize))]
pub struct PaidDetail {
    pub payment_id: String,
    pub amount: i64,
    pub status: String,
}

/// `checkout:declined`'s `detail`: why, by the problem's stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(Serialize))]
pub struct DeclinedDetail {
    pub code: ErrorCode,
}

impl HostEvent {
    pub fn name(&self) -> &'static str {
        match self {
            HostEvent::Paid(_) => "checkout:paid",
            HostEvent::Declined(_) => "checkout:declined",
        }
    }

    /// Tells one outcome from another (a second decline after paying again is a new outcome).
    pub fn identity(&self, key: &str) -> String {
        match self {
            HostEvent::Paid(paid) => format!("paid:{}", paid.payment_id),
            HostEvent::Declined(declined) => {
                format!("declined:{}:{key}", declined.code.as_str())
            }
        }
    }
}

impl Checkout {
    /// A new purchase: its key, made now, once; its order is the shop's session, fetched next.
    pub fn new(seed: Seed, now_ms: i64) -> Checkout {
        let order = Order {
            checkout_session_id: String::new(),
            shop_name: None,
            order_id: String::new(),
            amount: 0,
            description: None,
            items: Vec::new(),
            currency: "RUB".into(),
            return_url: None,
            livemode: false,
        };
        Checkout {
            payment: Intent::new(new_key(seed.key), order, now_ms),
            refunds: Vec::new(),
            notice: None,
            recovering: false,
            session: SessionState::Open,
        }
    }

    /// What the session says now (read on every mount and from other tabs). A session paid or
    /// expired settles a purchase whose intent has nothing on its way; an intent that may have
    /// been sent finds out itself (a resend is replayed, or refused as paid or expired).
    pub fn observe_session(&mut self, session: &CheckoutSession) {
        if session.session_id != self.payment.request.checkout_session_id {
            return;
        }
        let ours = self.receipt().map(|r| r.payment_id.clone());
        let unsent = matches!(
            self.payment.phase,
            Phase::Created
                | Phase::Declined { .. }
                | Phase::Failed {
                    retryable: false,
                    ..
                }
        );
        self.session = match (session.status, &session.payment_id) {
            (CheckoutSessionStatus::Paid, Some(paid)) if ours.as_ref() != Some(paid) && unsent => {
                SessionState::Paid {
                    payment_id: paid.clone(),
                    amount: session.amount,
                }
            }
            (CheckoutSessionStatus::Expired, _) if ours.is_none() && unsent => {
                SessionState::Expired
            }
            _ => return,
        };
    }

    /// The session was paid, not by this intent (its `409` named a payment this shopper cannot
    /// see): the purchase is settled, and no money moved for this intent.
    pub fn paid_by_another(&mut self, payment_id: &str) {
        if self.receipt().is_some() {
            return;
        }
        self.payment.phase = Phase::Failed {
            message: messages::refusal(ErrorCode::SessionAlreadyPaid),
            retryable: false,
        };
        self.session = SessionState::Paid {
            payment_id: payment_id.to_owned(),
            amount: self.payment.request.total(),
        };
    }

    /// Another tab of this session (a tab opened on its own, with its own intent) paid it.
    pub fn paid_in_another_tab(&mut self, theirs: &Checkout) {
        if let Some(receipt) = theirs.receipt()
            && self.receipt().is_none()
            && !self.payment.is_in_flight()
        {
            self.session = SessionState::Paid {
                payment_id: receipt.payment_id.clone(),
                amount: receipt.amount,
            };
        }
    }

    /// Paying again after a decline, with the session still open: a new intent, so a new key
    /// (the declined key's stored answer is its decline for good).
    pub fn start_over(&mut self, seed: Seed, now_ms: i64) -> bool {
        let declined = matches!(self.payment.phase, Phase::Declined { .. });
        if !declined || self.session != SessionState::Open {
            return false;
        }
        let order = self.payment.request.clone();
        self.payment = Intent::new(new_key(seed.key), order, now_ms);
        self.notice = None;
        true
    }

    /// A decline the shopper may answer by paying again (the session is still open).
    pub fn can_pay_again(&self) -> bool {
        self.session == SessionState::Open
            && matches!(
                &self.payment.phase,
                Phase::Declined { problem } if problem.code == ErrorCode::InsufficientFunds
            )
    }

    /// How the purchase ended, as the embedding page hears it (if it has ended).
    pub fn host_event(&self) -> Option<HostEvent> {
        let paid = |payment_id: &str, amount: i64| {
            Some(HostEvent::Paid(PaidDetail {
                payment_id: payment_id.to_owned(),
                amount,
                status: "succeeded".into(),
            }))
        };
        if let Some(receipt) = self.receipt() {
            return paid(&receipt.payment_id, receipt.amount);
        }
        let declined = |code| Some(HostEvent::Declined(DeclinedDetail { code }));
        match (&self.session, &self.payment.phase) {
            (SessionState::Paid { payment_id, amount }, _) => paid(payment_id, *amount),
            (SessionState::Expired, _) => declined(ErrorCode::SessionExpired),
            (SessionState::Open, Phase::Declined { problem }) => declined(problem.code),
            _ => None,
        }
    }

    /// Whether the purchase has an outcome the shopper sees instead of the pay button.
    pub fn is_settled(&self) -> bool {
        !self.payment.is_pending() || self.session != SessionState::Open
    }

    /// Nothing sent yet, and no session: the shop's session is still to be fetched.
    pub fn awaits_session(&self) -> bool {
        !self.payment.request.is_fetched() && self.payment.phase == Phase::Created
    }

    /// The shop's session is wanted: none yet, or what it shows was lost (an intent salvaged
    /// from a write cut short keeps its session id, not always its amount and items; a state
    /// saved before the amount was kept has none).
    pub fn wants_session(&self) -> bool {
        let order = &self.payment.request;
        self.awaits_session() || (order.is_fetched() && order.amount == 0)
    }

    /// The shop's session for this purchase. Taken whole while nothing has been sent (the key
    /// stays, the order becomes the session's); for an intent that has this session but lost
    /// what it shows, only that. `false` if nothing was taken.
    pub fn adopt_session(&mut self, session: &CheckoutSession) -> bool {
        let order = Order::of_session(session);
        if self.awaits_session() {
            self.payment.request = order;
            return true;
        }
        let ours = &mut self.payment.request;
        if ours.checkout_session_id == order.checkout_session_id && ours.amount == 0 {
            ours.items = order.items;
            ours.amount = order.amount;
            ours.description = order.description;
            ours.shop_name = order.shop_name;
            ours.livemode = order.livemode;
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
    let (key, order_id, items, session, amount, description) = match json::parse(text) {
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
                request.field("amount").and_then(|a| a.decode::<i64>()),
                request.field("description").and_then(|d| d.as_text()),
            )
        }
        // Not JSON (a write cut short): the payment intent comes first in the saved text, so its
        // key and order are usually still there (what it shows is fetched again).
        None => (
            text_field(text, "\"key\":\"")?,
            text_field(text, "\"order_id\":\"")?,
            None,
            text_field(text, "\"checkout_session_id\":\""),
            None,
            None,
        ),
    };
    checkout_shared::IdempotencyKey::parse(&key).ok()?;
    checkout_shared::validate_order_id(&order_id).ok()?;
    let order = Order {
        checkout_session_id: session.unwrap_or_default(),
        shop_name: None,
        order_id,
        // Without its items, what is shown is fetched again (see `wants_session`).
        amount: if items.is_some() {
            amount.unwrap_or(0)
        } else {
            0
        },
        description,
        items: items.unwrap_or_default(),
        currency: "RUB".into(),
        return_url: None,
        livemode: false,
    };
    let mut payment = Intent::new(key, order, now_ms);
    // Whether it was ever sent is unknown: the server is asked.
    payment.phase = Phase::LookingUp;
    Some(Checkout {
        payment,
        refunds: Vec::new(),
        notice: Some(messages::STATE_UNREADABLE.into()),
        recovering: true,
        session: SessionState::Open,
    })
}

/// The text after the first `prefix`, up to the next `"`, `,` or `}`.
fn text_field(text: &str, prefix: &str) -> Option<String> {
    let (_, rest) = text.split_once(prefix)?;
    let end = rest.find(['"', ',', '}'])?;
    rest.get(..end).map(str::to_owned)
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
    use checkout_shared::{CheckoutSessionStatus, PaymentStatus, Problem};
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
            return_url: None,
            livemode: false,
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
            livemode: false,
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

    fn session_view(
        checkout: &Checkout,
        status: CheckoutSessionStatus,
        paid_by: Option<&str>,
    ) -> CheckoutSession {
        let mut session = shop_session(
            "ORD-SHOP",
            &[("Кофе в зёрнах", 2, 15_000), ("Фильтры", 1, 15_000)],
        );
        session.session_id = checkout.payment.request.checkout_session_id.clone();
        session.status = status;
        session.payment_id = paid_by.map(str::to_owned);
        session
    }

    #[test]
    fn what_is_paid_and_shown_is_the_sessions_amount_not_the_items_sum() {
        let mut checkout = Checkout::new(seed(1), 0);
        let mut session = shop_session("ORD-BARE", &[]);
        session.amount = 500_000;
        session.description = Some("Подписка на год".into());
        assert!(checkout.adopt_session(&session));
        assert_eq!(checkout.payment.request.total(), 500_000);
        assert_eq!(
            checkout.payment.request.description.as_deref(),
            Some("Подписка на год")
        );
        assert!(!checkout.wants_session(), "nothing more to fetch");
    }

    #[test]
    fn a_session_paid_by_someone_else_is_paid_never_declined() {
        let mut checkout = with_session(1);
        checkout.observe_session(&session_view(
            &checkout,
            CheckoutSessionStatus::Paid,
            Some("pay_other"),
        ));
        assert!(checkout.is_settled());
        assert_eq!(
            checkout.host_event(),
            Some(HostEvent::Paid(PaidDetail {
                payment_id: "pay_other".into(),
                amount: 45_000,
                status: "succeeded".into()
            }))
        );

        // Paid while our intent was on its way: the intent finds out itself (the session is
        // not taken as paid by another until its payment is seen not to be ours).
        let mut sending = with_session(2);
        sending.payment.start_attempt();
        sending.observe_session(&session_view(
            &sending,
            CheckoutSessionStatus::Paid,
            Some("pay_x"),
        ));
        assert_eq!(sending.session, SessionState::Open);
        assert!(!sending.is_settled());
        sending.paid_by_another("pay_x");
        assert!(sending.is_settled());
        assert!(matches!(sending.host_event(), Some(HostEvent::Paid(_))));
        assert!(
            !matches!(sending.payment.phase, Phase::Declined { .. }),
            "never a decline"
        );

        let mut lapsed = with_session(3);
        lapsed.observe_session(&session_view(&lapsed, CheckoutSessionStatus::Expired, None));
        assert_eq!(lapsed.session, SessionState::Expired);
        assert_eq!(
            lapsed.host_event(),
            Some(HostEvent::Declined(DeclinedDetail {
                code: ErrorCode::SessionExpired
            }))
        );
    }

    #[test]
    fn after_a_decline_paying_again_is_a_new_intent_with_a_new_key() {
        let mut checkout = with_session(4);
        assert!(!checkout.start_over(seed(9), 1), "nothing to start over");
        checkout.payment.start_attempt();
        let mut decline = Problem::new(402, ErrorCode::InsufficientFunds, "d");
        decline.balance = Some(100);
        checkout.payment.finish_attempt(
            &Attempt::answered(402, serde_json::to_string(&decline).unwrap()),
            &RetryPolicy::WIDGET,
            0.0,
            0,
        );
        assert!(checkout.can_pay_again());
        let declined_key = checkout.payment.key.clone();
        let Some(HostEvent::Declined(detail)) = checkout.host_event() else {
            panic!("declined")
        };
        assert_eq!(
            serde_json::to_value(&detail).unwrap(),
            serde_json::json!({"code": "insufficient_funds"}),
            "the page hears the code, never the shopper's balance"
        );
        assert!(checkout.start_over(seed(9), 1));
        assert_ne!(checkout.payment.key, declined_key, "a new key");
        assert_eq!(checkout.payment.phase, Phase::Created);
        assert_eq!(checkout.payment.request.total(), 45_000, "the same order");
        assert_eq!(checkout.host_event(), None);
    }

    #[test]
    fn the_page_hears_a_payment_without_the_shoppers_balance() {
        let mut checkout = with_session(6);
        paid(&mut checkout);
        let Some(HostEvent::Paid(detail)) = checkout.host_event() else {
            panic!("paid")
        };
        let detail = serde_json::to_value(&detail).unwrap();
        assert_eq!(
            detail,
            serde_json::json!({"payment_id": "pay_1", "amount": 45_000, "status": "succeeded"})
        );
    }
}
