//! The receipts consumer's tests, in one binary: a batch through the protocol on each database
//! (`batch`), and the shipped binary on a real RabbitMQ node (`consume`).

mod batch;
mod consume;
