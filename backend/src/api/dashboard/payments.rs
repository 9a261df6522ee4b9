//! Payments in the dashboard: the overview with its charts, the list searched, a payment with
//! its ledger rows, refunds and events, and the refund button.
//!
//! The refund form carries an idempotency key made when the page was drawn: a double click, a
//! resent form or a reloaded answer are the same request with the same key, and refund once
//! (the checkout's own protocol, as `POST /api/payments/{id}/refunds` runs it).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use checkout_shared::{IdempotencyKey, Problem, parse_rub};
use maud::{Markup, html};

use super::{
    Failure, Mode, PageResult, Posted, Section, Signed, charts, hidden, page, rub, see_other, when,
};
use crate::api::keyed_requests::{self, Asked};
use crate::api::state::AppState;
use crate::clock;
use crate::operations::authentication::Principal;
use crate::operations::refunds::RefundOrder;
use crate::operations::staff::Role;
use crate::store::AccountKind;
use crate::store::reports::{PaymentLine, PaymentSearch};

/// How many rows a list shows at once.
const PAGE_ROWS: i64 = 50;
const DAY_MS: i64 = charts::DAY_MS;
/// Moscow is UTC+3 all year.
const MOSCOW_MS: i64 = 3 * 3600 * 1000;

/// A payment's state as its list and page name it.
fn state(amount: i64, refunded: i64) -> (&'static str, &'static str) {
    match refunded {
        0 => ("paid", "Оплачен"),
        r if r >= amount => ("refunded", "Возвращён"),
        _ => ("partially_refunded", "Возвращён частично"),
    }
}

/// `GET /dashboard`: the last 30 days in pictures.
pub async fn overview(
    State(app): State<AppState>,
    signed: Signed,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let shop = signed.shop(&app, mode).await?;
    let since = charts::first_day(clock::now_ms());
    let [payments, refunds, attempts] = app
        .store
        .days(&shop.account_id, since, charts::DAYS)
        .await?;
    let sum = |days: &[crate::store::reports::Day]| {
        days.iter()
            .fold((0, 0), |(c, t), d| (c + d.count, t + d.total))
    };
    let (paid_count, paid_total) = sum(&payments);
    let (refund_count, refund_total) = sum(&refunds);
    let (tried, succeeded) = sum(&attempts);
    let content = html! {
        section.panel {
            h1 { "Обзор за 30 дней" }
            dl.figures {
                div { dt { "Платежей" } dd { (paid_count) " на " (rub(paid_total)) } }
                div { dt { "Возвратов" } dd { (refund_count) " на " (rub(refund_total)) } }
                div { dt { "Доставка вебхуков" } dd {
                    @if tried == 0 { "попыток не было" }
                    @else { (charts::percent(succeeded, tried)) " успешных (попыток: " (tried) ")" }
                } }
            }
        }
        section.panel {
            h2 { "Платежи и возвраты по дням, ₽" }
            (charts::money_per_day(since, &payments, &refunds))
        }
        section.panel {
            h2 { "Число платежей и возвратов по дням" }
            (charts::count_per_day(since, &payments, &refunds))
        }
        section.panel {
            h2 { "Успешные доставки вебхуков по дням" }
            p.muted { "Конечная точка: " (shop.webhook_url.as_deref().unwrap_or("не задана")) }
            (charts::success_per_day(since, &attempts))
        }
    };
    Ok(page(
        "Обзор",
        Some(&signed),
        mode,
        Section::Overview,
        content,
    ))
}

/// The search form's values, as typed.
struct Filters {
    text: String,
    amount: String,
    from: String,
    to: String,
    state: String,
}

/// A date typed as `ГГГГ-ММ-ДД` (what a date field sends): its Moscow day's start.
fn date(text: &str) -> Option<i64> {
    let date = time::Date::parse(
        text.trim(),
        time::macros::format_description!("[year]-[month]-[day]"),
    )
    .ok()?;
    Some(date.midnight().assume_utc().unix_timestamp() * 1000 - MOSCOW_MS)
}

fn search_of(query: &HashMap<String, String>) -> Result<(Filters, PaymentSearch), Failure> {
    let field = |name: &str| {
        query
            .get(name)
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let filters = Filters {
        text: field("q"),
        amount: field("amount"),
        from: field("from"),
        to: field("to"),
        state: field("state"),
    };
    let bad = |what: &str| Failure::Shown(StatusCode::BAD_REQUEST, what.to_owned());
    let amount = match filters.amount.as_str() {
        "" => 0,
        text => parse_rub(text)
            .filter(|a| *a > 0)
            .ok_or_else(|| bad("Сумма должна быть в рублях, например 150 или 150,50"))?,
    };
    let from_ms = match filters.from.as_str() {
        "" => 0,
        text => date(text).ok_or_else(|| bad("Дата «с» должна быть вида 2026-12-01"))?,
    };
    let until_ms = match filters.to.as_str() {
        "" => i64::MAX,
        text => date(text).ok_or_else(|| bad("Дата «по» должна быть вида 2026-12-31"))? + DAY_MS,
    };
    if !["", "paid", "partially_refunded", "refunded"].contains(&filters.state.as_str()) {
        return Err(bad("Нет такого состояния платежа"));
    }
    let before = query.get("before").and_then(|b| {
        let (at, id) = b.split_once('_').map(|(at, _)| (at, &b[at.len() + 1..]))?;
        Some((at.parse().ok()?, id.to_owned()))
    });
    let search = PaymentSearch {
        text: filters.text.clone(),
        amount,
        from_ms,
        until_ms,
        state: filters.state.clone(),
        before,
        limit: PAGE_ROWS,
    };
    Ok((filters, search))
}

/// `GET /dashboard/payments`: the shop's payments in this mode, newest first, searched.
pub async fn list(
    State(app): State<AppState>,
    signed: Signed,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let shop = signed.shop(&app, mode).await?;
    let (filters, search) = search_of(&query)?;
    let rows = app.store.search_payments(&shop.account_id, &search).await?;
    let next = (rows.len() as i64 == PAGE_ROWS).then(|| {
        let last = &rows[rows.len() - 1];
        let mut params: Vec<(&str, String)> = vec![
            ("mode", mode.as_str().to_owned()),
            ("before", format!("{}_{}", last.created_at, last.payment_id)),
        ];
        for (name, value) in [
            ("q", &filters.text),
            ("amount", &filters.amount),
            ("from", &filters.from),
            ("to", &filters.to),
            ("state", &filters.state),
        ] {
            if !value.is_empty() {
                params.push((name, value.clone()));
            }
        }
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        format!("/dashboard/payments?{query}")
    });
    let content = html! {
        section.panel {
            h1 { "Платежи" }
            form.search method="get" action="/dashboard/payments" role="search" {
                input type="hidden" name="mode" value=(mode.as_str());
                div { label for="q" { "Заказ или платёж" }
                      input #q type="search" name="q" value=(filters.text) placeholder="order-42 или pay_…"; }
                div { label for="amount" { "Сумма, ₽" }
                      input #amount type="text" inputmode="decimal" name="amount" value=(filters.amount); }
                div { label for="from" { "С" } input #from type="date" name="from" value=(filters.from); }
                div { label for="to" { "По" } input #to type="date" name="to" value=(filters.to); }
                div { label for="state" { "Состояние" }
                    select #state name="state" {
                        @for (value, name) in [("", "любое"), ("paid", "оплачен"), ("partially_refunded", "возвращён частично"), ("refunded", "возвращён")] {
                            option value=(value) selected[filters.state == value] { (name) }
                        }
                    }
                }
                div.actions { button.primary type="submit" { "Найти" } }
            }
        }
        section.panel {
            @if rows.is_empty() {
                p { "Платежей не найдено." }
            } @else {
                (payments_table(mode, &rows))
            }
            @if let Some(next) = next {
                p { a href=(next) { "Дальше →" } }
            }
        }
    };
    Ok(page(
        "Платежи",
        Some(&signed),
        mode,
        Section::Payments,
        content,
    ))
}

fn payments_table(mode: Mode, rows: &[PaymentLine]) -> Markup {
    html! {
        div.scroll tabindex="0" role="region" aria-label="Платежи" {
            table {
                thead { tr { th { "Когда" } th { "Заказ" } th { "Платёж" } th.num { "Сумма" } th.num { "Возвращено" } th { "Состояние" } } }
                tbody {
                    @for p in rows {
                        @let (code, name) = state(p.amount, p.refunded);
                        tr {
                            td { (when(p.created_at)) }
                            td { (p.order_id) }
                            td.mono { a href=(mode.href(&format!("/dashboard/payments/{}", p.payment_id))) { (p.payment_id) } }
                            td.num { (rub(p.amount)) }
                            td.num { (rub(p.refunded)) }
                            td { span.state data-state=(code) { (name) } }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /dashboard/payments/{id}`: the payment, what is left to refund, its refunds, its ledger
/// rows and its events.
pub async fn show(
    State(app): State<AppState>,
    signed: Signed,
    Path(payment_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let shop = signed.shop(&app, mode).await?;
    let not_found = || {
        Failure::Shown(
            StatusCode::NOT_FOUND,
            "Такого платежа у магазина нет".into(),
        )
    };
    let (payment, refunds) = app
        .store
        .payment_with_refunds(&shop.account_id, &payment_id)
        .await?
        .ok_or_else(not_found)?;
    let ledger = app.store.payment_ledger(&payment_id).await?;
    let events = app
        .store
        .subject_events(&payment_id, &shop.account_id)
        .await?;
    let refundable = payment.amount - payment.refunded;
    let (code, name) = state(payment.amount, payment.refunded);
    let notice = query.get("refunded").map(|r| r.as_str());
    let replayed = query.contains_key("replayed");
    let content = html! {
        section.panel {
            p { a href=(mode.href("/dashboard/payments")) { "← Все платежи" } }
            h1 { "Платёж " span.mono { (payment.payment_id) } }
            @if let Some(refund_id) = notice {
                p.notice role="status" {
                    @if replayed { "Этот возврат уже был проведён (повтор того же запроса): " }
                    @else { "Возврат проведён: " }
                    span.mono { (refund_id) }
                }
            }
            dl.facts {
                div { dt { "Состояние" } dd { span.state data-state=(code) { (name) } } }
                div { dt { "Заказ" } dd { (payment.order_id) } }
                div { dt { "Сумма" } dd { (rub(payment.amount)) } }
                div { dt { "Возвращено" } dd { (rub(payment.refunded)) } }
                div { dt { "Можно вернуть" } dd #refundable { (rub(refundable)) } }
                div { dt { "Когда" } dd { (when(payment.created_at)) } }
            }
            @if refundable > 0 && signed.member.role <= Role::Staff {
                form.refund method="post" action=(format!("/dashboard/payments/{payment_id}/refunds")) {
                    (hidden(&signed, mode))
                    input type="hidden" name="key" value=(format!("dash_{}", uuid::Uuid::new_v4().simple()));
                    label for="amount" { "Сумма возврата, ₽" }
                    input #amount type="text" inputmode="decimal" name="amount" required value=(format!("{},{:02}", refundable / 100, refundable % 100));
                    button.primary type="submit" { "Вернуть" }
                }
            }
        }
        section.panel {
            h2 { "Возвраты" }
            @if refunds.is_empty() { p { "Возвратов не было." } }
            @else {
                div.scroll tabindex="0" role="region" aria-label="Возвраты" {
                    table {
                        thead { tr { th { "Когда" } th { "Возврат" } th.num { "Сумма" } th.num { "Всего возвращено" } } }
                        tbody { @for r in &refunds { tr {
                            td { (when(r.created_at)) } td.mono { (r.refund_id) }
                            td.num { (rub(r.amount)) } td.num { (rub(r.refunded_total_after)) }
                        } } }
                    }
                }
            }
        }
        section.panel {
            h2 { "Проводки" }
            div.scroll tabindex="0" role="region" aria-label="Проводки" {
                table {
                    thead { tr { th { "№" } th { "Счёт" } th { "Вид" } th.num { "Сумма" } th { "Когда" } } }
                    tbody { @for l in &ledger { tr {
                        td { (l.entry_id) }
                        td { (if l.account_kind == "shop" { "магазин" } else { "покупатель" }) " " span.mono { (l.account_id) } }
                        td { (if l.kind == "payment" { "платёж" } else { "возврат" }) }
                        td.num { (rub(l.amount)) }
                        td { (when(l.created_at)) }
                    } } }
                }
            }
        }
        section.panel {
            h2 { "События" }
            (super::webhooks::events_table(mode, &events))
        }
    };
    Ok(page(
        "Платёж",
        Some(&signed),
        mode,
        Section::Payments,
        content,
    ))
}

/// `POST /dashboard/payments/{id}/refunds`: a refund, keyed by the form's key; then back to the
/// payment's page, which tells whether it ran now or was already done.
pub async fn refund(
    State(app): State<AppState>,
    signed: Signed,
    Path(payment_id): Path<String>,
    form: Posted,
) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Staff)?;
    let shop = signed.shop(&app, mode).await?;
    let bad = |what: &str| Failure::Shown(StatusCode::BAD_REQUEST, what.to_owned());
    let amount = form
        .get("amount")
        .and_then(|a| parse_rub(a))
        .filter(|a| *a > 0)
        .ok_or_else(|| bad("Сумма возврата должна быть в рублях, например 150 или 150,50"))?;
    let key = form
        .get("key")
        .and_then(|k| IdempotencyKey::parse(k).ok())
        .ok_or_else(|| bad("Форма пришла без ключа: обновите страницу"))?;
    let principal = Principal {
        account_id: shop.account_id.clone(),
        currency: crate::operations::authentication::DEFAULT_CURRENCY.to_owned(),
        kind: AccountKind::Shop,
        livemode: shop.livemode,
        origins: shop.origins.clone(),
    };
    let route = format!("/api/payments/{payment_id}/refunds");
    let canonical = serde_json::json!({ "amount": amount });
    let order = RefundOrder {
        payment_id: payment_id.clone(),
        amount,
        livemode: shop.livemode,
        by: Some(signed.member.clone()),
    };
    let asked = Asked {
        route: &route,
        body: &canonical,
        location: None,
    };
    let answer = keyed_requests::execute(&app, &principal, &key, asked, order).await?;
    let status = answer.status();
    let replayed = answer
        .headers()
        .get(checkout_shared::IDEMPOTENT_REPLAYED_HEADER)
        .is_some();
    let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    if status == StatusCode::CREATED {
        let refund: checkout_shared::Refund = serde_json::from_slice(&body).map_err(|e| {
            crate::operations::error::OperationError::from(crate::store::StoreError::Other(
                e.into(),
            ))
        })?;
        let mut to = mode.href(&format!(
            "/dashboard/payments/{payment_id}?refunded={}",
            refund.refund_id
        ));
        if replayed {
            to.push_str("&replayed=1");
        }
        return Ok(see_other(&to));
    }
    let problem: Option<Problem> = serde_json::from_slice(&body).ok();
    let message = match problem.as_ref().map(|p| p.code.as_str()) {
        Some("refund_exceeds_payment") => format!(
            "Нельзя вернуть больше, чем осталось: можно вернуть {}",
            rub(problem.as_ref().and_then(|p| p.refundable).unwrap_or(0))
        ),
        Some("insufficient_funds") => {
            "На балансе магазина не хватает денег для этого возврата".to_owned()
        }
        Some("not_found") => "Такого платежа у магазина нет".to_owned(),
        Some("idempotency_key_reused") => {
            "Эта форма уже отправлялась с другой суммой: обновите страницу".to_owned()
        }
        _ => "Возврат не проведён; повторите чуть позже".to_owned(),
    };
    Err(Failure::Shown(status, message))
}
