//! The shop's team in the dashboard: its members and their roles, invitations by e-mail, and
//! the audit log of who did what.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use maud::html;

use super::{Failure, Mode, PageResult, Posted, Section, Signed, hidden, page, see_other, when};
use crate::api::shoppers::ClientAddress;
use crate::api::state::AppState;
use crate::clock;
use crate::operations::staff::{self, Invitation, Inviter, Role};

const AUDIT_ROWS: i64 = 200;

/// `GET /dashboard/staff`: the members, the open invitations, and (for an owner) the forms.
pub async fn members(
    State(app): State<AppState>,
    signed: Signed,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let members = app.store.members_of_shop(&signed.member.shop_id).await?;
    let invites = app
        .store
        .open_invites_of_shop(&signed.member.shop_id, clock::now_ms())
        .await?;
    let owner = signed.member.role == Role::Owner;
    let content = html! {
        section.panel {
            h1 { "Команда" }
            @if let Some(email) = query.get("invited") {
                p.notice role="status" { "Приглашение отправлено на " (email) }
            }
            div.scroll tabindex="0" role="region" aria-label="Участники" {
                table {
                    thead { tr { th { "Почта" } th { "Роль" } th { "С нами с" } @if owner { th { "Изменить" } } } }
                    tbody { @for m in &members { tr {
                        td { (m.email) }
                        td { (Role::parse(&m.role).map_or("?", Role::title)) }
                        td { (when(m.created_at)) }
                        @if owner {
                            td {
                                @if m.staff_id != signed.member.staff_id {
                                    form.inline method="post" action=(format!("/dashboard/staff/{}", m.staff_id)) {
                                        (hidden(&signed, mode))
                                        label.visually-hidden for=(format!("role-{}", m.staff_id)) { "Роль для " (m.email) }
                                        select id=(format!("role-{}", m.staff_id)) name="role" {
                                            @for role in [Role::Owner, Role::Staff, Role::Viewer] {
                                                option value=(role.as_str()) selected[m.role == role.as_str()] { (role.title()) }
                                            }
                                            option value="remove" { "убрать из команды" }
                                        }
                                        button.secondary type="submit" { "Сохранить" }
                                    }
                                } @else { span.muted { "это вы" } }
                            }
                        }
                    } } }
                }
            }
            @if !invites.is_empty() {
                h2 { "Ждут ответа" }
                ul { @for (email, role, until) in &invites {
                    li { (email) " — " (Role::parse(role).map_or("?", Role::title)) ", до " (when(*until)) }
                } }
            }
        }
        @if owner {
            section.panel {
                h2 { "Пригласить" }
                form.stack method="post" action="/dashboard/staff/invitations" {
                    (hidden(&signed, mode))
                    label for="email" { "Почта" }
                    input #email type="email" name="email" required;
                    label for="role" { "Роль" }
                    select #role name="role" {
                        option value="viewer" { "наблюдатель — только смотрит" }
                        option value="staff" selected { "сотрудник — возвраты и повторы событий" }
                        option value="owner" { "владелец — ещё вебхуки, секреты и команда" }
                    }
                    button.primary type="submit" { "Отправить приглашение" }
                }
            }
        }
        section.panel {
            p { a href=(mode.href("/dashboard/audit")) { "Журнал действий →" } }
        }
    };
    Ok(page(
        "Команда",
        Some(&signed),
        mode,
        Section::Staff,
        content,
    ))
}

/// `POST /dashboard/staff/invitations` (owner): the invitation mailed (as many to one address,
/// and from one client, as a live shopper's codes: no mailbox is flooded from here).
pub async fn invite(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    signed: Signed,
    form: Posted,
) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Owner)?;
    let bad = |what: &str| Failure::Shown(StatusCode::BAD_REQUEST, what.to_owned());
    let role = form
        .get("role")
        .and_then(|r| Role::parse(r))
        .ok_or_else(|| bad("Нет такой роли"))?;
    let email = form.get("email").cloned().unwrap_or_default();
    let email = crate::operations::shoppers::normalize_email(&email)
        .map_err(|_| bad("Почта должна быть вида name@example.ru"))?;
    app.limits.mail(address, &email)?;
    let invitation = Invitation {
        shop_id: &signed.member.shop_id,
        shop_name: &signed.member.shop_name,
        email: &email,
        role,
    };
    staff::invite(
        &app.store,
        app.mailer.as_deref(),
        &app.public_origin,
        &invitation,
        Inviter::Member(&signed.member),
    )
    .await?;
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("invited", &email)
        .finish();
    Ok(see_other(&mode.href(&format!("/dashboard/staff?{query}"))))
}

/// `POST /dashboard/staff/{id}` (owner): another role, or out of the team.
pub async fn change(
    State(app): State<AppState>,
    signed: Signed,
    Path(staff_id): Path<String>,
    form: Posted,
) -> PageResult {
    let (form, mode) = signed.posted(form, Role::Owner)?;
    let role = match form.get("role").map(String::as_str) {
        Some("remove") => None,
        Some(role) => Some(
            Role::parse(role)
                .ok_or_else(|| Failure::Shown(StatusCode::BAD_REQUEST, "Нет такой роли".into()))?,
        ),
        None => {
            return Err(Failure::Shown(
                StatusCode::BAD_REQUEST,
                "Нет такой роли".into(),
            ));
        }
    };
    staff::change_member(&app.store, &signed.member, &staff_id, role).await?;
    Ok(see_other(&mode.href("/dashboard/staff")))
}

fn action_name(action: &str) -> &str {
    match action {
        "staff.invited" => "пригласил(а)",
        "invite.accepted" => "принял(а) приглашение",
        "signed_in" => "вошёл(ла)",
        "staff.role_changed" => "сменил(а) роль",
        "staff.removed" => "убрал(а) из команды",
        "refund.created" => "вернул(а) деньги",
        "event.redelivered" => "отправил(а) событие снова",
        "events.recovered" => "отправил(а) снова пропущенное",
        "endpoint.set" => "сменил(а) конечную точку",
        "signing_secret.rolled" => "выпустил(а) новый секрет подписи",
        "endpoint.disabled" => "отключил(а) конечную точку",
        "endpoint.enabled" => "включил(а) конечную точку",
        "endpoint.tested" => "отправил(а) тестовое событие",
        other => other,
    }
}

/// `GET /dashboard/audit`: who did what, newest first.
pub async fn audit(
    State(app): State<AppState>,
    signed: Signed,
    Query(query): Query<HashMap<String, String>>,
) -> PageResult {
    let mode = Mode::of(&query);
    let lines = app
        .store
        .audit_of_shop(&signed.member.shop_id, AUDIT_ROWS)
        .await?;
    let content = html! {
        section.panel {
            h1 { "Журнал действий" }
            div.scroll tabindex="0" role="region" aria-label="Журнал действий" {
                table {
                    thead { tr { th { "Когда" } th { "Кто" } th { "Что" } th { "С чем" } } }
                    tbody { @for l in &lines { tr data-action=(l.action) {
                        td { (when(l.at)) } td { (l.email) } td { (action_name(&l.action)) } td.mono { (l.subject) }
                    } } }
                }
            }
        }
    };
    Ok(page("Журнал", Some(&signed), mode, Section::Staff, content))
}
