//! The background task that deletes expired idempotency keys, live shoppers' sign-ins that
//! ended and e-mail codes that expired, in small batches, and closes checkout sessions that lapsed unpaid (telling their
//! shops). Ledger, payments and refunds are
//! never swept.

use std::sync::Arc;
use std::time::Duration;

use checkout_idempotency::now_ms;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::operations::authentication::SignInLimits;
use crate::store::{Store, StoreError};

/// Keys deleted per transaction: each batch holds SQLite's one writer only briefly, so that
/// payments are never stuck behind a large backlog.
pub const BATCH: i64 = 500;

/// Starts the sweeper; `deliveries` is woken when a lapsed session's event was written.
pub fn spawn(
    store: Store,
    key_ttl: Duration,
    every: Duration,
    sign_ins: SignInLimits,
    deliveries: Arc<Notify>,
) -> JoinHandle<()> {
    let ttl_ms = i64::try_from(key_ttl.as_millis()).unwrap_or(i64::MAX);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match sweep(&store, now_ms().saturating_sub(ttl_ms)).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "swept expired idempotency keys"),
                Err(error) => tracing::warn!(%error, "sweeping expired keys failed; will retry"),
            }
            match sweep_sign_ins(&store, sign_ins).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "swept ended sign-ins"),
                Err(error) => tracing::warn!(%error, "sweeping sign-ins failed; will retry"),
            }
            // E-mail codes, passkey ceremonies and retired keys are few: one statement each.
            match store.sweep_ended_overlaps(now_ms()).await {
                Ok(0) => {}
                Ok(swept) => {
                    tracing::info!(swept, "forgot old keys and secrets whose overlap ended")
                }
                Err(error) => tracing::warn!(%error, "sweeping ended overlaps failed; will retry"),
            }
            match store.sweep_expired_codes(now_ms()).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "swept expired e-mail codes"),
                Err(error) => tracing::warn!(%error, "sweeping e-mail codes failed; will retry"),
            }
            match store.sweep_expired_ceremonies(now_ms()).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "swept unfinished passkey ceremonies"),
                Err(error) => {
                    tracing::warn!(%error, "sweeping passkey ceremonies failed; will retry")
                }
            }
            match expire_sessions(&store).await {
                Ok(0) => {}
                Ok(expired) => {
                    tracing::info!(expired, "checkout sessions lapsed unpaid");
                    deliveries.notify_one();
                }
                Err(error) => tracing::warn!(%error, "expiring sessions failed; will retry"),
            }
        }
    })
}

/// Deletes every sign-in that ended (revoked, too old, or unused too long), one batch per
/// transaction; returns how many.
pub async fn sweep_sign_ins(store: &Store, limits: SignInLimits) -> Result<u64, StoreError> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let now = now_ms();
    let (created_before, used_before) = (
        now.saturating_sub(ms(limits.absolute)),
        now.saturating_sub(ms(limits.idle)),
    );
    let mut total = 0;
    loop {
        let deleted = store
            .sweep_ended_sign_ins(created_before, used_before, BATCH)
            .await?;
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Closes every session that lapsed unpaid, one batch per transaction; returns how many.
pub async fn expire_sessions(store: &Store) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let expired = crate::operations::events::expire_sessions(store, now_ms(), BATCH).await?;
        total += expired;
        if expired < BATCH as usize {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Deletes every key created before `created_before_ms`, one batch per transaction, yielding
/// between batches; returns how many.
pub async fn sweep(store: &Store, created_before_ms: i64) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = store.sweep_expired_keys(created_before_ms, BATCH).await?;
        crate::metrics::keys_swept(deleted);
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}
