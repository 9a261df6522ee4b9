//! The server's integration tests, in one binary (the server and the test kit linked once),
//! a module per area: each starts real `checkout-server` processes over real databases.

mod api;
mod broker;
mod changes;
mod dashboard;
mod docs;
mod events;
mod floors;
mod fuzz;
mod metrics;
mod modes;
mod operations;
mod protocol;
mod shops;
mod site;
mod verify;
