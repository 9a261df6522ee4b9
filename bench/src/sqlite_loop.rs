//! SQLite's own limit for the checkout's transaction: the server's keyed payment of a session,
//! statement for statement (claim, session taken, guarded debit, payment row, the transfer's two
//! ledger rows, the shop's waiting credit, stored answer), run straight against a SQLite file
//! with the server's pragmas and one commit per transaction, on one thread (SQLite has one
//! writer). What the service does beyond this is HTTP, JSON and its own bookkeeping.

use std::path::Path;
use std::time::{Duration, Instant};

use checkout_backend::store::{events, keys, payments, sessions};

/// A payment's event as the server writes it into the outbox (about this size).
const EVENT_BODY: &str = r#"{"type":"payment.succeeded","timestamp":"2026-12-02T14:01:20.331Z","data":{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","created_at":"2026-12-02T14:01:20.331Z"}}"#;
use rusqlite::{Connection, named_params};

use crate::load::{Run, session_id};
use crate::setup::SHOPS;

pub fn run(dir: &Path, accounts: usize, seconds: u64) -> Run {
    let file = dir.join("sqlite-loop.db");
    let _ = std::fs::remove_file(&file);
    let conn = Connection::open(&file).expect("a SQLite file");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA temp_store = MEMORY; PRAGMA cache_size = -65536; PRAGMA wal_autocheckpoint = 10000;",
    )
    .unwrap();
    for migration in checkout_backend::store::sqlite_migrations() {
        conn.execute_batch(migration).unwrap();
    }
    for i in 0..accounts {
        conn.execute(
            "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at) \
             VALUES (?1, ?2, 'RUB', 1000000000000, 0)",
            (format!("bench-{i}"), format!("hash-{i}")),
        )
        .unwrap();
    }
    for i in 0..SHOPS {
        conn.execute(
            "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind) \
             VALUES (?1, ?2, 'RUB', 0, 0, 'shop')",
            (format!("shop-{i}"), format!("shop-hash-{i}")),
        )
        .unwrap();
    }
    let sessions: u64 = seconds * 20_000;
    conn.execute(
        &format!(
            "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < {sessions}) \
             INSERT INTO checkout_sessions (session_id, shop_account_id, order_id, amount, currency, \
                                            items, status, expires_at, created_at) \
             SELECT 'cs_' || printf('%032x', n), 'shop-' || (n % {SHOPS}), 'o-' || n, 1, 'RUB', '[]', \
                    'open', 9999999999999, 0 FROM seq"
        ),
        (),
    )
    .unwrap();
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut n: u64 = 0;
    while Instant::now() < deadline && n < sessions {
        n += 1;
        let started = Instant::now();
        let (account, key, claim, session, payment) = (
            format!("bench-{}", n as usize % accounts),
            format!("k-{n}"),
            format!("c-{n}"),
            session_id(n),
            format!("pay_{n}"),
        );
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.prepare_cached(&keys::SQLITE_CLAIM_KEY)
            .unwrap()
            .query_row(
                named_params! {"$1": account, "$2": key, "$3": claim, "$4": "hash",
                "$5": 1_764_000_000_000_i64, "$6": 1_763_900_000_000_i64,
                "$7": format!(r#"{{"checkout_session_id":"{session}"}}"#)},
                |row| row.get::<_, String>(0),
            )
            .unwrap();
        let (shop, order): (String, String) = conn
            .prepare_cached(sessions::TAKE_SESSION)
            .unwrap()
            .query_row(
                named_params! {"$1": session, "$2": payment, "$3": 1_764_000_000_000_i64},
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        let balance: i64 = conn
            .prepare_cached(payments::DEBIT)
            .unwrap()
            .query_row(named_params! {"$1": account, "$2": 1}, |row| row.get(0))
            .unwrap();
        conn.prepare_cached(payments::INSERT_PAYMENT)
            .unwrap()
            .execute(
                named_params! {"$1": payment, "$2": session, "$3": account, "$4": shop,
                "$5": order, "$6": 1, "$7": "RUB", "$8": balance, "$9": key,
                "$10": 1_764_000_000_000_i64},
            )
            .unwrap();
        for (ledger_account, amount, ledger_key, ledger_claim) in [
            (&account, -1, Some(&key), Some(&claim)),
            (&shop, 1, None, None),
        ] {
            conn.prepare_cached(payments::INSERT_LEDGER)
                .unwrap()
                .execute(
                    named_params! {"$1": ledger_account, "$2": amount, "$3": "payment",
                    "$4": ledger_key, "$5": ledger_claim, "$6": payment, "$7": None::<String>,
                    "$8": 1_764_000_000_000_i64},
                )
                .unwrap();
        }
        conn.prepare_cached(payments::INSERT_UNFOLDED_CREDIT)
            .unwrap()
            .execute(named_params! {"$1": payment, "$2": shop, "$3": 1})
            .unwrap();
        conn.prepare_cached(events::SQLITE_INSERT_EVENT)
            .unwrap()
            .execute(named_params! {"$1": format!("evt-{payment}"), "$2": shop,
            "$3": "payment.succeeded", "$4": payment, "$5": EVENT_BODY,
            "$6": 1_764_000_000_000_i64})
            .unwrap();
        conn.prepare_cached(keys::COMPLETE_KEY)
            .unwrap()
            .execute(named_params! {"$1": account, "$2": key, "$3": claim, "$4": 201,
                                    "$5": r#"{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z"}"#})
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
