//! What the tests start and speak to, one module per concept: the test's database and its
//! invariants ([`database`]: `TestDb`, and the macros that run a scenario on each database), a
//! real `checkout-server` process and a shop as the operator adds it ([`server`]), the API
//! client and its answers ([`api`]), a real `demo-shop` process ([`demo_shop`]), bounded waits
//! ([`waiting`]) and pages of another site ([`pages`]); then the engines a test starts as real
//! processes: PostgreSQL clusters, PgBouncer, Patroni with etcd and HAProxy, RabbitMQ, an SMTP
//! receiver, a webhook receiver, Chromium, a slow link. Everything of the first group is
//! re-exported at the root, so a test says `checkout_testkit::TestDb`.

pub mod api;
pub mod chromium;
pub mod dashboard;
pub mod database;
pub mod demo_shop;
pub mod mail;
pub mod pages;
pub mod patroni;
pub mod pgbouncer;
pub mod postgres;
pub mod rabbitmq;
pub mod receipts;
pub mod receiver;
pub mod server;
pub mod slow_link;
pub mod waiting;

pub use api::*;
pub use checkout_backend::store::invariants::{Scope, Verified};
pub use database::*;
pub use demo_shop::*;
pub use pages::*;
pub use server::*;
pub(crate) use server::{Listening, listening};
pub use waiting::*;
