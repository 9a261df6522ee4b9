//! A payment's or a refund's change is whole or nothing. On PostgreSQL each runs as a few
//! composed statements whose steps feed each other (`store/payments.rs`); here every step that
//! can find nothing is made to, and the database is read afterwards: nothing of the declined
//! request remains (no payment, ledger row, waiting credit, refund or event; balances and the
//! session as they were), and its key replays the same decline.

use checkout_testkit as support;

/// The server under test: this package's own binary.
const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use reqwest::StatusCode;
use support::{Backend, OPENING_BALANCE, Server, TestDb, new_key, pay_session};

// A session taken meanwhile (the change's first step finds nothing) is
// `shops.rs::shoppers_racing_for_one_session_pay_it_once`.
checkout_testkit::on_both_databases!(
    a_short_balance_leaves_the_session_open_and_nothing_written,
    a_session_lapsed_at_that_instant_is_declined_whole,
    a_refund_over_the_remainder_leaves_nothing,
);

async fn a_short_balance_leaves_the_session_open_and_nothing_written(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка").await;
    let shopper = server.api().shopper().await;
    let session_id = shop.session("ord-dear", OPENING_BALANCE + 1).await;
    let key = new_key();

    // The session is taken, then the debit finds the balance short.
    let declined = shopper.pay(&key, &pay_session(&session_id)).await;
    declined.assert_problem(402, "insufficient_funds");
    assert_eq!(declined.json()["balance"], OPENING_BALANCE);
    assert_eq!(
        db.payment_footprint(&session_id).await,
        (0, 0, 0, 0, "open/-".to_owned()),
        "the session is open again and nothing was written"
    );
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events").await,
        0,
        "no event of any kind"
    );
    let again = shopper.pay(&key, &pay_session(&session_id)).await;
    assert!(again.replayed());
    assert_eq!(again.body, declined.body);

    db.assert_invariants().await;
}

async fn a_session_lapsed_at_that_instant_is_declined_whole(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка").await;
    let shopper = server.api().shopper().await;
    let session_id = shop.session("ord-late", 5_000).await;
    // Lapsed this very millisecond, and not yet closed by any sweep: only the change's own
    // guard on the time stands between it and a payment.
    db.execute(&format!(
        "UPDATE checkout_sessions SET expires_at = {} WHERE session_id = '{session_id}'",
        checkout_idempotency::now_ms()
    ))
    .await;

    let key = new_key();
    let late = shopper.pay(&key, &pay_session(&session_id)).await;
    late.assert_problem(410, "session_expired");
    let (payments, ledger, credits, events, state) = db.payment_footprint(&session_id).await;
    assert_eq!((payments, ledger, credits, events), (0, 0, 0, 0));
    assert!(
        state == "open/-" || state == "expired/-",
        "never paid: {state}"
    );
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events WHERE type = 'payment.succeeded'")
            .await,
        0
    );
    let again = shopper.pay(&key, &pay_session(&session_id)).await;
    assert!(again.replayed());
    assert_eq!(again.body, late.body);
    db.assert_invariants().await;
}

async fn a_refund_over_the_remainder_leaves_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка").await;
    let shopper = server.api().shopper().await;
    let paid = shopper
        .pay(&new_key(), &shop.checkout("ord-1", 30_000).await)
        .await;
    let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
    assert_eq!(
        shop.refund(&payment_id, &new_key(), 20_000).await.status,
        StatusCode::CREATED
    );
    // A second payment to the shop: its credit waits, unfolded, beside the shop's balance.
    let other = server.api().shopper().await;
    let waiting = other
        .pay(&new_key(), &shop.checkout("ord-2", 7_000).await)
        .await;
    assert_eq!(waiting.status, StatusCode::CREATED);
    let shop_row = format!(
        "SELECT balance FROM accounts WHERE account_id = \
           (SELECT shop_account_id FROM payments WHERE payment_id = '{payment_id}')"
    );
    let before = (
        db.scalar(&shop_row).await,
        db.scalar("SELECT COUNT(*) FROM unfolded_credits").await,
        db.scalar("SELECT COUNT(*) FROM refunds").await,
        db.scalar("SELECT COUNT(*) FROM ledger").await,
        db.scalar("SELECT COUNT(*) FROM webhook_events").await,
    );

    // 10 000 remains: 10 001 is refused at the first step, and nothing after it runs, not
    // even the folding of the waiting credit.
    let key = new_key();
    let over = shop.refund(&payment_id, &key, 10_001).await;
    over.assert_problem(409, "refund_exceeds_payment");
    assert_eq!(over.json()["refundable"], 10_000);
    let after = (
        db.scalar(&shop_row).await,
        db.scalar("SELECT COUNT(*) FROM unfolded_credits").await,
        db.scalar("SELECT COUNT(*) FROM refunds").await,
        db.scalar("SELECT COUNT(*) FROM ledger").await,
        db.scalar("SELECT COUNT(*) FROM webhook_events").await,
    );
    assert_eq!(
        after, before,
        "balance row, waiting credits, refunds, ledger, events"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT refunded FROM payments WHERE payment_id = '{payment_id}'"
        ))
        .await,
        20_000
    );
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 30_000 + 20_000);
    let again = shop.refund(&payment_id, &key, 10_001).await;
    assert!(again.replayed());
    assert_eq!(again.body, over.body);
    // What remains is still refundable, whole.
    let rest = shop.refund(&payment_id, &new_key(), 10_000).await;
    assert_eq!(rest.status, StatusCode::CREATED, "{}", rest.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE);
    assert_eq!(shop.balance().await, 7_000);
    db.assert_invariants().await;
}

/// The statements of the payment path the server sent, in order, as sqlx logs them (a `BEGIN`
/// and `COMMIT` travel besides; background work's statements are left out by name).
fn payment_statements(log: &[String]) -> Vec<&'static str> {
    const PAYMENT_PATH: [(&str, &str); 14] = [
        ("summary=\"SELECT account_id, currency, kind", "credential"),
        ("summary=\"SELECT s.status AS session_status", "outlook"),
        (
            "INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, request_body, status, response_status",
            "at once",
        ),
        ("summary=\"WITH claimed", "claim"),
        ("summary=\"WITH session", "change"),
        ("summary=\"WITH deferred_0", "answer with event"),
        ("summary=\"INSERT INTO idempotency_keys", "claim (separate)"),
        ("summary=\"UPDATE idempotency_keys", "answer (separate)"),
        ("summary=\"UPDATE checkout_sessions", "session (separate)"),
        ("summary=\"UPDATE accounts", "debit (separate)"),
        ("summary=\"INSERT INTO payments", "payment (separate)"),
        ("summary=\"INSERT INTO ledger", "ledger (separate)"),
        (
            "summary=\"INSERT INTO unfolded_credits",
            "credit (separate)",
        ),
        ("summary=\"INSERT INTO webhook_events", "event (separate)"),
    ];
    log.iter()
        .filter(|line| line.contains("sqlx::query"))
        .filter_map(|line| {
            PAYMENT_PATH
                .iter()
                .find(|(start, _)| line.contains(start))
                .map(|(_, name)| *name)
        })
        .collect()
}

/// PostgreSQL: a keyed payment is one read (the session, the balance, the key) and one statement
/// that claims, pays, writes the event and stores the answer, outside any transaction; its
/// replay is the read alone. The answer carries the balance the debit left, and the replay is
/// the answer byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keyed_payment_is_two_round_trips_on_postgres() {
    let db = TestDb::new(Backend::Postgres).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[("RUST_LOG", "info,sqlx=warn,sqlx::query=debug")],
    )
    .await;
    let shop = server.add_shop("Лавка").await;
    let shopper = server.api().shopper().await;
    let body = shop.checkout("ord-rt", 1_000).await;
    // A test shopper's token is read once, then known for a while (it always names the same
    // account): in steady state a payment reads no credential.
    shopper.balance().await;
    let key = new_key();
    let (statements, first) = statements_of(&server, shopper.pay(&key, &body)).await;
    assert_eq!(statements, ["outlook", "at once"]);
    let paid: serde_json::Value = serde_json::from_str(&first.body).unwrap();
    assert_eq!(paid["balance"], OPENING_BALANCE - 1_000, "{}", first.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 1_000);
    let (statements, replay) = statements_of(&server, shopper.pay(&key, &body)).await;
    assert_eq!(statements, ["outlook"], "a replay is answered by the read");
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 1_000);
    db.assert_invariants().await;
}

/// What the payment path sent for one request: the server's log from before it to its
/// response's own log line (written after every statement of the request).
async fn statements_of(
    server: &Server,
    request: impl std::future::Future<Output = support::Answer>,
) -> (Vec<&'static str>, support::Answer) {
    let responses = |log: &str| log.matches("finished processing request").count();
    let before = server.log();
    let answer = request.await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    support::wait_until(
        "the request's log line",
        std::time::Duration::from_secs(5),
        || async { responses(&server.log()) > responses(&before) },
    )
    .await;
    let log = server.log();
    let lines: Vec<String> = log
        .lines()
        .skip(before.lines().count())
        .map(str::to_owned)
        .collect();
    (payment_statements(&lines), answer)
}
