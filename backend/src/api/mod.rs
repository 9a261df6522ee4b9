//! The HTTP API, the top floor: the router and what surrounds every request ([`router`]), what
//! every handler can reach ([`state`]), what handlers take from a request ([`extract`]), keyed
//! requests as HTTP answers ([`keyed_requests`]), errors as problems ([`problem`]), the OpenAPI document
//! ([`openapi`]), `/metrics` on its own address ([`metrics`]), and the thin handlers, one module
//! per resource: [`sessions`], [`payments`], [`refunds`], [`idempotency_keys`], [`events`], [`accounts`],
//! [`shoppers`] (test shoppers; live shoppers' sign-up, sign-in, sign-out), [`demo`]; abuse
//! limits ([`limits`]); the checkout's own pages and the widget's files ([`site`]), from the built widget
//! as the server holds it ([`assets`]).

pub mod accounts;
pub mod assets;
pub mod dashboard;
pub mod demo;
pub mod endpoints;
pub mod events;
pub mod extract;
pub mod health;
pub mod idempotency_keys;
pub mod keyed_requests;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod passkeys;
pub mod payments;
pub mod problem;
pub mod refunds;
pub mod router;
pub mod sessions;
pub mod shoppers;
pub mod site;
pub mod state;

pub use router::{api_routes, router};
pub use state::AppState;
