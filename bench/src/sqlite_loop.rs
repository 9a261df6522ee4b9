//! SQLite's own limit for the checkout's transaction: the server's keyed payment, statement for
//! statement (claim, guarded debit, payment row, ledger row, stored answer), run straight against
//! a SQLite file with the server's pragmas and one commit per transaction, on one thread (SQLite
//! has one writer). What the service does beyond this is HTTP, JSON and its own bookkeeping.

use std::path::Path;
use std::time::{Duration, Instant};

use checkout_backend::store::{sql, sqlite_claim_key};
use rusqlite::{Connection, named_params};

use crate::load::Run;

pub fn run(dir: &Path, accounts: usize, seconds: u64) -> Run {
    let file = dir.join("sqlite-loop.db");
    let _ = std::fs::remove_file(&file);
    let conn = Connection::open(&file).expect("a SQLite file");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA temp_store = MEMORY; PRAGMA cache_size = -65536; PRAGMA wal_autocheckpoint = 10000;",
    )
    .unwrap();
    conn.execute_batch(include_str!("../../migrations/sqlite/0001_checkout.sql"))
        .unwrap();
    for i in 0..accounts {
        conn.execute(
            "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at) \
             VALUES (?1, ?2, 'RUB', 1000000000000, 0)",
            (format!("bench-{i}"), format!("hash-{i}")),
        )
        .unwrap();
    }
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut n: u64 = 0;
    while Instant::now() < deadline {
        n += 1;
        let started = Instant::now();
        let (account, key, claim, order, payment) = (
            format!("bench-{}", n as usize % accounts),
            format!("k-{n}"),
            format!("c-{n}"),
            format!("o-{n}"),
            format!("pay_{n}"),
        );
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.prepare_cached(sqlite_claim_key())
            .unwrap()
            .query_row(
                named_params! {"$1": account, "$2": key, "$3": claim, "$4": "hash",
                "$5": 1_764_000_000_000_i64, "$6": 1_763_900_000_000_i64,
                               "$7": r#"{"amount":1,"order_id":"o-1-123456789"}"#},
                |row| row.get::<_, String>(0),
            )
            .unwrap();
        let balance: i64 = conn
            .prepare_cached(sql::DEBIT_FOR_ORDER)
            .unwrap()
            .query_row(named_params! {"$1": account, "$2": 1, "$3": order}, |row| {
                row.get(0)
            })
            .unwrap();
        conn.prepare_cached(sql::INSERT_PAYMENT)
            .unwrap()
            .execute(
                named_params! {"$1": payment, "$2": account, "$3": order, "$4": 1,
                "$5": "RUB", "$6": balance, "$7": key, "$8": 1_764_000_000_000_i64},
            )
            .unwrap();
        conn.prepare_cached(sql::INSERT_LEDGER)
            .unwrap()
            .execute(
                named_params! {"$1": account, "$2": -1, "$3": "payment", "$4": key,
                "$5": claim, "$6": payment, "$7": None::<String>,
                "$8": 1_764_000_000_000_i64},
            )
            .unwrap();
        conn.prepare_cached(sql::COMPLETE_KEY)
            .unwrap()
            .execute(named_params! {"$1": account, "$2": key, "$3": claim, "$4": 201,
                                    "$5": r#"{"payment_id":"pay_9205d15e13e544e480ae12c72f73a5b5","order_id":"o-1-123456789","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z"}"#})
            .unwrap();
        conn.execute_batch("COMMIT").unwrap();
        histogram
            .record(started.elapsed().as_micros() as u64)
            .unwrap();
    }
    Run {
        requests: n,
        seconds: seconds as f64,
        errors: 0,
        p50_ms: histogram.value_at_quantile(0.5) as f64 / 1e3,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1e3,
    }
}
