//! A live payment page's «Войти» and «Выйти». The shopper signs in in the account window
//! (`/account`, top-level on this origin, [`crate::account`]'s), never in this page, which a
//! shop frames and positions. «Войти» is a plain link to it (a new tab from a frame, this tab
//! from a full page); the account window puts the sign-in into this page's own
//! `sessionStorage` and starts it again. This page listens to no one: nothing a shop's page
//! (or any other window) sends can sign it in as somebody else.

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::{api, storage};

/// Where «Войти» leads: as a full page, the account page in this tab, back here after; in a
/// frame, the account window in a tab of its own (`rel="opener"`: it answers this page).
pub fn link(full_page: bool) -> (String, &'static str) {
    if !full_page {
        return ("/account".into(), "checkout-account");
    }
    let here = web_sys::window()
        .and_then(|w| w.location().pathname().ok())
        .unwrap_or_default();
    let url = format!("/account?return={}", js_sys::encode_uri_component(&here));
    (url, "_self")
}

/// «Выйти» (the page's `.sign-out` button; one listener of the document's, not a component's:
/// fewer bytes for every shopper to download).
pub fn offer_sign_out(token: Option<String>) {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    let on_click = Closure::<dyn Fn(web_sys::Event)>::new(move |event: web_sys::Event| {
        let on_button = event
            .target()
            .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
            .is_some_and(|e| e.class_list().contains("sign-out"));
        if on_button {
            wasm_bindgen_futures::spawn_local(sign_out(token.clone()));
        }
    });
    let _ = document.add_event_listener_with_callback("click", on_click.as_ref().unchecked_ref());
    on_click.forget();
}

/// The sign-in ends on the server, is forgotten here, and the page starts again.
async fn sign_out(token: Option<String>) {
    if let Some(token) = token {
        api::sign_out(&token).await;
    }
    storage::remove(storage::LIVE);
    if let Some(window) = web_sys::window() {
        let _ = window.location().reload();
    }
}
