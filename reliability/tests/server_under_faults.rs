//! What a slow or stopping server does to requests in flight.

use std::time::Duration;

use checkout_testkit::{Backend, OPENING_BALANCE, Server, TestDb, new_key, wait_until};
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
        let held_before = held(&server);
        let key = new_key();
        let in_flight = tokio::spawn({
            let (shopper, key, body) = (shopper.clone(), key.clone(), body.clone());
            async move { shopper.pay(&key, &body).await }
        });
        // SIGTERM once the payment is inside its transaction (its key row is not committed yet,
        // so the only sign is the fault's own log line).
        wait_until(
            "the payment never reached its commit",
            Duration::from_secs(20),
            || async { held(&server) > held_before },
        )
        .await;
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
        let held_before = held(&server);
        let key = new_key();
        let original = tokio::spawn({
            let (shopper, key, body) = (shopper.clone(), key.clone(), body.clone());
            async move { shopper.pay(&key, &body).await }
        });
        // Wait until the original holds its claim: its transaction has run every statement
        // and is held open before its COMMIT.
        wait_until(
            "the payment never reached its commit",
            Duration::from_secs(20),
            || async { held(&server) > held_before },
        )
        .await;
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

/// Transactions the fault has held open before their COMMIT so far (the shop's session is one).
fn held(server: &Server) -> usize {
    server.log().matches("holding the transaction open").count()
}
