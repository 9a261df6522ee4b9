//! Tabs of one intent in step. A tab opened from another starts with a copy of its
//! `sessionStorage`: the same intent, the same key. Only one tab at a time works on an intent
//! (Web Locks, one lock per key: the others wait for it), and every change of state is
//! broadcast to the other tabs of this origin (BroadcastChannel), so that all show the same
//! story. The server is still the real guard; this keeps the shopper's tabs from contradicting
//! each other.

use std::future::Future;

use futures::channel::oneshot;
use js_sys::{Function, Object, Reflect};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

/// The channel the tabs of this origin talk on about one intent (its widget's state key).
pub struct Channel(web_sys::BroadcastChannel);

impl Channel {
    /// Joins the channel; `on_state` gets every state another tab publishes. `None` where the
    /// browser has no BroadcastChannel (the tabs then simply do not hear each other).
    pub fn join(name: &str, on_state: impl Fn(String) + 'static) -> Option<Channel> {
        let channel = web_sys::BroadcastChannel::new(name).ok()?;
        let listener =
            Closure::<dyn Fn(web_sys::MessageEvent)>::new(move |event: web_sys::MessageEvent| {
                if let Some(text) = event.data().as_string() {
                    on_state(text);
                }
            });
        channel.set_onmessage(Some(listener.as_ref().unchecked_ref()));
        // Lives as long as the page.
        listener.forget();
        Some(Channel(channel))
    }

    pub fn publish(&self, state: &str) {
        let _ = self.0.post_message(&JsValue::from_str(state));
    }
}

/// Runs `work` holding the lock named `name`, shared by every tab of this origin. If another
/// tab holds it, `waiting` is called first, then this waits for it. Without Web Locks in the
/// browser, `work` simply runs.
pub async fn one_at_a_time<T>(
    name: &str,
    waiting: impl FnOnce(),
    work: impl Future<Output = T>,
) -> T {
    let Some(locks) = lock_manager() else {
        return work.await;
    };
    let held = match request(&locks, name, true).await {
        Some(held) => Some(held),
        None => {
            waiting();
            request(&locks, name, false).await
        }
    };
    let output = work.await;
    drop(held);
    output
}

/// While this lives, the lock is held; dropping it releases the lock.
struct Held(#[allow(dead_code)] oneshot::Sender<()>);

fn lock_manager() -> Option<JsValue> {
    let navigator = web_sys::window()?.navigator();
    let locks = Reflect::get(&navigator, &JsValue::from_str("locks")).ok()?;
    (!locks.is_undefined() && !locks.is_null()).then_some(locks)
}

/// `navigator.locks.request(name, {ifAvailable}, callback)`: the lock is held until the promise
/// the callback returns settles, which is when [`Held`] is dropped. `None`: not granted (only
/// with `if_available`), or the API failed.
async fn request(locks: &JsValue, name: &str, if_available: bool) -> Option<Held> {
    let (granted, was_granted) = oneshot::channel::<bool>();
    let (release, released) = oneshot::channel::<()>();
    let callback = Closure::once_into_js(move |lock: JsValue| -> JsValue {
        let got = !lock.is_null();
        let _ = granted.send(got);
        wasm_bindgen_futures::future_to_promise(async move {
            if got {
                let _ = released.await;
            }
            Ok(JsValue::UNDEFINED)
        })
        .into()
    });
    let options = Object::new();
    Reflect::set(
        &options,
        &"ifAvailable".into(),
        &JsValue::from_bool(if_available),
    )
    .ok()?;
    let request: Function = Reflect::get(locks, &"request".into())
        .ok()?
        .dyn_into()
        .ok()?;
    request
        .call3(locks, &JsValue::from_str(name), &options, &callback)
        .ok()?;
    match was_granted.await {
        Ok(true) => Some(Held(release)),
        _ => None,
    }
}
