//! What every instance runs in the background, beside the requests: the delivery of the outbox
//! ([`delivery`]) and the sweeper of expired keys and lapsed sessions ([`sweeper`]).

pub mod delivery;
pub mod sweeper;
