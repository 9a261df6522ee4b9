//! What a slow or stopping server does to requests in flight.

use std::time::Duration;

use checkout_testkit::{
    Backend, OPENING_BALANCE, Server, TestDb, new_key, pay_session, wait_until,
};
use reqwest::StatusCode;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_an_in_flight_payment_finish() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let mut server = Server::start_with(
            SERVER,
            &db,
            &[("CHECKOUT_FAULTS", "delay_before_commit_ms=1500")],
        )
        .await;
        let shopper = server.api().shopper().await;
        let body = server
            .add_shop("Лавка")
            .await
            .checkout("ord-term", 700)
            .await;
        let key = new_key();
        // SIGTERM once the payment is inside its transaction.
        let in_flight = pay_held(&server, &shopper, &key, &body).await;
        let status = tokio::task::spawn_blocking(move || {
            let status = server.terminate();
            (status, server)
        });
        let answer = in_flight.await.unwrap();
        let (status, _server) = status.await.unwrap();
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{backend:?}: the in-flight payment finished: {}",
            answer.body
        );
        assert!(status.success(), "{backend:?}: exit {status:?}");
        let restarted = Server::start(SERVER, &db).await;
        let again = shopper.on(&restarted).pay(&key, &body).await;
        assert!(again.replayed());
        assert_eq!(again.body, answer.body);
        assert_eq!(
            shopper.on(&restarted).balance().await,
            OPENING_BALANCE - 700
        );
        db.assert_invariants().await;
    }
}

/// A duplicate waits for the original at most the lock timeout, then answers 409 with
/// Retry-After; once the original commits, the duplicate replays it. The original is really
/// slow (its transaction is held open before COMMIT), on both databases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_of_a_slow_payment_gets_409_then_the_replay() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let server = Server::start_with(
            SERVER,
            &db,
            &[
                ("CHECKOUT_FAULTS", "delay_before_commit_ms=2000"),
                ("CHECKOUT_LOCK_TIMEOUT_MS", "200"),
            ],
        )
        .await;
        let shopper = server.api().shopper().await;
        let body = server
            .add_shop("Лавка")
            .await
            .checkout("ord-slow", 900)
            .await;
        let key = new_key();
        // The original holds its claim: its transaction has run every statement and is held
        // open before its COMMIT.
        let original = pay_held(&server, &shopper, &key, &body).await;
        let started = std::time::Instant::now();
        let duplicate = shopper.pay(&key, &body).await;
        let waited = started.elapsed();
        duplicate.assert_problem(409, "idempotency_key_in_use");
        assert_eq!(
            duplicate.headers.get("retry-after").map(String::as_str),
            Some("1")
        );
        assert!(
            waited < Duration::from_millis(1_500),
            "{backend:?}: the 409 took {waited:?}; the bound is 200 ms"
        );
        let status = shopper.get(&format!("/api/idempotency-keys/{key}")).await;
        assert_eq!(
            status.json()["status"],
            "in_progress",
            "{backend:?}: {}",
            status.body
        );
        assert!(
            !original.is_finished(),
            "{backend:?}: the 409 came while the original was still executing"
        );
        let original = original.await.unwrap();
        assert_eq!(original.status, StatusCode::CREATED);
        let replay = shopper.pay(&key, &body).await;
        assert!(replay.replayed());
        assert_eq!(replay.body, original.body);
        assert_eq!(shopper.balance().await, OPENING_BALANCE - 900);
        db.assert_invariants().await;
    }
}

/// PostgreSQL, two instances: the original is held open before its COMMIT on one (its fault
/// keeps it on the protocol's steps), and its copy reaches the other, which pays in one
/// statement. That statement waits for the original's locks within the lock timeout and writes
/// nothing; the copy's steps then wait one timeout more for the key and answer `409`. Once the
/// original commits, the copy is answered from the read alone, and a new key for the same
/// session is told it was paid: one debit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_paid_at_once_elsewhere_waits_for_the_original_and_writes_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    let slow = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_FAULTS", "delay_before_commit_ms=2500"),
            ("CHECKOUT_LOCK_TIMEOUT_MS", "200"),
        ],
    )
    .await;
    let at_once = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_LOCK_TIMEOUT_MS", "200"),
            ("RUST_LOG", "info,sqlx=warn,sqlx::query=debug"),
        ],
    )
    .await;
    let shopper = slow.api().shopper().await;
    let body = slow.add_shop("Лавка").await.checkout("ord-two", 800).await;
    let key = new_key();
    let original = pay_held(&slow, &shopper, &key, &body).await;
    let started = std::time::Instant::now();
    let copy = shopper.on(&at_once).pay(&key, &body).await;
    let waited = started.elapsed();
    copy.assert_problem(409, "idempotency_key_in_use");
    assert!(
        waited < Duration::from_millis(1_500),
        "the 409 took {waited:?}; two bounds of 200 ms"
    );
    assert!(
        !original.is_finished(),
        "the 409 came while the original was still executing"
    );
    assert!(
        at_once.log().contains("INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, request_body, status, response_status"),
        "the copy did not try the payment in one statement"
    );
    let original = original.await.unwrap();
    assert_eq!(original.status, StatusCode::CREATED, "{}", original.body);
    let replay = shopper.on(&at_once).pay(&key, &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, original.body);
    let another = shopper.on(&at_once).pay(&new_key(), &body).await;
    another.assert_problem(409, "session_already_paid");
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 800);
    db.assert_invariants().await;
}

/// Transactions the fault has held open before their COMMIT so far (the shop's session is one).
fn held(server: &Server) -> usize {
    server.log().matches("holding the transaction open").count()
}

/// Sends a payment on a server that holds transactions before their `COMMIT`, and returns once
/// it is inside its transaction (its key row not committed yet: the fault's own log line is the
/// only sign); its answer comes from the task.
async fn pay_held(
    server: &Server,
    shopper: &checkout_testkit::Api,
    key: &str,
    body: &serde_json::Value,
) -> tokio::task::JoinHandle<checkout_testkit::Answer> {
    let held_before = held(server);
    let payment = tokio::spawn({
        let (shopper, key, body) = (shopper.clone(), key.to_owned(), body.clone());
        async move { shopper.pay(&key, &body).await }
    });
    wait_until(
        "the payment never reached its commit",
        Duration::from_secs(20),
        || async { held(server) > held_before },
    )
    .await;
    payment
}

/// A payment takes a session a moment before it lapses and holds its transaction open (a slow
/// commit) while the sweeper closes lapsed sessions: the payment commits, the session stays
/// paid, its shop is never told it expired, and the next shopper hears it was paid (`409`), not
/// expired. Seen before the fix: the sweep waited for the payment's row, then marked the paid
/// session expired and wrote `checkout_session.expired`, and the next attempt got `410`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_paid_while_it_lapses_stays_paid() {
    let db = TestDb::new(Backend::Postgres).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_FAULTS", "delay_before_commit_ms=2500"),
            ("CHECKOUT_SESSION_TTL_SECS", "4"),
            ("CHECKOUT_SWEEP_SECS", "1"),
            // A sweep that meets the payment's row lock waits for it rather than give up.
            ("CHECKOUT_LOCK_TIMEOUT_MS", "10000"),
        ],
    )
    .await;
    let shop = server.add_shop("Лавка").await;
    let (shopper, latecomer) = (server.api().shopper().await, server.api().shopper().await);
    // Two sessions made together (each creation is held 2.5 s too): one is paid just before
    // it lapses, the other lapses unpaid.
    let (held, witness) = tokio::join!(
        shop.session("ORD-HELD", 3_000),
        shop.session("ORD-WITNESS", 3_000)
    );
    let paid = shopper.pay(&new_key(), &pay_session(&held)).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    let status =
        |id: &str| format!("SELECT status FROM checkout_sessions WHERE session_id = '{id}'");
    wait_until(
        "the unpaid session never lapsed",
        Duration::from_secs(20),
        || async { db.scalar_text(&status(&witness)).await == "expired" },
    )
    .await;
    assert_eq!(db.scalar_text(&status(&held)).await, "paid");
    assert_eq!(
        db.scalar(&format!(
            "SELECT COUNT(*) FROM webhook_events \
              WHERE type = 'checkout_session.expired' AND subject_id = '{held}'"
        ))
        .await,
        0,
        "the shop is not told a paid session expired"
    );
    let late = latecomer.pay(&new_key(), &pay_session(&held)).await;
    late.assert_problem(409, "session_already_paid");
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 3_000);
    db.assert_invariants().await;
}

/// The database connection breaks while a payment's transaction waits for its `COMMIT`: the
/// server cannot know whether it committed, so its `503` says to retry with the same key, not
/// that nothing was charged; the retry answers what happened, charging once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_without_an_answer_is_not_called_nothing_charged() {
    let db = TestDb::new(Backend::Postgres).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[("CHECKOUT_FAULTS", "delay_before_commit_ms=2000")],
    )
    .await;
    let shopper = server.api().shopper().await;
    let body = server
        .add_shop("Лавка")
        .await
        .checkout("ord-doubt", 1_200)
        .await;
    let key = new_key();
    let payment = pay_held(&server, &shopper, &key, &body).await;
    let cut = db
        .scalar(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE datname = current_database() AND state = 'idle in transaction') t",
        )
        .await;
    assert_eq!(cut, 1, "the payment's connection was cut");
    let answer = payment.await.unwrap();
    answer.assert_problem(503, "service_unavailable");
    let detail = answer.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        !detail.contains("nothing was charged") && detail.contains("same key"),
        "{detail}"
    );
    assert!(answer.headers.contains_key("retry-after"));
    let again = shopper.pay_until_definite(&key, &body).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 1_200);
    db.assert_invariants().await;
}

/// SQLite: the `COMMIT` that held a payment reports an I/O error (here after the write went
/// through, as a failed sync can), or the writer thread dies after its `COMMIT`, before
/// answering. Either way the server cannot know what reached the file: its `503` says to retry
/// with the same key, never that nothing was charged; the retry (on the server started again
/// when the writer died) finds the payment, charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_commit_in_doubt_is_not_called_nothing_charged() {
    // The payment is the second keyed request (the session is the first).
    for fault in ["sqlite_commit_io_error_at=2", "sqlite_writer_dies_at=2"] {
        let db = TestDb::new(Backend::Sqlite).await;
        let mut server = Server::start_with(SERVER, &db, &[("CHECKOUT_FAULTS", fault)]).await;
        let shopper = server.api().shopper().await;
        let body = server
            .add_shop("Лавка")
            .await
            .checkout("ord-sqlite-doubt", 1_300)
            .await;
        let key = new_key();
        let answer = shopper.pay(&key, &body).await;
        answer.assert_problem(503, "service_unavailable");
        let detail = answer.json()["detail"].as_str().unwrap().to_owned();
        assert!(
            !detail.contains("nothing was charged") && detail.contains("same key"),
            "{fault}: {detail}"
        );
        assert!(answer.headers.contains_key("retry-after"), "{fault}");
        if fault.starts_with("sqlite_writer_dies") {
            // No writer, no writes: the operator restarts it (the file keeps what committed).
            let status = tokio::task::spawn_blocking(move || {
                let status = server.terminate();
                (status, server)
            });
            drop(status.await.unwrap());
            server = Server::start(SERVER, &db).await;
        }
        let shopper = shopper.on(&server);
        let again = shopper.pay_until_definite(&key, &body).await;
        assert_eq!(again.status, StatusCode::CREATED, "{fault}: {}", again.body);
        assert!(again.replayed(), "{fault}: the first try had committed");
        assert_eq!(shopper.balance().await, OPENING_BALANCE - 1_300, "{fault}");
        db.assert_invariants().await;
    }
}
