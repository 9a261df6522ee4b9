//! A fiscal receipt (54-ФЗ), and how one is read off the checkout's event: `payment.succeeded`
//! becomes «приход» listing the session's lines, `refund.succeeded` «возврат прихода» of the
//! amount returned. An event that cannot be read so is refused with the reason, for the
//! dead-letter queue.

use checkout_shared::{EventBody, LineItem};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";
pub const REFUND_SUCCEEDED: &str = "refund.succeeded";

/// «Приход» (the shopper paid) or «возврат прихода» (the shop gave money back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Income,
    IncomeReturn,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Income => "income",
            Kind::IncomeReturn => "income_return",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "income" => Some(Kind::Income),
            "income_return" => Some(Kind::IncomeReturn),
            _ => None,
        }
    }

    /// As the printed receipt names itself.
    pub fn title(self) -> &'static str {
        match self {
            Kind::Income => "Кассовый чек. Приход",
            Kind::IncomeReturn => "Кассовый чек. Возврат прихода",
        }
    }
}

/// One line: what, how many, at what price, for how much (kopecks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub name: String,
    pub quantity: u32,
    pub unit_price: i64,
    pub total: i64,
}

/// A receipt as `GET /receipts` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub receipt_id: String,
    pub kind: Kind,
    pub title: String,
    pub payment_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    pub order_id: String,
    pub currency: String,
    pub livemode: bool,
    pub lines: Vec<Line>,
    /// Kopecks: the lines' sum.
    pub total: i64,
    /// The checkout's event (the broker's `message_id`) it was issued from.
    pub event_id: String,
    /// RFC 3339: when the money moved, as the event says.
    pub operation_at: String,
    /// RFC 3339: when this receipt was written.
    pub issued_at: String,
}

/// A receipt to be written, as read off its event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewReceipt {
    pub kind: Kind,
    pub payment_id: String,
    pub refund_id: Option<String>,
    pub order_id: String,
    pub currency: String,
    pub livemode: bool,
    pub lines: Vec<Line>,
    pub total: i64,
    pub event_id: String,
    pub operation_at: String,
}

/// Reads the receipt an event calls for; `Err` says why it cannot be issued.
pub fn from_event(event_id: &str, body: &Value) -> Result<NewReceipt, String> {
    let event: EventBody =
        serde_json::from_value(body.clone()).map_err(|e| format!("not a checkout event: {e}"))?;
    let data = &event.data;
    let text = |field: &str| match data.get(field).and_then(Value::as_str) {
        Some(value) if !value.is_empty() => Ok(value.to_owned()),
        _ => Err(format!("{}: data.{field} is missing", event.event_type)),
    };
    let amount = match data.get("amount").and_then(Value::as_i64) {
        Some(amount) if amount > 0 => amount,
        _ => {
            return Err(format!(
                "{}: data.amount is not a positive number of kopecks",
                event.event_type
            ));
        }
    };
    let order_id = text("order_id")?;
    let (kind, refund_id, lines) = match event.event_type.as_str() {
        PAYMENT_SUCCEEDED => {
            let items: Vec<LineItem> = match data.get("items") {
                None | Some(Value::Null) => Vec::new(),
                Some(items) => serde_json::from_value(items.clone())
                    .map_err(|e| format!("payment.succeeded: data.items: {e}"))?,
            };
            let lines = if items.is_empty() {
                let name = data
                    .get("description")
                    .and_then(Value::as_str)
                    .filter(|d| !d.is_empty())
                    .map_or_else(|| format!("Оплата заказа {order_id}"), str::to_owned);
                vec![single_line(name, amount)]
            } else {
                items
                    .iter()
                    .map(|item| {
                        Ok(Line {
                            name: item.name.clone(),
                            quantity: item.quantity,
                            unit_price: item.unit_price,
                            total: item.total().ok_or("a line's total overflows")?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?
            };
            (Kind::Income, None, lines)
        }
        REFUND_SUCCEEDED => {
            // The checkout refunds an amount, not items: one line of what was returned.
            let line = single_line(format!("Возврат по заказу {order_id}"), amount);
            (Kind::IncomeReturn, Some(text("refund_id")?), vec![line])
        }
        other => return Err(format!("no receipt is issued for a {other} event")),
    };
    let total = lines
        .iter()
        .try_fold(0i64, |sum, line| sum.checked_add(line.total))
        .ok_or("the lines' sum overflows")?;
    if total != amount {
        return Err(format!(
            "{}: the lines add up to {total}, not to the amount {amount}",
            event.event_type
        ));
    }
    Ok(NewReceipt {
        kind,
        payment_id: text("payment_id")?,
        refund_id,
        order_id,
        currency: text("currency")?,
        livemode: event.livemode,
        lines,
        total,
        event_id: event_id.to_owned(),
        operation_at: event.timestamp,
    })
}

fn single_line(name: String, amount: i64) -> Line {
    Line {
        name,
        quantity: 1,
        unit_price: amount,
        total: amount,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payment(data: Value) -> Value {
        json!({"type": "payment.succeeded", "livemode": false,
               "timestamp": "2026-12-04T10:00:00.000Z", "data": data})
    }

    #[test]
    fn a_payment_lists_its_lines_and_a_refund_its_amount() {
        let event = payment(json!({
            "payment_id": "pay_1", "order_id": "A-1", "amount": 25_000, "currency": "RUB",
            "items": [{"name": "Чай", "quantity": 2, "unit_price": 10_000},
                      {"name": "Мёд", "quantity": 1, "unit_price": 5_000}]}));
        let receipt = from_event("evt_1", &event).unwrap();
        assert_eq!(receipt.kind, Kind::Income);
        assert_eq!(receipt.total, 25_000);
        assert_eq!(receipt.lines[0].total, 20_000);
        assert_eq!(receipt.operation_at, "2026-12-04T10:00:00.000Z");

        let refund = json!({"type": "refund.succeeded", "timestamp": "2026-12-04T11:00:00.000Z",
            "data": {"refund_id": "re_1", "payment_id": "pay_1", "order_id": "A-1",
                     "amount": 5_000, "currency": "RUB"}});
        let receipt = from_event("evt_2", &refund).unwrap();
        assert_eq!(receipt.kind, Kind::IncomeReturn);
        assert_eq!(receipt.refund_id.as_deref(), Some("re_1"));
        assert_eq!(receipt.lines[0].name, "Возврат по заказу A-1");
        assert_eq!(receipt.total, 5_000);
    }

    #[test]
    fn a_payment_without_items_is_one_line_of_its_amount() {
        let event = payment(
            json!({"payment_id": "pay_1", "order_id": "A-1", "amount": 700,
                                   "currency": "RUB", "items": []}),
        );
        let receipt = from_event("evt_1", &event).unwrap();
        assert_eq!(
            receipt.lines,
            vec![single_line("Оплата заказа A-1".into(), 700)]
        );
    }

    #[test]
    fn what_cannot_be_a_receipt_says_why() {
        let reasons = [
            (json!({"hello": 1}), "not a checkout event"),
            (
                payment(json!({"payment_id": "p", "order_id": "A", "currency": "RUB"})),
                "data.amount is not a positive number",
            ),
            (
                payment(
                    json!({"payment_id": "p", "order_id": "A", "amount": 5, "currency": "RUB",
                            "items": [{"name": "x", "quantity": 1, "unit_price": 4}]}),
                ),
                "the lines add up to 4, not to the amount 5",
            ),
            (
                json!({"type": "checkout_session.expired", "timestamp": "t",
                    "data": {"order_id": "A", "amount": 5}}),
                "no receipt is issued for a checkout_session.expired event",
            ),
        ];
        for (event, reason) in reasons {
            let error = from_event("evt_1", &event).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
    }
}
