//! Webhooks in the dashboard: the shop's events and each delivery attempt (status, latency, the
//! answer's first bytes), one resent or everything recovered since a time; the endpoint of each
//! mode, and its signing secret rolled with an overlap while the shop's receiver moves to it.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use maud::{Markup, html};

use super::{
    Failure, Mode, PageResult, Posted, Section, Signed, charts, hidden, page, see_other, when,
};
use crate::api::state::AppState;
use crate::clock;
use crate::operations::endpoints::{self, By};
use crate::operations::events::SHOP_EVENT_TYPES;
use crate::operations::shops::ShopError;
use crate::operations::staff::Role;
use crate::store::EventRow;

const PAGE_ROWS: i64 = 50;

fn status_name(status: &str) -> &'static str {
    match status {
        "pending" => "в пути",
        "delivered" => "доставлено",
        "dead" => "не доставлено",
        "no_endpoint" => "нет конечной точки",
        "filtered" => "тип не выбран",
        _ => "неизвестно",
    }
}

/// A list of events, each linking to its page.
pub fn events_table(mode: Mode, events: &[EventRow]) -> Markup {
    html! {
        @if events.is_empty() { p { "Событий нет." } }
        @else {
            div.scroll tabindex="0" role="region" aria-label="События" {
                table {
                    thead { tr { th { "Когда" } th { "Тип" } th { "Событие" } th { "Доставка" } th.num { "Попыток" } } }
                    tbody { @for e in events { tr {
                        td { (when(e.created_at)) }
                        td.mono { (e.event_type) }
                        td.mono { a href=(mode.href(&format!("/dashboard/events/{}", e.event_id))) { (e.event_id) } }
                        td { span.delivery data-status=(e.status) { (status_name(&e.status)) } }
                        td.num { (e.attempts) }
                    } } }
                }
            }
        }
    }
}

/// `GET /dashboard/events`: the newest events, and recovery of what was missed.
pub async fn events(
    State(app): State<AppState>,
    signed: Signed,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let shop = signed.shop(&app, mode).await?;
    let before = query
        .get("before")
        .and_then(|b| b.parse().ok())
        .unwrap_or(i64::MAX);
    let events = app
        .store
        .shop_events(&shop.account_id, before, PAGE_ROWS)
        .await?;
    let next = (events.len() as i64 == PAGE_ROWS).then(|| {
        mode.href(&format!(
            "/dashboard/events?before={}",
            events[events.len() - 1].seq
        ))
    });
    let recovered = query.get("recovered");
    let content = html! {
        section.panel {
            h1 { "События" }
            @if let Some(count) = recovered {
                p.notice role="status" { "Отправлено снова событий: " (count) }
            }
            (events_table(mode, &events))
            @if let Some(next) = next { p { a href=(next) { "Дальше →" } } }
        }
        @if signed.member.role <= Role::Staff {
            section.panel {
                h2 { "Отправить снова всё пропущенное" }
                p.muted { "Недоставленные события с указанного времени уйдут на конечную точку снова, с теми же идентификаторами: приёмник магазина узнает повторы." }
                form.stack method="post" action="/dashboard/events/recovery" {
                    (hidden(&signed, mode))
                    label for="since" { "С какого времени (по Москве)" }
                    input #since type="datetime-local" name="since" required;
                    label.check { input type="checkbox" name="include_delivered" value="1"; " и доставленные тоже" }
                    button.primary type="submit" { "Отправить снова" }
                }
            }
        }
    };
    Ok(page(
        "События",
        Some(&signed),
        mode,
        Section::Events,
        content,
    ))
}

/// `GET /dashboard/events/{id}`: the event's body and every delivery attempt.
pub async fn event(
    State(app): State<AppState>,
    signed: Signed,
    Path(event_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let shop = signed.shop(&app, mode).await?;
    let event = app
        .store
        .shop_event(&shop.account_id, &event_id)
        .await?
        .ok_or_else(|| {
            Failure::Shown(
                StatusCode::NOT_FOUND,
                "Такого события у магазина нет".into(),
            )
        })?;
    let attempts = app.store.event_attempts(&event_id).await?;
    let body = serde_json::from_str::<serde_json::Value>(&event.body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| event.body.clone());
    let content = html! {
        section.panel {
            p { a href=(mode.href("/dashboard/events")) { "← Все события" } }
            h1 { "Событие " span.mono { (event.event_id) } }
            @if query.contains_key("resent") {
                p.notice role="status" { "Событие поставлено в очередь на отправку." }
            }
            dl.facts {
                div { dt { "Тип" } dd.mono { (event.event_type) } }
                div { dt { "Доставка" } dd { span.delivery data-status=(event.status) { (status_name(&event.status)) } } }
                div { dt { "Создано" } dd { (when(event.created_at)) } }
                @if let Some(at) = event.delivered_at { div { dt { "Доставлено" } dd { (when(at)) } } }
                @if let Some(error) = &event.last_error { div { dt { "Последняя ошибка" } dd { (error) } } }
            }
            @if event.subject_id.starts_with("pay_") {
                p { a href=(mode.href(&format!("/dashboard/payments/{}", event.subject_id))) { "Платёж " (event.subject_id) } }
            }
            @if signed.member.role <= Role::Staff {
                form method="post" action=(format!("/dashboard/events/{}/redelivery", event.event_id)) {
                    (hidden(&signed, mode))
                    button.primary type="submit" { "Отправить снова" }
                }
            }
        }
        section.panel {
            h2 { "Попытки доставки" }
            @if attempts.is_empty() { p { "Попыток ещё не было." } }
            @else {
                div.scroll tabindex="0" role="region" aria-label="Попытки доставки" {
                    table {
                        thead { tr { th { "№" } th { "Когда" } th { "Ответ" } th.num { "Время, мс" } th { "Начало ответа" } } }
                        tbody { @for a in &attempts { tr {
                            td { (a.attempt) }
                            td { (when(a.at)) }
                            td { @match a.status {
                                Some(s) if (200..300).contains(&s) => span.ok { (s) },
                                Some(s) => span.bad { (s) },
                                None => span.bad { "нет ответа" },
                            } }
                            td.num { (a.latency_ms) }
                            td.mono.excerpt { (a.excerpt) }
                        } } }
                    }
                }
            }
        }
        section.panel {
            h2 { "Тело события" }
            pre.mono.body tabindex="0" { (body) }
        }
    };
    Ok(page(
        "Событие",
        Some(&signed),
        mode,
        Section::Events,
        content,
    ))
}

/// `POST /dashboard/events/{id}/redelivery`
pub async fn redeliver(
    State(app): State<AppState>,
    signed: Signed,
    Path(event_id): Path<String>,
    form: Posted,
) -> PageResult {
    let (_, mode) = signed.posted(form, Role::Staff)?;
    let shop = signed.shop(&app, mode).await?;
    endpoints::redeliver(&app.store, &shop, &event_id, By::Member(&signed.member))
        .await?
        .ok_or_else(|| {
            Failure::Shown(
                StatusCode::NOT_FOUND,
                "Такого события у магазина нет".into(),
            )
        })?;
    app.deliveries.notify_one();
    Ok(see_other(
        &mode.href(&format!("/dashboard/events/{event_id}?resent=1")),
    ))
}

/// A `datetime-local` field's value (Moscow time): Unix ms.
fn moscow_time(text: &str) -> Option<i64> {
    let format = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]");
    let local = time::PrimitiveDateTime::parse(text.trim(), format).ok()?;
    Some(
        local
            .assume_offset(time::UtcOffset::from_hms(3, 0, 0).ok()?)
            .unix_timestamp()
            * 1000,
    )
}

/// `POST /dashboard/events/recovery`: every event missed since a time, sent again.
pub async fn recover(State(app): State<AppState>, signed: Signed, form: Posted) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Staff)?;
    let shop = signed.shop(&app, mode).await?;
    let since = form
        .get("since")
        .and_then(|s| moscow_time(s))
        .ok_or_else(|| {
            Failure::Shown(
                StatusCode::BAD_REQUEST,
                "Время должно быть вида 2026-12-01T10:00".into(),
            )
        })?;
    let include_delivered = form.contains_key("include_delivered");
    let by = By::Member(&signed.member);
    let recovered = endpoints::recover(&app.store, &shop, since, include_delivered, by).await?;
    app.deliveries.notify_one();
    Ok(see_other(
        &mode.href(&format!("/dashboard/events?recovered={recovered}")),
    ))
}

fn shop_failure(error: ShopError) -> Failure {
    match error {
        ShopError::WebhookUrl(_) => Failure::Shown(
            StatusCode::BAD_REQUEST,
            "Адрес должен начинаться с https:// (http:// — только для адреса на этой же машине)"
                .into(),
        ),
        ShopError::Store(error) => error.into(),
        other => Failure::Shown(StatusCode::BAD_REQUEST, other.to_string()),
    }
}

/// `GET /dashboard/webhooks`: this mode's endpoint, its delivery success, its secret.
pub async fn endpoint(
    State(app): State<AppState>,
    signed: Signed,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let shop = signed.shop(&app, mode).await?;
    let since = charts::first_day(clock::now_ms());
    let [_, _, attempts] = app
        .store
        .days(&shop.account_id, since, charts::DAYS)
        .await?;
    let owner = signed.member.role == Role::Owner;
    let new_secret = query
        .contains_key("secret_rolled")
        .then_some(&shop.signing_secret);
    let old_until = shop
        .old_signing_secret
        .as_ref()
        .map(|(_, until)| *until)
        .filter(|u| *u > clock::now_ms());
    let endpoint = endpoints::get(&app.store, &signed.member.shop_id, mode.livemode()).await?;
    let takes =
        |t: &str| endpoint.event_types.is_empty() || endpoint.event_types.iter().any(|e| e == t);
    let content = html! {
        section.panel {
            h1 { "Вебхуки: " (if mode == Mode::Live { "настоящие деньги" } else { "тестовые деньги" }) }
            @if query.contains_key("saved") { p.notice role="status" { "Настройки сохранены." } }
            @if let Some(event_id) = query.get("test_event") {
                p.notice role="status" { "Тестовое событие отправлено: " a.mono href=(mode.href(&format!("/dashboard/events/{event_id}"))) { (event_id) } }
            }
            @if let Some((at, reason)) = &endpoint.disabled {
                div.alert role="alert" {
                    strong { "Конечная точка отключена " (when(*at)) "." }
                    " Причина: " (reason_text(reason)) ". События не потеряны: они ждут и уйдут на неё, когда её включат."
                }
            } @else if let Some(since) = endpoint.failing_since {
                p.alert role="alert" { "Конечная точка не отвечает успехом с " (when(since)) ". Если так продлится, касса её отключит." }
            }
            dl.facts {
                div { dt { "Конечная точка" } dd.mono { (endpoint.url.as_deref().unwrap_or("не задана")) } }
                div { dt { "Состояние" } dd #endpoint-state { (if endpoint.disabled.is_some() { "отключена" } else { "включена" }) } }
                div { dt { "События" } dd { (if endpoint.event_types.is_empty() { "все типы".to_owned() } else { endpoint.event_types.join(", ") }) } }
                @if let Some(until) = old_until {
                    div { dt { "Старый секрет подписывает до" } dd { (when(until)) } }
                }
            }
            @if owner {
                form.stack method="post" action="/dashboard/webhooks" {
                    (hidden(&signed, mode))
                    label for="url" { "Адрес конечной точки (пусто — не отправлять)" }
                    input #url type="url" name="url" value=(endpoint.url.as_deref().unwrap_or(""));
                    fieldset {
                        legend { "Какие события отправлять" }
                        @for t in SHOP_EVENT_TYPES {
                            label.check { input type="checkbox" name=(format!("type:{t}")) value="1" checked[takes(t)]; " " span.mono { (t) } }
                        }
                    }
                    button.primary type="submit" { "Сохранить" }
                }
                div.actions {
                    form method="post" action="/dashboard/webhooks/state" {
                        (hidden(&signed, mode))
                        @if endpoint.disabled.is_some() {
                            input type="hidden" name="enabled" value="1";
                            button.primary type="submit" { "Включить" }
                        } @else {
                            input type="hidden" name="enabled" value="0";
                            button.secondary type="submit" { "Отключить" }
                        }
                    }
                    form method="post" action="/dashboard/webhooks/test-event" {
                        (hidden(&signed, mode))
                        button.secondary type="submit" { "Отправить тестовое событие" }
                    }
                }
            }
        }
        section.panel {
            h2 { "Успешные доставки по дням" }
            (charts::success_per_day(since, &attempts))
        }
        @if owner {
            section.panel {
                h2 { "Секрет подписи" }
                @if let Some(secret) = new_secret {
                    p.notice role="status" { "Новый секрет (сохраните его в приёмнике магазина): " }
                    p { code.mono.secret { (secret) } }
                }
                p.muted { "Новый секрет подписывает сразу. Старый может подписывать рядом с ним, пока приёмник не перейдёт на новый: каждое событие тогда несёт обе подписи." }
                form.stack method="post" action="/dashboard/webhooks/secret" {
                    (hidden(&signed, mode))
                    label for="overlap" { "Старый секрет подписывает ещё" }
                    select #overlap name="overlap" {
                        option value="0" { "нисколько — сразу перестаёт" }
                        option value="3600" { "1 час" }
                        option value="86400" selected { "24 часа" }
                        option value="604800" { "7 дней" }
                    }
                    button.primary type="submit" { "Выпустить новый секрет" }
                }
            }
        }
    };
    Ok(page(
        "Вебхуки",
        Some(&signed),
        mode,
        Section::Webhooks,
        content,
    ))
}

/// The reason an endpoint was disabled, as its owner reads it.
fn reason_text(reason: &str) -> String {
    match reason.strip_prefix("no 2xx answer for ") {
        Some(how_long) => format!("касса не получала успешного ответа {how_long}"),
        None if reason == "disabled by the shop" => "отключена магазином".into(),
        None => reason.to_owned(),
    }
}

/// `POST /dashboard/webhooks`: the mode's endpoint set or cleared, and the types it takes
/// (owner).
pub async fn set_endpoint(State(app): State<AppState>, signed: Signed, form: Posted) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Owner)?;
    let url = form.get("url").map(|u| u.trim()).filter(|u| !u.is_empty());
    let types: Vec<String> = SHOP_EVENT_TYPES
        .iter()
        .filter(|t| form.contains_key(&format!("type:{t}")))
        .map(|t| (*t).to_owned())
        .collect();
    if types.is_empty() {
        return Err(Failure::Shown(
            StatusCode::BAD_REQUEST,
            "Выберите хотя бы один тип событий (или уберите адрес, чтобы не отправлять ничего)"
                .into(),
        ));
    }
    let shop = signed.shop(&app, mode).await?;
    let change = endpoints::Change {
        url: Some(url),
        event_types: Some(&types),
        enabled: None,
    };
    endpoints::change(&app.store, &shop, change, By::Member(&signed.member))
        .await
        .map_err(shop_failure)?;
    app.deliveries.notify_one();
    Ok(see_other(&mode.href("/dashboard/webhooks?saved=1")))
}

/// `POST /dashboard/webhooks/state`: the endpoint disabled or enabled (owner).
pub async fn set_state(State(app): State<AppState>, signed: Signed, form: Posted) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Owner)?;
    let shop = signed.shop(&app, mode).await?;
    let change = endpoints::Change {
        enabled: Some(form.get("enabled").map(String::as_str) == Some("1")),
        ..endpoints::Change::default()
    };
    endpoints::change(&app.store, &shop, change, By::Member(&signed.member))
        .await
        .map_err(shop_failure)?;
    app.deliveries.notify_one();
    Ok(see_other(&mode.href("/dashboard/webhooks?saved=1")))
}

/// `POST /dashboard/webhooks/test-event`: a `webhook.test` to the endpoint (owner).
pub async fn test_event(State(app): State<AppState>, signed: Signed, form: Posted) -> PageResult {
    let (_, mode) = signed.posted(form, Role::Owner)?;
    let shop = signed.shop(&app, mode).await?;
    let event_id = endpoints::send_test(&app.store, &shop, By::Member(&signed.member)).await?;
    app.deliveries.notify_one();
    Ok(see_other(&mode.href(&format!(
        "/dashboard/webhooks?test_event={event_id}"
    ))))
}

/// `POST /dashboard/webhooks/secret`: a new signing secret, the old one signing beside it for
/// the overlap chosen (owner). The new one is shown once, on the page it leads to.
pub async fn roll_secret(State(app): State<AppState>, signed: Signed, form: Posted) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Owner)?;
    let overlap = form
        .get("overlap")
        .and_then(|o| o.parse::<u64>().ok())
        .filter(|o| *o <= 7 * 24 * 3600)
        .ok_or_else(|| Failure::Shown(StatusCode::BAD_REQUEST, "Нет такого срока".into()))?;
    endpoints::roll_signing_secret(
        &app.store,
        &signed.member.shop_id,
        mode.livemode(),
        Duration::from_secs(overlap),
        By::Member(&signed.member),
    )
    .await
    .map_err(shop_failure)?;
    Ok(see_other(&mode.href("/dashboard/webhooks?secret_rolled=1")))
}
