//! What the benchmark's server adds to `checkout-server` (the un-keyed baseline route), and
//! what the benchmark's binaries share: BENCHMARKS.md's sections from runs of their own.

pub mod kept;
pub mod unkeyed;
