//! The payment page in a shop's frame: it tells its parent (the shop's page, through the
//! loader) that it is ready, how tall it is, and how the purchase ended, by `postMessage` to
//! that one origin, and only if the checkout vouched for it (`<meta name="checkout-parent">`,
//! written by the server only for an origin the session's shop registered). It takes no message
//! from anyone: nothing a page sends can change what happens here.

use js_sys::{Object, Reflect};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

/// Whether this page is inside a frame.
pub fn is_framed() -> bool {
    let Some(window) = web_sys::window() else {
        return false;
    };
    match (window.parent(), window.self_()) {
        (Ok(Some(parent)), me) => !Object::is(&parent, &me),
        _ => false,
    }
}

/// The origin of the page that framed this one, if the checkout vouched for it.
pub fn parent_origin() -> Option<String> {
    if !is_framed() {
        return None;
    }
    let document = web_sys::window()?.document()?;
    let meta = document
        .query_selector("meta[name=\"checkout-parent\"]")
        .ok()??;
    meta.get_attribute("content").filter(|o| !o.is_empty())
}

/// Posts `{type, …fields}` to the parent, to `origin` only.
pub fn post(origin: &str, kind: &str, fields: &[(&str, JsValue)]) {
    let Some(parent) = web_sys::window().and_then(|w| w.parent().ok().flatten()) else {
        return;
    };
    let message = Object::new();
    let _ = Reflect::set(&message, &"type".into(), &kind.into());
    for (name, value) in fields {
        let _ = Reflect::set(&message, &(*name).into(), value);
    }
    let _ = parent.post_message(&message, origin);
}

/// Tells the parent the page's height whenever it changes, so that the frame is as tall as
/// its content (no inner scroll bar).
pub fn follow_height(origin: String) {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    let Some(root) = document.document_element() else {
        return;
    };
    let watched = root.clone();
    let last = std::cell::Cell::new(0);
    let on_resize = Closure::<dyn Fn()>::new(move || {
        let height = watched.scroll_height();
        if height != last.get() {
            last.set(height);
            post(
                &origin,
                "checkout:resize",
                &[("height", JsValue::from(height))],
            );
        }
    });
    if let Ok(observer) = web_sys::ResizeObserver::new(on_resize.as_ref().unchecked_ref()) {
        observer.observe(&root);
        if let Some(body) = document.body() {
            observer.observe(&body);
        }
    }
    // Lives as long as the page.
    on_resize.forget();
}

/// A plain object of these fields, made by hand: what the page hears is exactly this.
pub fn object(fields: &[(&str, JsValue)]) -> JsValue {
    let object = Object::new();
    for (name, value) in fields {
        let _ = Reflect::set(&object, &(*name).into(), value);
    }
    object.into()
}
