//! What the benchmark's server adds to `checkout-server`: the un-keyed baseline route.

pub mod unkeyed;
