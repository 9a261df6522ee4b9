//! What every instance runs in the background, beside the requests: the delivery of the outbox
//! ([`delivery`]) and, with `CHECKOUT_AMQP_URL`, to a broker ([`publisher`]), the sweeper of expired keys and lapsed sessions ([`sweeper`]), and, when
//! asked, the periodic check of the books' invariants ([`verifier`]).

pub mod delivery;
pub mod publisher;
pub mod sweeper;
pub mod verifier;
