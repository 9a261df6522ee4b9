//! Bounded waits for what another process does: never a sleep standing in for it.

use std::time::Duration;

/// Polls `condition` every 20 ms until it holds, and fails with `what` once `within` has
/// passed: a bounded wait for something another process does, never a sleep standing in for it.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !condition().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
