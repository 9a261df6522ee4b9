//! Fault injection for the end-to-end tests and the crash campaign: lost answers, slow commits,
//! failures before the commit, duplicates that find the key in flight.
//!
//! It is `checkout-server` itself ([`checkout_backend::cli::main_with`]) given protocol hooks
//! and a wrapper around its handlers, read once from `CHECKOUT_FAULTS`, e.g.
//! `delay_before_commit_ms=1500,drop_after_commit=1`:
//!
//! | fault | effect on first executions of keyed POSTs |
//! |---|---|
//! | `in_flight_claims=N` | the first N tries of each key answer `409 idempotency_key_in_use` |
//! | `fail_before_commit=N` | the first N roll back and answer `503` |
//! | `fail_before_commit_per_key=N` | the first N tries of each key roll back and answer `503` |
//! | `delay_before_commit_ms=MS` | every one holds its transaction MS longer before `COMMIT` |
//! | `delay_after_commit_ms=MS` | every one waits MS after `COMMIT` before answering |
//! | `fail_after_commit=N` | the first N commit, then answer `503` (the answer is lost) |
//! | `drop_after_commit=N` | the first N commit, then cut the connection mid-answer |
//! | `drop_after_commit_percent=P` | each commits, then with probability P % is cut so |
//! | `html_after_commit=N` | the first N payments commit, then answer `200` with a proxy's HTML page |
//! | `delay_account_ms=MS` | (not keyed) `GET /api/account` answers MS late |
//! | `sqlite_commit_io_error_at=N` | (SQLite) the N-th keyed request commits, then its COMMIT reports an I/O error |
//! | `sqlite_writer_dies_at=N` | (SQLite) the N-th keyed request commits, then the writer thread dies before answering |
//! | `crash_after_broker_confirm=N` | (`CHECKOUT_AMQP_URL`) the process aborts once the broker confirmed its N-th batch of events, before they are marked published |

mod receipts;
mod shop;

pub use receipts::receipts_main;
pub use shop::shop_main;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use checkout_backend::Seams;
use checkout_backend::api::keyed_requests::KeyOutcome;
use checkout_idempotency::{Aborted, HookFuture, Hooks};
use futures_util::StreamExt;

/// `checkout-server` with the faults of `CHECKOUT_FAULTS`.
pub fn main() -> ExitCode {
    let spec = std::env::var("CHECKOUT_FAULTS").unwrap_or_default();
    let faults = match Faults::parse(&spec) {
        Ok(faults) => Arc::new(faults),
        Err(error) => {
            eprintln!("checkout-server: CHECKOUT_FAULTS: {error}");
            return ExitCode::from(2);
        }
    };
    if !spec.is_empty() {
        eprintln!("FAULT INJECTION IS ON: {spec}");
    }
    let after_commit = faults.clone();
    let confirmed = faults.clone();
    let sqlite = faults.clone();
    checkout_backend::cli::main_with(Seams {
        after_broker_confirm: Some(Arc::new(move || confirmed.after_broker_confirm())),
        after_sqlite_commit: checkout_backend::store::AfterSqliteCommit(Some(Arc::new(
            move || sqlite.after_sqlite_commit(),
        ))),
        hooks: Some(faults),
        routes: None,
        wrap: Some(Box::new(move |router: Router| {
            router.layer(middleware::from_fn(move |request: Request, next: Next| {
                let faults = after_commit.clone();
                async move {
                    let account = request.uri().path() == "/api/account";
                    let payment = request.uri().path() == "/api/payments";
                    let response = next.run(request).await;
                    if account {
                        tokio::time::sleep(faults.delay_account).await;
                    }
                    faults.after_commit(response, payment).await
                }
            }))
        })),
    })
}

#[derive(Debug, Default)]
pub struct Faults {
    in_flight_claims: u64,
    fail_before_commit: AtomicU64,
    fail_before_commit_per_key: u64,
    commits_tried: Mutex<HashMap<String, u64>>,
    delay_before_commit: Duration,
    delay_after_commit: Duration,
    fail_after_commit: AtomicU64,
    drop_after_commit: AtomicU64,
    drop_after_commit_percent: u64,
    html_after_commit: AtomicU64,
    delay_account: Duration,
    claims_seen: Mutex<HashMap<String, u64>>,
    crash_after_broker_confirm: AtomicU64,
    sqlite_commit_io_error_at: u64,
    sqlite_writer_dies_at: u64,
    /// Keyed requests that reached their COMMIT so far.
    keyed_commits: AtomicU64,
    /// What the SQLite writer's next COMMIT suffers (armed by a keyed request's before-commit
    /// hook, which runs on the writer thread in that very batch): 1 an I/O error, 2 death.
    sqlite_commit_armed: std::sync::atomic::AtomicU8,
}

/// `name=N,name=N,…` (a bare `name` is `name=1`), as `(name, N)` pairs.
pub(crate) fn fault_items(spec: &str) -> Result<Vec<(&str, u64)>, String> {
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let (name, value) = item.split_once('=').unwrap_or((item, "1"));
            let value = value
                .trim()
                .parse()
                .map_err(|_| format!("bad number in {item}"))?;
            Ok((name.trim(), value))
        })
        .collect()
}

impl Faults {
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut faults = Faults::default();
        for (name, value) in fault_items(spec)? {
            match name {
                "in_flight_claims" => faults.in_flight_claims = value,
                "fail_before_commit" => faults.fail_before_commit = AtomicU64::new(value),
                "fail_before_commit_per_key" => faults.fail_before_commit_per_key = value,
                "delay_before_commit_ms" => {
                    faults.delay_before_commit = Duration::from_millis(value)
                }
                "delay_after_commit_ms" => faults.delay_after_commit = Duration::from_millis(value),
                "fail_after_commit" => faults.fail_after_commit = AtomicU64::new(value),
                "drop_after_commit" => faults.drop_after_commit = AtomicU64::new(value),
                "drop_after_commit_percent" => faults.drop_after_commit_percent = value,
                "html_after_commit" => faults.html_after_commit = AtomicU64::new(value),
                "delay_account_ms" => faults.delay_account = Duration::from_millis(value),
                "crash_after_broker_confirm" => {
                    faults.crash_after_broker_confirm = AtomicU64::new(value)
                }
                "sqlite_commit_io_error_at" => faults.sqlite_commit_io_error_at = value,
                "sqlite_writer_dies_at" => faults.sqlite_writer_dies_at = value,
                other => return Err(format!("unknown fault {other}")),
            }
        }
        Ok(faults)
    }

    /// The SQLite writer's COMMIT went through: report an I/O error instead, or die, if armed.
    fn after_sqlite_commit(&self) -> Result<(), String> {
        match self.sqlite_commit_armed.swap(0, Ordering::SeqCst) {
            1 => {
                eprintln!("FAULT: the COMMIT went through; reporting an I/O error instead");
                Err("injected: disk I/O error at COMMIT".into())
            }
            2 => {
                eprintln!("FAULT: the SQLite writer dies after its COMMIT, before answering");
                panic!("injected: the SQLite writer dies after COMMIT");
            }
            _ => Ok(()),
        }
    }

    /// After `COMMIT`, before the answer leaves: may delay it, replace it with `503`, or cut
    /// the connection mid-answer. Only first executions: a replay is never lost.
    /// The N-th confirmed batch: the process dies before marking it (as if SIGKILLed there).
    fn after_broker_confirm(&self) {
        let left = self.crash_after_broker_confirm.load(Ordering::SeqCst);
        if left == 0 {
            return;
        }
        if self
            .crash_after_broker_confirm
            .fetch_sub(1, Ordering::SeqCst)
            == 1
        {
            eprintln!("FAULT: crashing after the broker's confirm, before marking the events");
            std::process::abort();
        }
    }

    async fn after_commit(&self, response: Response, payment: bool) -> Response {
        if response.extensions().get::<KeyOutcome>() != Some(&KeyOutcome::First) {
            return response;
        }
        tokio::time::sleep(self.delay_after_commit).await;
        if take(&self.fail_after_commit) {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "injected: answer lost after commit",
            )
                .into_response();
        }
        if payment && take(&self.html_after_commit) {
            // What a misconfigured proxy or a captive portal sends: a success nobody can read.
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body><h1>502 Bad Gateway</h1></body></html>",
            )
                .into_response();
        }
        let by_chance = self.drop_after_commit_percent > 0
            && u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 100
                < self.drop_after_commit_percent * 256;
        if take(&self.drop_after_commit) || by_chance {
            return cut_mid_answer(response);
        }
        response
    }
}

impl Hooks for Faults {
    fn key_in_flight(&self, scope: &str, key: &str) -> bool {
        if self.in_flight_claims == 0 {
            return false;
        }
        let mut seen = self.claims_seen.lock().unwrap_or_else(|e| e.into_inner());
        let tries = seen.entry(format!("{scope}/{key}")).or_default();
        *tries += 1;
        *tries <= self.in_flight_claims
    }

    /// A request settled at once has no moment before its commit: while a fault is to strike
    /// there, every request takes the steps; otherwise they go as the shipped server's do.
    fn steps_only(&self) -> bool {
        self.fail_before_commit.load(Ordering::SeqCst) > 0
            || self.fail_before_commit_per_key > 0
            || !self.delay_before_commit.is_zero()
            || self.sqlite_commit_io_error_at > 0
            || self.sqlite_writer_dies_at > 0
    }

    fn before_commit(&self, scope: &str, key: &str) -> HookFuture {
        let delay = self.delay_before_commit;
        let fail = take(&self.fail_before_commit) || self.fails_this_try(scope, key);
        if !fail {
            let nth = self.keyed_commits.fetch_add(1, Ordering::SeqCst) + 1;
            if nth == self.sqlite_commit_io_error_at {
                self.sqlite_commit_armed.store(1, Ordering::SeqCst);
            } else if nth == self.sqlite_writer_dies_at {
                self.sqlite_commit_armed.store(2, Ordering::SeqCst);
            }
        }
        Box::pin(async move {
            if !delay.is_zero() {
                // A sign for tests that a request is inside its transaction.
                tracing::warn!("injected: holding the transaction open {delay:?} before COMMIT");
            }
            tokio::time::sleep(delay).await;
            if fail { Err(Aborted) } else { Ok(()) }
        })
    }
}

impl Faults {
    /// Counts a commit of (scope, key): `true` for its first `fail_before_commit_per_key`.
    fn fails_this_try(&self, scope: &str, key: &str) -> bool {
        if self.fail_before_commit_per_key == 0 {
            return false;
        }
        let mut tried = self.commits_tried.lock().unwrap_or_else(|e| e.into_inner());
        let tries = tried.entry(format!("{scope}/{key}")).or_default();
        *tries += 1;
        *tries <= self.fail_before_commit_per_key
    }
}

/// Takes one from a budget of `N` faults; `true` while any is left.
fn take(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// The status, the headers and a few bytes, then the connection is cut. (With no bytes at all,
/// Chromium silently resends a request that failed on a reused connection, so the page would
/// never see the loss.)
fn cut_mid_answer(response: Response) -> Response {
    let (mut parts, _) = response.into_parts();
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1000"));
    let first_bytes = futures_util::stream::once(async { Ok(Bytes::from_static(b"{\"pay")) });
    let cut = futures_util::stream::once(async {
        // Let hyper flush the status line, headers and first bytes before the cut.
        tokio::time::sleep(Duration::from_millis(100)).await;
        Err::<Bytes, _>(std::io::Error::other("injected: connection dropped"))
    });
    Response::from_parts(parts, Body::from_stream(first_bytes.chain(cut)))
}
