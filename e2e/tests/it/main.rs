//! The browser scenarios, in one binary: headless Chromium through chromedriver against real
//! servers, a module per area; `browser` is what they share.

#[macro_use]
mod browser;
mod checkout;
mod dashboard;
mod embed;
mod inbox;
mod intents;
mod shop;
mod staff_sign_in;
