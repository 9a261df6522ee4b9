//! The frame of every page, its content security policy, and small pieces the pages share.

use checkout_shared::format_rub;
use maud::{DOCTYPE, Markup, html};
use time::OffsetDateTime;
use time::macros::format_description;

pub const SHOP_NAME: &str = "Кофейня «Зерно»";

/// A strict policy that lets in exactly the checkout: its loader script and its payment page in
/// a frame, from the checkout's origin only. Everything else (styles, the page's own script,
/// its calls) is the shop's own; nothing inline.
pub fn content_security_policy(checkout_origin: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self' {checkout_origin}; frame-src {checkout_origin}; \
         style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'"
    )
}

pub fn layout(title: &str, section: Section, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="ru" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " — " (SHOP_NAME) }
                link rel="icon" href="data:,";
                link rel="stylesheet" href="/assets/shop.css";
            }
            body {
                header.top {
                    a.brand href="/" { "☕ " (SHOP_NAME) }
                    nav {
                        a href="/" aria-current=[(section == Section::Storefront).then_some("page")] { "Магазин" }
                        a href="/admin" aria-current=[(section == Section::BackOffice).then_some("page")] { "Бэк-офис" }
                    }
                }
                main { (content) }
                footer.bottom { "Демонстрационный магазин: деньги ненастоящие, оплата — через демо-кассу." }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Storefront,
    BackOffice,
}

pub fn error_page(message: &str) -> Markup {
    layout(
        "Ошибка",
        Section::Storefront,
        html! {
            section.panel {
                h1 { "Что-то пошло не так" }
                p.error role="alert" { (message) }
                p { a href="/" { "Вернуться в магазин" } }
            }
        },
    )
}

pub fn rub(kopecks: i64) -> String {
    format_rub(kopecks)
}

/// Moscow time, as the shop's staff read it.
pub fn when(ms: i64) -> String {
    let moscow = time::UtcOffset::from_hms(3, 0, 0).expect("UTC+3");
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .map(|t| {
            t.to_offset(moscow)
                .format(format_description!("[day].[month].[year] [hour]:[minute]"))
                .unwrap_or_default()
        })
        .unwrap_or_default()
}
