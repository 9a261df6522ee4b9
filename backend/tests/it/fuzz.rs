//! Schema-driven fuzz: Schemathesis (installed into `tools/venv` by the test command) reads the
//! server's own OpenAPI document and sends generated requests, valid and not, to every
//! operation of a real server over real SQLite and real PostgreSQL, each with the credential the
//! operation names and a fresh Idempotency-Key (`fuzz/checkout_hooks.py`). It checks that no
//! answer is a `5xx` and that every answer conforms to the document; afterwards the database's
//! invariants hold (money conserved, balances equal their ledgers).

use std::process::Command;

use crate::workspace;
use checkout_testkit::{Backend, Server, TestDb};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");
/// Examples per operation and phase: about half a minute per database here.
const MAX_EXAMPLES: &str = "60";

checkout_testkit::on_both_databases!(
    generated_requests_find_no_server_error_and_no_answer_off_the_schema
);

async fn generated_requests_find_no_server_error_and_no_answer_off_the_schema(backend: Backend) {
    let schemathesis = workspace().join("tools/venv/bin/st");
    assert!(
        schemathesis.exists(),
        "{} is missing: scripts/test installs Schemathesis into tools/venv",
        schemathesis.display()
    );
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка для фаззинга").await;
    let shopper = server.api().shopper_token().await;
    let shop_key = shop.api.token.clone().expect("a shop has a secret key");

    let run = Command::new(&schemathesis)
        .current_dir(workspace().join("backend/tests/it/fuzz"))
        .env("PYTHONPATH", ".")
        .env("SCHEMATHESIS_HOOKS", "checkout_hooks")
        .env("FUZZ_SHOP_KEY", &shop_key)
        .env("FUZZ_SHOPPER_TOKEN", &shopper)
        .args([
            "run",
            &format!("{}/api/openapi.json", server.base),
            "--url",
            &server.base,
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            "20261203",
            "--no-color",
        ])
        .output()
        .expect("Schemathesis runs");
    let report = String::from_utf8_lossy(&run.stdout);
    // The summary, for whoever reads the test's output (`--nocapture`).
    let summary = report
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect::<Vec<_>>()
        .join("\n");
    println!("{backend:?}:\n{summary}");
    assert!(
        run.status.success(),
        "{backend:?}: Schemathesis found failures:\n{report}\n{}\n--- server log ---\n{}",
        String::from_utf8_lossy(&run.stderr),
        server.log()
    );
    assert!(
        report.contains("Tested: 31"),
        "every operation but the document's own was exercised:\n{report}"
    );
    assert!(!server.log().contains("panicked"), "{}", server.log());
    db.assert_invariants().await;
}
