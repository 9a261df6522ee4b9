//! The background task that deletes expired idempotency keys. Ledger, payments and refunds
//! are never swept.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::clock;
use crate::store::Store;

pub fn spawn(store: Store, key_ttl: Duration, every: Duration) -> JoinHandle<()> {
    let ttl_ms = i64::try_from(key_ttl.as_millis()).unwrap_or(i64::MAX);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store
                .sweep_expired_keys(clock::now_ms().saturating_sub(ttl_ms))
                .await
            {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "swept expired idempotency keys"),
                Err(error) => tracing::warn!(%error, "sweeping expired keys failed; will retry"),
            }
        }
    })
}
