//! Running the server: several instances on one PostgreSQL, graceful shutdown, bad settings.

use checkout_testkit as support;

/// The server under test: this package's own binary.
const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use futures::future::join_all;
use reqwest::StatusCode;
use support::{Backend, OPENING_BALANCE, Server, TestDb, new_key, payment};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sharing_postgres_execute_each_key_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let (one, two) = (
        Server::start(SERVER, &db).await,
        Server::start(SERVER, &db).await,
    );
    let shopper = one.api().shopper().await;
    let via = [shopper.clone(), shopper.on(&two)];

    // 64 copies of one request, alternating between the instances.
    let key = new_key();
    let body = payment("ord-split", 7_000);
    let answers = join_all((0..64).map(|i| via[i % 2].pay(&key, &body))).await;
    let firsts = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .count();
    assert_eq!(firsts, 1, "one execution across both instances");
    for answer in &answers {
        match answer.status {
            StatusCode::CREATED => assert_eq!(
                answer.body,
                answers.iter().find(|a| !a.replayed()).unwrap().body
            ),
            StatusCode::CONFLICT => answer.assert_problem(409, "idempotency_key_in_use"),
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }

    // Distinct payments spread over both instances, each sent twice at once (once to each).
    let results = join_all((0..30).map(|i| {
        let via = via.clone();
        async move {
            let (key, body) = (new_key(), payment(&format!("ord-{i}"), 1_000));
            let (a, b) = futures::join!(
                via[0].pay_until_definite(&key, &body),
                via[1].pay_until_definite(&key, &body)
            );
            assert_eq!(a.body, b.body, "both instances give the one answer");
            a
        }
    }))
    .await;
    assert!(results.iter().all(|a| a.status == StatusCode::CREATED));
    assert_eq!(via[1].balance().await, OPENING_BALANCE - 7_000 - 30 * 1_000);
    db.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_the_server_cleanly() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let mut server = Server::start(SERVER, &db).await;
        let shopper = server.api().shopper().await;
        assert_eq!(
            shopper.pay(&new_key(), &payment("ord-t", 100)).await.status,
            StatusCode::CREATED
        );
        let status = server.terminate();
        assert!(
            status.success(),
            "{backend:?}: exit {status:?}\n{}",
            server.log()
        );
        assert!(server.log().contains("stopped"), "{}", server.log());
        // What it acknowledged is there after a restart.
        let restarted = Server::start(SERVER, &db).await;
        assert_eq!(
            shopper.on(&restarted).balance().await,
            OPENING_BALANCE - 100
        );
    }
}

fn run_server(env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_checkout-server"));
    command
        .env("CHECKOUT_ADDR", "127.0.0.1:0")
        .env("CHECKOUT_STATIC_DIR", "/nonexistent");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("checkout-server runs")
}

#[test]
fn a_bad_setting_is_one_clear_line_and_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("x.db").display());
    for (name, value) in [
        ("CHECKOUT_ADDR", "not-an-address"),
        ("CHECKOUT_KEY_TTL_SECS", "0"),
        ("CHECKOUT_LOCK_TIMEOUT_MS", "soon"),
        ("CHECKOUT_DEMO", "perhaps"),
        ("DATABASE_URL", "mysql://nope"),
    ] {
        let out = run_server(&[("DATABASE_URL", &db), (name, value)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}={value} must fail");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{name}={value}: one line, got:\n{stderr}"
        );
        assert!(stderr.starts_with("checkout-server: "), "{stderr}");
    }
}

#[test]
fn an_unreachable_database_is_one_clear_line_and_a_failure() {
    let port = support::postgres::free_port(); // nothing listens there
    let out = run_server(&[(
        "DATABASE_URL",
        &format!("postgres://checkout:secret@127.0.0.1:{port}/checkout"),
    )]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot open the database"), "{stderr}");
    assert!(
        !stderr.contains("secret"),
        "the password is never printed: {stderr}"
    );
}
