//! Signing in to the dashboard: an invitation's link (a password set, signed in), the sign-in
//! form, «Выйти».

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use maud::html;

use super::{
    Failure, Mode, PageResult, Posted, Section, Signed, form_fields, page, see_other,
    sign_in_cookie, sign_out_cookie,
};
use crate::api::shoppers::ClientAddress;
use crate::api::state::AppState;
use crate::operations::error::OperationError;
use crate::operations::staff;

fn sign_in_form(error: Option<&str>, email: &str) -> maud::Markup {
    html! {
        section.panel.narrow {
            h1 { "Вход в кабинет" }
            @if let Some(error) = error {
                p.error role="alert" { (error) }
            }
            form.stack method="post" action="/dashboard/sign-in" {
                label for="email" { "Почта" }
                input #email type="email" name="email" autocomplete="username" required value=(email);
                label for="password" { "Пароль" }
                input #password type="password" name="password" autocomplete="current-password" required;
                button.primary type="submit" { "Войти" }
            }
            p.muted { "Войти может только тот, кого пригласили: приглашение приходит письмом." }
        }
    }
}

/// `GET /dashboard/sign-in`
pub async fn sign_in_page(signed: Option<Signed>) -> PageResult {
    if signed.is_some() {
        return Ok(see_other("/dashboard"));
    }
    Ok(page(
        "Вход",
        None,
        Mode::Test,
        Section::None,
        sign_in_form(None, ""),
    ))
}

/// `POST /dashboard/sign-in`: the cookie, and on to the overview; a wrong password is told on
/// the form again. Guesses are limited as a live shopper's are.
pub async fn sign_in(
    State(app): State<AppState>,
    ClientAddress(address): ClientAddress,
    form: Posted,
) -> PageResult {
    let form = form_fields(form)?;
    let email = form.get("email").cloned().unwrap_or_default();
    let password = form.get("password").cloned().unwrap_or_default();
    let again = |status: StatusCode, message: &str| {
        let mut response = page(
            "Вход",
            None,
            Mode::Test,
            Section::None,
            sign_in_form(Some(message), &email),
        );
        *response.status_mut() = status;
        response
    };
    let guess = match app.limits.guess(address, &email) {
        Ok(guess) => guess,
        Err(error) => {
            let Failure::Shown(status, message) = Failure::from(error);
            return Ok(again(status, &message));
        }
    };
    match staff::sign_in(&app.store, &email, &password).await {
        Ok((_, token)) => {
            app.limits.right(guess);
            let mut response = see_other("/dashboard");
            response
                .headers_mut()
                .insert(header::SET_COOKIE, sign_in_cookie(&app, &token));
            Ok(response)
        }
        Err(OperationError::InvalidCredentials) => {
            Ok(again(StatusCode::UNAUTHORIZED, "Неверная почта или пароль"))
        }
        Err(error) => Err(error.into()),
    }
}

/// `POST /dashboard/sign-out`: the sign-in ends here and on the server.
pub async fn sign_out(State(app): State<AppState>, signed: Signed, form: Posted) -> PageResult {
    signed.check(&form_fields(form)?)?;
    staff::sign_out(&app.store, &signed.token).await?;
    let mut response = see_other("/dashboard/sign-in");
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sign_out_cookie(&app));
    Ok(response)
}

fn link_gone() -> Failure {
    Failure::Shown(
        StatusCode::NOT_FOUND,
        "Ссылка приглашения уже использована или устарела: попросите владельца магазина \
         пригласить вас снова"
            .into(),
    )
}

fn invite_form(token: &str, email: &str, role: staff::Role, error: Option<&str>) -> maud::Markup {
    html! {
        section.panel.narrow {
            h1 { "Приглашение в кабинет" }
            p { "Почта: " strong { (email) } ". Роль: " (role.title()) "." }
            @if let Some(error) = error {
                p.error role="alert" { (error) }
            }
            form.stack method="post" action=(format!("/dashboard/invite/{token}")) {
                input type="hidden" name="email" autocomplete="username" value=(email);
                label for="password" { "Придумайте пароль (не короче 8 знаков)" }
                input #password type="password" name="password" autocomplete="new-password" minlength="8" required;
                label for="repeat" { "Повторите пароль" }
                input #repeat type="password" name="repeat" autocomplete="new-password" minlength="8" required;
                button.primary type="submit" { "Принять и войти" }
            }
        }
    }
}

/// `GET /dashboard/invite/{token}`: the form that sets the password.
pub async fn invite_page(State(app): State<AppState>, Path(token): Path<String>) -> PageResult {
    let (email, role) = staff::open_invite(&app.store, &token)
        .await?
        .ok_or_else(link_gone)?;
    Ok(page(
        "Приглашение",
        None,
        Mode::Test,
        Section::None,
        invite_form(&token, &email, role, None),
    ))
}

/// `POST /dashboard/invite/{token}`: the member made, signed in, on to the overview.
pub async fn accept_invite(
    State(app): State<AppState>,
    Path(token): Path<String>,
    form: Posted,
) -> PageResult {
    let form = form_fields(form)?;
    let password = form.get("password").cloned().unwrap_or_default();
    if form.get("repeat") != Some(&password) || password.chars().count() < 8 {
        let (email, role) = staff::open_invite(&app.store, &token)
            .await?
            .ok_or_else(link_gone)?;
        let message = if password.chars().count() < 8 {
            "Пароль короче 8 знаков"
        } else {
            "Пароли не совпадают"
        };
        let mut response = page(
            "Приглашение",
            None,
            Mode::Test,
            Section::None,
            invite_form(&token, &email, role, Some(message)),
        );
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return Ok(response);
    }
    let (_, sign_in) = staff::accept(&app.store, &token, &password)
        .await?
        .ok_or_else(link_gone)?;
    let mut response = see_other("/dashboard");
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sign_in_cookie(&app, &sign_in));
    Ok(response.into_response())
}
