//! `checkout-server verify` and the server's periodic check (`CHECKOUT_VERIFY_SECS`), beside a
//! running server over real SQLite and real PostgreSQL: books that balance are reported so
//! (exit 0, every invariant with the rows it covered); books broken behind the server's back
//! are reported with the invariant and the ids breaking it (exit 1), in the report, in the JSON
//! and in the metric; a database that cannot be read is one clear line (exit 2).

use std::time::{Duration, Instant};

use checkout_testkit as support;
use reqwest::StatusCode;
use serde_json::Value;
use support::{Backend, Server, TestDb, metric, new_key, pay_session};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

checkout_testkit::on_both_databases!(
    verify_reports_books_that_balance_and_books_that_do_not,
    verify_sees_orphan_transfers_wrong_expiries_and_refund_events_by_id,
);

/// `checkout-server verify [--json]` over `url`: exit code, stdout, stderr.
fn verify(url: &str, json: bool) -> (i32, String, String) {
    let mut command = std::process::Command::new(SERVER);
    command
        .arg("verify")
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn");
    if json {
        command.arg("--json");
    }
    let output = command.output().expect("checkout-server runs");
    (
        output.status.code().expect("verify exits"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn invariant<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["invariants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("{name} is in the report: {report}"))
}

/// Scrapes until `done` holds of the scrape (the periodic check runs every second).
async fn scrape_until(url: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scrape = reqwest::get(url).await.unwrap().text().await.unwrap();
        if done(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "{what} within 30 s:\n{scrape}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn verify_reports_books_that_balance_and_books_that_do_not(backend: Backend) {
    let db = TestDb::new(backend).await;
    let metrics_addr = format!("127.0.0.1:{}", support::postgres::free_port());
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_METRICS_ADDR", &metrics_addr),
            ("CHECKOUT_VERIFY_SECS", "1"),
        ],
    )
    .await;
    let metrics_url = format!("http://{metrics_addr}/metrics");
    let shop = server.add_shop("Лавка сверки").await;
    let shopper = server.api().shopper().await;
    for (order, amount) in [("V-1", 30_000), ("V-2", 12_000)] {
        let session = shop.session(order, amount).await;
        let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
        assert_eq!(paid.status, StatusCode::CREATED);
        if order == "V-1" {
            let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
            assert_eq!(
                shop.refund(&payment_id, &new_key(), 5_000).await.status,
                StatusCode::CREATED
            );
        }
    }

    // Books that balance: exit 0, every invariant ok, with the rows it covered.
    let (code, report, _) = verify(&db.url, false);
    assert_eq!(code, 0, "{report}");
    assert!(
        report.starts_with("the books balance: 22 invariants of "),
        "{report}"
    );
    assert!(!report.contains("FAIL"), "{report}");
    let (code, json, _) = verify(&db.url, true);
    assert_eq!(code, 0);
    let json: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["holds"], true);
    assert_eq!(json["invariants"].as_array().unwrap().len(), 22);
    assert_eq!(
        invariant(&json, "one_movement_per_claim")["constraint"],
        "ledger.claim_id UNIQUE"
    );
    assert!(
        report.contains(
            "(also the schema's payments.checkout_session_id UNIQUE: fails only if it was dropped)"
        ),
        "{report}"
    );
    assert_eq!(invariant(&json, "payments_moved_once")["rows"], 2);
    assert_eq!(invariant(&json, "refunds_moved_once")["rows"], 1);
    assert_eq!(
        invariant(&json, "transfers_sum_to_zero")["violation_count"],
        0
    );
    let scrape = scrape_until(&metrics_url, "a periodic check", |s| {
        metric(s, "checkout_verify_last_run_timestamp_seconds", &[]).is_some()
    })
    .await;
    assert_eq!(
        metric(
            &scrape,
            "checkout_invariant_violations",
            &[("invariant", "payments_moved_once")]
        ),
        Some(0.0)
    );

    // Money made behind the server's back: the shopper's balance no longer equals its ledger,
    // and the test money no longer sums to what was issued.
    let shopper_account = db
        .scalar_text("SELECT shopper_account_id FROM payments LIMIT 1")
        .await;
    db.execute(&format!(
        "UPDATE accounts SET balance = balance + 100 WHERE account_id = '{shopper_account}'"
    ))
    .await;
    let (code, report, _) = verify(&db.url, false);
    assert_eq!(code, 1, "{report}");
    assert!(
        report.starts_with("INVARIANTS BROKEN: 22 invariants"),
        "{report}"
    );
    let failing: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failing.len(), 2, "{report}");
    assert!(failing[0].contains("balances_equal_ledger"), "{report}");
    assert!(
        failing[0].contains(&format!("1 violating: {shopper_account}")),
        "{report}"
    );
    assert!(failing[1].contains("test_money_conserved"), "{report}");
    let (code, json, _) = verify(&db.url, true);
    assert_eq!(code, 1);
    let json: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["holds"], false);
    assert_eq!(
        invariant(&json, "balances_equal_ledger")["violations"],
        serde_json::json!([shopper_account])
    );
    assert_eq!(
        invariant(&json, "payments_moved_once")["violation_count"],
        0
    );
    assert_eq!(
        db.broken_invariants().await,
        ["balances_equal_ledger", "test_money_conserved"]
    );
    let scrape = scrape_until(&metrics_url, "the broken invariant in the metric", |s| {
        metric(
            s,
            "checkout_invariant_violations",
            &[("invariant", "balances_equal_ledger")],
        ) == Some(1.0)
    })
    .await;
    assert_eq!(
        metric(
            &scrape,
            "checkout_invariant_violations",
            &[("invariant", "test_money_conserved")]
        ),
        Some(1.0)
    );
    assert!(
        server.log().contains("an invariant of the books is broken"),
        "the server logs it"
    );

    // A database that cannot be read: one line, exit 2, no password shown.
    let (code, out, err) = verify("postgres://checkout:s3cret@127.0.0.1:1/nothing", false);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.starts_with("checkout-server: cannot verify postgres://checkout:***@"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Three ways to break the books that the count-based checks did not see, each done behind the
/// server's back: a transfer (balanced, claimed, balances adjusted to match) naming a payment
/// that does not exist; a `checkout_session.expired` event for a session that is paid; and a
/// refund's event rewritten to name another refund (the count of events per payment unchanged).
/// Each is reported by its own invariant, with the ids breaking it, and by nothing else.
async fn verify_sees_orphan_transfers_wrong_expiries_and_refund_events_by_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка сверки").await;
    let shopper = server.api().shopper().await;
    let session = shop.session("V-ORPHAN", 20_000).await;
    let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    let refund = shop.refund(&payment_id, &new_key(), 5_000).await;
    assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
    let refund_id = refund.json()["refund_id"].as_str().unwrap().to_owned();
    let (code, report, _) = verify(&db.url, false);
    assert_eq!(code, 0, "{report}");

    let shopper_account = db
        .scalar_text("SELECT shopper_account_id FROM payments LIMIT 1")
        .await;
    let shop_account = db
        .scalar_text("SELECT shop_account_id FROM payments LIMIT 1")
        .await;
    for sql in [
        // A balanced, claimed transfer for a payment no one made, the balances moved with it.
        format!(
            "INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, created_at) \
             VALUES ('{shopper_account}', -100, 'payment', 'k-ghost', 'c-ghost', 'pay_ghost', 1)"
        ),
        format!(
            "INSERT INTO ledger (account_id, amount, kind, payment_id, created_at) \
             VALUES ('{shop_account}', 100, 'payment', 'pay_ghost', 1)"
        ),
        format!(
            "UPDATE accounts SET balance = balance - 100 WHERE account_id = '{shopper_account}'"
        ),
        format!("UPDATE accounts SET balance = balance + 100 WHERE account_id = '{shop_account}'"),
        // The paid session said to have lapsed.
        format!(
            "INSERT INTO webhook_events (event_id, seq, shop_account_id, type, subject_id, body, \
             created_at, next_attempt_at, status) \
             SELECT 'evt_ghost', MAX(seq) + 1, '{shop_account}', 'checkout_session.expired', \
                    '{session}', '{{}}', 1, 1, 'pending' FROM webhook_events"
        ),
        // The refund's event names another refund: one event per refund still, by count.
        format!(
            "UPDATE webhook_events SET body = REPLACE(body, '{refund_id}', 'ref_ghost') \
              WHERE type = 'refund.succeeded'"
        ),
    ] {
        db.execute(&sql).await;
    }
    let (code, json, _) = verify(&db.url, true);
    let json: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(code, 1, "{json}");
    assert_eq!(
        db.broken_invariants().await,
        [
            "transfers_name_their_change",
            "refunds_have_one_event",
            "expired_events_name_lapsed_sessions",
        ],
        "{json}"
    );
    assert_eq!(
        invariant(&json, "transfers_name_their_change")["violations"],
        serde_json::json!(["pay_ghost", "pay_ghost"])
    );
    assert_eq!(
        invariant(&json, "expired_events_name_lapsed_sessions")["violations"],
        serde_json::json!([session])
    );
    let refunds = invariant(&json, "refunds_have_one_event")["violations"].clone();
    let refunds: Vec<&str> = refunds
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(refunds.len(), 2, "{refunds:?}");
    assert_eq!(refunds[0], refund_id, "the refund without its event");
    assert!(
        refunds[1].starts_with("evt_"),
        "the event without its refund: {refunds:?}"
    );
}
