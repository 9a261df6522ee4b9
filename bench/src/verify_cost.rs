//! What `checkout-server verify` costs on a database the size of a shop's year: the service
//! pays sessions until each database holds `payments` payments; then `verify` is timed alone,
//! and the keyed service's throughput is measured without it and with it running back to back
//! (the writers' cost of its snapshot). Writes a small Markdown table for RELIABILITY.md.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use checkout_testkit::{Scope, TestDb};

use crate::{KEYED, SessionNumbers, Target};

pub struct Cost {
    pub database: &'static str,
    pub payments: i64,
    pub ledger_rows: i64,
    pub verify_alone: Duration,
    /// The three slowest invariants of the run alone, with their times.
    pub slowest: String,
    pub verify_under_load: Vec<Duration>,
    pub without: f64,
    pub with: f64,
}

/// Clients paying during the measurement.
const CLIENTS: usize = 32;

pub async fn measure(
    database: &'static str,
    target: &Target,
    numbers: &mut SessionNumbers,
    payments: i64,
    seconds: u64,
    dir: &std::path::Path,
) -> Cost {
    let count = |db: &TestDb, table: &'static str| {
        let url = db.url.clone();
        async move {
            TestDb::at(url)
                .scalar(&format!("SELECT COUNT(*) FROM {table}"))
                .await
        }
    };
    loop {
        let have = count(&target.db, "payments").await;
        if have >= payments {
            break;
        }
        eprintln!("{database}: {have} payments of {payments}, paying more");
        target.pay_fresh(numbers, KEYED, CLIENTS, 20, dir).await;
    }
    let verified = target.db.verify(Scope::Service).await;
    assert!(verified.holds(), "{:?}", verified.broken());
    let verify_alone = verified.took;
    let mut by_time: Vec<_> = verified.checked.iter().collect();
    by_time.sort_by_key(|c| std::cmp::Reverse(c.took));
    let slowest = by_time
        .iter()
        .take(3)
        .map(|c| format!("{} {:.2} s", c.invariant.name, c.took.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ");

    let without = target
        .pay_fresh(numbers, KEYED, CLIENTS, seconds, dir)
        .await;
    let running = Arc::new(AtomicBool::new(true));
    let verifier = {
        let (running, url) = (running.clone(), target.db.url.clone());
        tokio::spawn(async move {
            let db = TestDb::at(url);
            let mut took = Vec::new();
            while running.load(Ordering::SeqCst) {
                let verified = db.verify(Scope::Service).await;
                assert!(verified.holds(), "{:?}", verified.broken());
                took.push(verified.took);
            }
            took
        })
    };
    let with = target
        .pay_fresh(numbers, KEYED, CLIENTS, seconds, dir)
        .await;
    running.store(false, Ordering::SeqCst);
    let verify_under_load = verifier.await.unwrap();
    Cost {
        database,
        payments: count(&target.db, "payments").await,
        ledger_rows: count(&target.db, "ledger").await,
        verify_alone,
        slowest,
        verify_under_load,
        without: without.throughput(),
        with: with.throughput(),
    }
}

pub fn markdown(costs: &[Cost], seconds: u64) -> String {
    let mut md = String::new();
    writeln!(md, "| database | payments | ledger rows | verify alone | verify runs under load (median, max) | keyed payments/s without verify | with verify running back to back | with ÷ without | slowest invariants (alone) |").unwrap();
    writeln!(md, "|---|---|---|---|---|---|---|---|---|").unwrap();
    for c in costs {
        let mut runs: Vec<f64> = c
            .verify_under_load
            .iter()
            .map(Duration::as_secs_f64)
            .collect();
        runs.sort_by(f64::total_cmp);
        let (median, max) = match runs.len() {
            0 => (0.0, 0.0),
            n => (runs[n / 2], runs[n - 1]),
        };
        writeln!(
            md,
            "| {} | {} | {} | {:.2} s | {} runs: {median:.2} s, {max:.2} s | {:.0} | {:.0} | {:.2} | {} |",
            c.database,
            c.payments,
            c.ledger_rows,
            c.verify_alone.as_secs_f64(),
            runs.len(),
            c.without,
            c.with,
            c.with / c.without,
            c.slowest
        )
        .unwrap();
    }
    writeln!(md, "\n{CLIENTS} clients paying fresh sessions with fresh keys through the service, {seconds} s without and {seconds} s with `verify` (the code of `checkout-server verify`, `Scope::Service`) running back to back on its own connection. One run each, on this shared 2-core machine: the ratio is what to read, not the absolute figures.").unwrap();
    md
}
