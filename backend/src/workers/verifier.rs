//! The books checked while the server runs (`CHECKOUT_VERIFY_SECS`): every invariant, as
//! `checkout-server verify` checks it, in one read-only snapshot that blocks no writer. The
//! result goes to the metrics (`checkout_invariant_violations{invariant}`, the time of the last
//! run) and, when something is broken, to the log with the ids.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::store::Store;
use crate::store::invariants::Scope;

pub fn spawn(store: Store, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.verify(Scope::Service).await {
                Ok(verified) => {
                    for checked in &verified.checked {
                        crate::metrics::invariant_checked(
                            checked.invariant.name,
                            checked.violations.len(),
                        );
                        if !checked.violations.is_empty() {
                            tracing::error!(
                                invariant = checked.invariant.name,
                                says = checked.invariant.says,
                                violations = checked.violations.len(),
                                ids = %checked.violations.iter().take(20).cloned().collect::<Vec<_>>().join(","),
                                "an invariant of the books is broken"
                            );
                        }
                    }
                    crate::metrics::verified(verified.took);
                }
                Err(error) => tracing::warn!(%error, "checking the invariants failed; will retry"),
            }
        }
    })
}
