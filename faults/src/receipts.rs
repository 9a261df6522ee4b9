//! The receipts consumer with the faults of `RECEIPTS_FAULTS`, for the tests and the campaign:
//!
//! | fault | effect on messages whose receipt committed |
//! |---|---|
//! | `hold_after_commit=N` | from the N-th on, each is held unacknowledged forever after its commit (the test then SIGKILLs the process: its acks are lost) |
//! | `delay_after_commit_ms=MS` | each waits MS after its commit before its ack |

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use checkout_receipts::Seams;

use crate::fault_items;

/// `receipts` with the faults of `RECEIPTS_FAULTS`.
pub fn receipts_main() -> ExitCode {
    let spec = std::env::var("RECEIPTS_FAULTS").unwrap_or_default();
    let (mut hold_from, mut delay) = (0u64, Duration::ZERO);
    match fault_items(&spec) {
        Ok(items) => {
            for (name, value) in items {
                match name {
                    "hold_after_commit" => hold_from = value,
                    "delay_after_commit_ms" => delay = Duration::from_millis(value),
                    other => {
                        eprintln!("receipts: RECEIPTS_FAULTS: unknown fault {other}");
                        return ExitCode::from(2);
                    }
                }
            }
        }
        Err(error) => {
            eprintln!("receipts: RECEIPTS_FAULTS: {error}");
            return ExitCode::from(2);
        }
    }
    if spec.is_empty() {
        return checkout_receipts::main();
    }
    eprintln!("FAULT INJECTION IS ON: {spec}");
    let committed = Arc::new(AtomicU64::new(0));
    checkout_receipts::main_with(Seams {
        after_commit: Some(Arc::new(move |message_id: &str| {
            let n = committed.fetch_add(1, Ordering::SeqCst) + 1;
            let message_id = message_id.to_owned();
            Box::pin(async move {
                if hold_from > 0 && n >= hold_from {
                    eprintln!("FAULT: holding {message_id} unacknowledged after its commit ({n})");
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(delay).await;
            })
        })),
    })
}
