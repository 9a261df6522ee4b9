//! The demo shop with the faults of `SHOP_FAULTS`, for the tests and the campaign, e.g.
//! `die_after_webhook_commit=1` or `late_webhook_answer_percent=10`:
//!
//! | fault | effect on webhooks the shop applied (committed) |
//! |---|---|
//! | `die_after_webhook_commit=N` | the first N kill the process before the `2xx` leaves |
//! | `late_webhook_answer_percent=P` | each, with probability P %, answers only after `late_webhook_answer_ms` (default 3 000): past the sender's timeout, so the answer is lost to it |

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};

use crate::fault_items;

#[derive(Debug, Default)]
struct ShopFaults {
    die_after_commit: AtomicU64,
    late_percent: u64,
    late: Duration,
}

impl ShopFaults {
    fn parse(spec: &str) -> Result<ShopFaults, String> {
        let mut faults = ShopFaults {
            late: Duration::from_millis(3_000),
            ..Default::default()
        };
        for (name, value) in fault_items(spec)? {
            match name {
                "die_after_webhook_commit" => faults.die_after_commit = AtomicU64::new(value),
                "late_webhook_answer_percent" => faults.late_percent = value,
                "late_webhook_answer_ms" => faults.late = Duration::from_millis(value),
                other => return Err(format!("unknown fault {other}")),
            }
        }
        Ok(faults)
    }
}

/// `demo-shop` with the faults of `SHOP_FAULTS`.
pub fn shop_main() -> ExitCode {
    let spec = std::env::var("SHOP_FAULTS").unwrap_or_default();
    let faults = match ShopFaults::parse(&spec) {
        Ok(faults) => Arc::new(faults),
        Err(error) => {
            eprintln!("demo-shop: SHOP_FAULTS: {error}");
            return ExitCode::from(2);
        }
    };
    if spec.is_empty() {
        return checkout_demo_shop::main();
    }
    eprintln!("FAULT INJECTION IS ON: {spec}");
    checkout_demo_shop::main_with(Some(Box::new(move |router: axum::Router| {
        router.layer(middleware::from_fn(move |request: Request, next: Next| {
            let faults = faults.clone();
            async move {
                let webhook = request.uri().path() == "/webhooks/checkout";
                let response = next.run(request).await;
                if !(webhook && response.status().is_success()) {
                    return response;
                }
                if faults
                    .die_after_commit
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    eprintln!("injected: the shop dies after committing a webhook, before its 2xx");
                    std::process::abort();
                }
                let late = faults.late_percent > 0
                    && u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 100
                        < faults.late_percent * 256;
                if late {
                    tracing::warn!(
                        "injected: the webhook's answer is held past the sender's timeout"
                    );
                    tokio::time::sleep(faults.late).await;
                }
                response
            }
        }))
    })))
}
