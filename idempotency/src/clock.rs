//! Time as the protocol reads it: the wall clock in the server, a clock a scheduler moves in the
//! model checker.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where the protocol reads the time (a key's age) and waits (a copy for its original).
pub trait Clock: Send + Sync + 'static {
    /// Unix milliseconds, as keys store time.
    fn now_ms(&self) -> i64;

    /// Resolves once `duration` has passed.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The wall clock and tokio's timers.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Unix milliseconds, as keys store time.
pub fn now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}
