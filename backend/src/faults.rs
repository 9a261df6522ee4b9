//! Fault injection for the end-to-end tests: lost responses, slow commits, failures before the
//! commit, duplicates that find the key in flight.
//!
//! Compiled only with the `fault-injection` feature, which the default (production) build
//! lacks; without it every hook below is an empty function. With it, faults are read once from
//! `CHECKOUT_FAULTS`, e.g. `delay_before_commit_ms=1500,drop_after_commit=1`:
//!
//! | fault | effect on first executions of keyed POSTs |
//! |---|---|
//! | `in_flight_claims=N` | the first N tries of each key answer `409 idempotency_key_in_use` |
//! | `fail_before_commit=N` | the first N roll back and answer `503` |
//! | `delay_before_commit_ms=MS` | every one holds its transaction MS longer before `COMMIT` |
//! | `delay_after_commit_ms=MS` | every one waits MS after `COMMIT` before answering |
//! | `fail_after_commit=N` | the first N commit, then answer `503` (the answer is lost) |
//! | `drop_after_commit=N` | the first N commit, then cut the connection mid-answer |
//! | `drop_after_commit_percent=P` | each commits, then with probability P % is cut so |

use axum::response::Response;

use crate::error::ApiError;

#[cfg(feature = "fault-injection")]
mod injected {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::header;
    use axum::response::{IntoResponse, Response};

    use crate::error::ApiError;
    use crate::store::StoreError;

    #[derive(Debug, Default)]
    struct Faults {
        in_flight_claims: u64,
        fail_before_commit: AtomicU64,
        delay_before_commit: Duration,
        delay_after_commit: Duration,
        fail_after_commit: AtomicU64,
        drop_after_commit: AtomicU64,
        drop_after_commit_percent: u64,
        claims_seen: Mutex<HashMap<String, u64>>,
    }

    fn faults() -> &'static Faults {
        static FAULTS: OnceLock<Faults> = OnceLock::new();
        FAULTS.get_or_init(|| {
            let spec = std::env::var("CHECKOUT_FAULTS").unwrap_or_default();
            let mut faults = Faults::default();
            for item in spec.split(',').filter(|s| !s.trim().is_empty()) {
                let (name, value) = item.split_once('=').unwrap_or((item, "1"));
                let value: u64 = value
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("CHECKOUT_FAULTS: bad number in {item}"));
                match name.trim() {
                    "in_flight_claims" => faults.in_flight_claims = value,
                    "fail_before_commit" => faults.fail_before_commit = AtomicU64::new(value),
                    "delay_before_commit_ms" => {
                        faults.delay_before_commit = Duration::from_millis(value)
                    }
                    "delay_after_commit_ms" => {
                        faults.delay_after_commit = Duration::from_millis(value)
                    }
                    "fail_after_commit" => faults.fail_after_commit = AtomicU64::new(value),
                    "drop_after_commit" => faults.drop_after_commit = AtomicU64::new(value),
                    "drop_after_commit_percent" => faults.drop_after_commit_percent = value,
                    other => panic!("CHECKOUT_FAULTS: unknown fault {other}"),
                }
            }
            if !spec.is_empty() {
                tracing::warn!(%spec, "FAULT INJECTION IS ON");
            }
            faults
        })
    }

    /// Takes one from a budget of `N` faults; `true` while any is left.
    fn take(budget: &AtomicU64) -> bool {
        budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn unavailable() -> ApiError {
        ApiError::Store(StoreError::Unavailable(sqlx::Error::Protocol(
            "injected fault".into(),
        )))
    }

    pub fn claim_finds_key_in_flight(account_id: &str, key: &str) -> bool {
        let faults = faults();
        if faults.in_flight_claims == 0 {
            return false;
        }
        let mut seen = faults.claims_seen.lock().unwrap();
        let tries = seen.entry(format!("{account_id}/{key}")).or_default();
        *tries += 1;
        *tries <= faults.in_flight_claims
    }

    pub async fn before_commit() -> Result<(), ApiError> {
        let faults = faults();
        tokio::time::sleep(faults.delay_before_commit).await;
        if take(&faults.fail_before_commit) {
            Err(unavailable())
        } else {
            Ok(())
        }
    }

    pub async fn after_commit(response: Response) -> Response {
        let faults = faults();
        tokio::time::sleep(faults.delay_after_commit).await;
        if take(&faults.fail_after_commit) {
            return unavailable().into_response();
        }
        let by_chance = faults.drop_after_commit_percent > 0
            && u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 100
                < faults.drop_after_commit_percent * 256;
        if take(&faults.drop_after_commit) || by_chance {
            // The status, the headers and a few bytes, then the connection is cut. (With no
            // bytes at all, Chromium silently resends a request that failed on a reused
            // connection, so the page would never see the loss.)
            let (mut parts, _) = response.into_parts();
            parts.headers.insert(
                header::CONTENT_LENGTH,
                header::HeaderValue::from_static("1000"),
            );
            use futures_util::StreamExt;
            let first_bytes =
                futures_util::stream::once(async { Ok(axum::body::Bytes::from_static(b"{\"pay")) });
            let cut = futures_util::stream::once(async {
                // Let hyper flush the status line, headers and first bytes before the cut.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err::<axum::body::Bytes, _>(std::io::Error::other("injected: connection dropped"))
            });
            let broken = first_bytes.chain(cut);
            return Response::from_parts(parts, Body::from_stream(broken));
        }
        response
    }
}

/// Before a claim of `key`: may pretend that another request holds the key.
#[inline]
pub fn claim_finds_key_in_flight(_account_id: &str, _key: &str) -> bool {
    #[cfg(feature = "fault-injection")]
    return injected::claim_finds_key_in_flight(_account_id, _key);
    #[cfg(not(feature = "fault-injection"))]
    false
}

/// After the response is stored, before `COMMIT`: may delay, or fail (the transaction rolls back).
#[inline]
pub async fn before_commit() -> Result<(), ApiError> {
    #[cfg(feature = "fault-injection")]
    return injected::before_commit().await;
    #[cfg(not(feature = "fault-injection"))]
    Ok(())
}

/// After `COMMIT`, before answering: may delay, or lose the answer.
#[inline]
pub async fn after_commit(response: Response) -> Response {
    #[cfg(feature = "fault-injection")]
    return injected::after_commit(response).await;
    #[cfg(not(feature = "fault-injection"))]
    response
}
