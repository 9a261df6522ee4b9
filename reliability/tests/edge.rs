//! The abuse limits of several instances: each checkout counts only what reaches it, so behind a
//! load balancer a client's allowance would be the per-address limit times the instances. The
//! edge counts for all of them: HAProxy's stick table (per client address, shared by the
//! instances behind it) answers the attempt past the limit `429` with `Retry-After`, as the
//! checkout would.

use checkout_testkit::patroni::HaCluster;
use checkout_testkit::{Api, Server, TestDb};
use reqwest::StatusCode;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sign_in_attempts_are_limited_per_address_across_instances() {
    let cluster = HaCluster::start_with_web(2).await;
    let db = TestDb::at(cluster.create_database().await);
    let mut servers = Vec::new();
    for port in &cluster.web_ports {
        let addr = format!("127.0.0.1:{port}");
        // The checkout's own limit, per instance: 30 a minute per address (its default).
        let env = [
            ("CHECKOUT_ADDR", addr.as_str()),
            ("CHECKOUT_SIGN_IN_PER_ADDRESS", "30"),
        ];
        servers.push(Server::start_with(SERVER, &db, &env).await);
    }
    let front = Api::new(&format!("http://127.0.0.1:{}", cluster.web_port));
    checkout_testkit::wait_until(
        "HAProxy reaches the checkouts",
        std::time::Duration::from_secs(30),
        || async { front.get("/healthz").await.status == StatusCode::OK },
    )
    .await;
    // Thirty wrong sign-ins (each its own address, so that no account's limit speaks), round
    // robin over the two instances: each is refused for what it is.
    for i in 0..30 {
        let answer = front
            .sign_in(&format!("guess{i}@example.ru"), "not-it")
            .await;
        answer.assert_problem(401, "invalid_credentials");
    }
    // The thirty-first: the edge has counted all thirty, whichever instance took them.
    let past = front.sign_in("guess30@example.ru", "not-it").await;
    past.assert_problem(429, "too_many_requests");
    assert_eq!(past.header("retry-after"), Some("60"), "{}", past.body);
    // Elsewhere than sign-in, nothing is held back.
    assert_eq!(front.get("/healthz").await.status, StatusCode::OK);
    drop(servers);
}
