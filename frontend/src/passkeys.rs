//! Passkeys in the account window, by the browser's own WebAuthn JSON forms
//! (`PublicKeyCredential.parse…OptionsFromJSON`, `credential.toJSON()`): the server's options go
//! to the authenticator as they came, and its answer goes back as it came. Only the account
//! window uses them: it is top-level on the checkout's origin, the passkeys' relying party.

use checkout_shared::ShopperToken;
use js_sys::{Function, Object, Promise, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::{api, json, messages};

fn get(target: &JsValue, name: &str) -> Option<JsValue> {
    Reflect::get(target, &name.into())
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

/// Calls `target.name(argument)`.
fn call(target: &JsValue, name: &str, argument: &JsValue) -> Option<JsValue> {
    get(target, name)?
        .dyn_into::<Function>()
        .ok()?
        .call1(target, argument)
        .ok()
}

fn public_key_credential() -> Option<JsValue> {
    get(&web_sys::window()?.into(), "PublicKeyCredential")
}

/// Whether this browser has passkeys with the JSON forms (Chromium 129+, Firefox 119+, Safari 18+).
pub fn supported() -> bool {
    public_key_credential()
        .is_some_and(|class| get(&class, "parseCreationOptionsFromJSON").is_some())
}

/// Makes a passkey for the signed-in shopper (`token`) on this device.
pub async fn register(token: &str) -> Result<(), String> {
    let start = start("/api/shoppers/passkeys/registration", Some(token)).await?;
    let credential = ceremony(&start, "parseCreationOptionsFromJSON", "create").await?;
    finish("/api/shoppers/passkeys", Some(token), &start, &credential).await?;
    Ok(())
}

/// Signs in with a passkey the browser offers (discoverable: no e-mail typed).
pub async fn sign_in() -> Result<ShopperToken, String> {
    let start = start("/api/shoppers/passkeys/authentication", None).await?;
    let credential = ceremony(&start, "parseRequestOptionsFromJSON", "get").await?;
    let text = finish("/api/shoppers/passkeys/sign-in", None, &start, &credential).await?;
    json::from_str(&text).ok_or_else(|| messages::ACCOUNT_UNREADABLE.to_owned())
}

/// The server's challenge: `{ceremony_id, options: {publicKey: …}}`.
async fn start(path: &str, token: Option<&str>) -> Result<JsValue, String> {
    let text = api::said(api::post_json(path, token, "{}".into()).await)?;
    json::parse(&text).ok_or_else(|| messages::ACCOUNT_UNREADABLE.to_owned())
}

/// The authenticator's part: `navigator.credentials[method]({publicKey})`, as JSON.
async fn ceremony(start: &JsValue, parse: &str, method: &str) -> Result<JsValue, String> {
    let unreadable = || messages::ACCOUNT_UNREADABLE.to_owned();
    let options = get(start, "options")
        .and_then(|o| get(&o, "publicKey"))
        .ok_or_else(unreadable)?;
    let public_key = call(
        &public_key_credential().ok_or_else(unreadable)?,
        parse,
        &options,
    )
    .ok_or_else(unreadable)?;
    let request = Object::new();
    let _ = Reflect::set(&request, &"publicKey".into(), &public_key);
    let credentials = web_sys::window()
        .and_then(|w| get(&w.navigator().into(), "credentials"))
        .ok_or_else(unreadable)?;
    let promise: Promise = call(&credentials, method, &request)
        .and_then(|p| p.dyn_into().ok())
        .ok_or_else(unreadable)?;
    let credential = JsFuture::from(promise)
        .await
        .map_err(|_| messages::PASSKEY_CANCELLED.to_owned())?;
    let to_json = get(&credential, "toJSON")
        .and_then(|f| f.dyn_into::<Function>().ok())
        .ok_or_else(unreadable)?;
    to_json.call0(&credential).map_err(|_| unreadable())
}

/// Sends the authenticator's answer with the ceremony it belongs to; the server's `2xx` body.
async fn finish(
    path: &str,
    token: Option<&str>,
    start: &JsValue,
    credential: &JsValue,
) -> Result<String, String> {
    let body = Object::new();
    let _ = Reflect::set(
        &body,
        &"ceremony_id".into(),
        &get(start, "ceremony_id").unwrap_or_default(),
    );
    let _ = Reflect::set(&body, &"credential".into(), credential);
    let text = js_sys::JSON::stringify(&body)
        .ok()
        .and_then(|t| t.as_string())
        .ok_or_else(|| messages::ACCOUNT_UNREADABLE.to_owned())?;
    api::said(api::post_json(path, token, text).await)
}
