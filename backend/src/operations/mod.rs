//! The checkout's operations, above the store and below HTTP: who is asking ([`authentication`]),
//! shops, what a shop asks to be paid ([`sessions`]), a shopper paying it ([`payments`]), the
//! shop refunding ([`refunds`]), the events each writes in its own transaction ([`events`]),
//! test and live shoppers ([`shoppers`]), live money deposited by the operator ([`deposits`]),
//! and demo mode's shop ([`demo`]). Each keyed operation is an
//! `checkout_idempotency::Operation`: its guarded change and the answer it stores
//! ([`answers`]), run by the protocol in one transaction. Nothing here knows HTTP.

pub mod answers;
pub mod authentication;
pub mod demo;
pub mod deposits;
pub mod email_codes;
pub mod endpoints;
pub mod error;
pub mod events;
pub mod passkeys;
pub mod passwords;
pub mod payments;
pub mod refunds;
pub mod sessions;
pub mod shoppers;
pub mod shops;
pub mod staff;
pub mod urls;
