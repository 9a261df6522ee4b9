//! Running the server: several instances on one PostgreSQL, graceful shutdown, bad settings.

use checkout_testkit as support;

/// The server under test: this package's own binary.
const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use futures::future::join_all;
use reqwest::StatusCode;
use support::{Api, Backend, OPENING_BALANCE, Server, TestDb, new_key, pay_session};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sharing_postgres_execute_each_key_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let (one, two) = (
        Server::start(SERVER, &db).await,
        Server::start(SERVER, &db).await,
    );
    let shopper = one.api().shopper().await;
    let via = [shopper.clone(), shopper.on(&two)];
    let shop = two.add_shop("Лавка").await;

    // 64 copies of one request, alternating between the instances.
    let key = new_key();
    let body = shop.checkout("ord-split", 7_000).await;
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
    let mut bodies = Vec::new();
    for i in 0..30 {
        bodies.push(shop.checkout(&format!("ord-{i}"), 1_000).await);
    }
    let results = join_all(bodies.into_iter().map(|body| {
        let via = via.clone();
        async move {
            let key = new_key();
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
    assert_eq!(shop.balance().await, 7_000 + 30 * 1_000);
    db.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_the_server_cleanly() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let mut server = Server::start(SERVER, &db).await;
        let shopper = server.api().shopper().await;
        let body = server.add_shop("Лавка").await.checkout("ord-t", 100).await;
        assert_eq!(
            shopper.pay(&new_key(), &body).await.status,
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
    for url in [
        format!("postgres://checkout:secret@127.0.0.1:{port}/checkout"),
        format!("postgres://checkout@127.0.0.1:{port}/checkout?password=secret"),
        format!(
            "postgres://127.0.0.1:{port}/checkout?user=checkout&sslpassword=secret&password=secret"
        ),
    ] {
        let out = run_server(&[("DATABASE_URL", &url)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("cannot open the database"), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            !stderr.contains("secret"),
            "the password is never printed: {stderr}"
        );
    }
}

/// The server a user builds carries no test or benchmark code, however the workspace is built:
/// this binary was built together with the e2e, bench and reliability crates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shipped_server_has_no_bench_route_and_no_fault_hooks() {
    let mut binaries = vec![std::path::PathBuf::from(SERVER)];
    let release =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/checkout-server");
    if release.exists() {
        binaries.push(release);
    }
    for binary in &binaries {
        let bytes = std::fs::read(binary).unwrap();
        for needle in [
            "/api/bench/unkeyed-payments",
            "CHECKOUT_FAULTS",
            "drop_after_commit",
        ] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{} contains {needle:?}",
                binary.display()
            );
        }
    }

    let db = TestDb::new(Backend::Sqlite).await;
    let every_fault = "in_flight_claims=5,fail_before_commit=5,fail_after_commit=5,\
                       drop_after_commit=5,delay_after_commit_ms=10000";
    let server = Server::start_with(SERVER, &db, &[("CHECKOUT_FAULTS", every_fault)]).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка").await;
    let body = shop.checkout("ord-f", 100).await;
    let unkeyed = shopper
        .send(shopper.post("/api/bench/unkeyed-payments", None, &body))
        .await
        .unwrap();
    unkeyed.assert_problem(404, "not_found");

    // Any of those faults would make the first answer a 409, a 503 or a cut connection.
    let key = new_key();
    let started = std::time::Instant::now();
    let first = shopper.pay(&key, &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "no injected delay"
    );
    assert!(!first.replayed());
    assert!(!server.log().contains("FAULT"), "{}", server.log());
    assert_eq!(shopper.balance().await, OPENING_BALANCE - 100);
    db.assert_invariants().await;
}

/// Every answer carries the security headers; the widget's page allows exactly its own inline
/// loader script, by hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pages_and_answers_carry_a_strict_security_policy() {
    let site = tempfile::tempdir().unwrap();
    let loader = "import init from '/widget.js';init('/widget_bg.wasm');";
    std::fs::write(
        site.path().join("index.html"),
        format!("<html><head><script type=\"module\">{loader}</script></head></html>"),
    )
    .unwrap();
    let db = TestDb::new(Backend::Sqlite).await;
    let static_dir = site.path().display().to_string();
    let server = Server::start_with(SERVER, &db, &[("CHECKOUT_STATIC_DIR", &static_dir)]).await;
    let api = server.api();
    let hash = {
        use base64::Engine;
        use sha2::Digest;
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(loader))
    };
    for path in ["/", "/healthz", "/api/account", "/api/nothing-here"] {
        let answer = api.get(path).await;
        let policy = answer
            .headers
            .get("content-security-policy")
            .cloned()
            .unwrap_or_default();
        for directive in [
            "default-src 'none'",
            "frame-ancestors 'none'",
            "connect-src 'self'",
            "'wasm-unsafe-eval'",
            &format!("'sha256-{hash}'"),
        ] {
            assert!(
                policy.contains(directive),
                "{path}: {directive} missing from {policy:?}"
            );
        }
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        assert_eq!(
            answer
                .headers
                .get("x-content-type-options")
                .map(String::as_str),
            Some("nosniff")
        );
        assert_eq!(
            answer.headers.get("x-frame-options").map(String::as_str),
            Some("DENY")
        );
    }
}

/// SQLite is one process's file: a second server on it exits at once, naming the file, and the
/// first one goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_server_on_the_same_sqlite_file_is_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let first = Server::start(SERVER, &db).await;
    let shopper = first.api().shopper().await;
    let body = first.add_shop("Лавка").await.checkout("ord-1", 100).await;

    let out = run_server(&[("DATABASE_URL", &db.url)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second server must not start");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let file = db.url.trim_start_matches("sqlite://");
    assert!(stderr.contains(file), "names the file: {stderr}");
    assert!(
        stderr.contains("in use by another checkout-server"),
        "{stderr}"
    );

    let paid = shopper.pay(&new_key(), &body).await;
    assert_eq!(paid.status, StatusCode::CREATED, "the first server goes on");
    drop(first);
    let next = Server::start(SERVER, &db).await;
    assert_eq!(shopper.on(&next).balance().await, OPENING_BALANCE - 100);
}

/// A database the v1 server wrote (a shopper paid an order and refunded part of it, money that
/// went to nobody) is migrated at start: the payment and refund get their counterpart on a
/// system account, so every invariant of double entry holds, and the shopper still sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_v1_database_keeps_its_money_through_the_migration_to_shops() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let dir = tempfile::tempdir().unwrap();
        let folder = match backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres | Backend::PgBouncer => "postgres",
        };
        for file in ["0001_checkout.sql", "0002_key_request_body.sql"] {
            let from = format!(
                "{}/../migrations/{folder}/{file}",
                env!("CARGO_MANIFEST_DIR")
            );
            std::fs::copy(from, dir.path().join(file)).unwrap();
        }
        let v1 = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
        // The v1 server made the file; here the test does.
        let url = match backend {
            Backend::Sqlite => format!("{}?mode=rwc", db.url),
            Backend::Postgres | Backend::PgBouncer => db.url.clone(),
        };
        let mut conn: sqlx::AnyConnection = sqlx::Connection::connect(&url).await.unwrap();
        v1.run(&mut conn).await.unwrap();
        drop(conn);
        let token = "tok_from_v1";
        let token_hash = checkout_backend::operations::authentication::token_hash(token);
        for statement in [
            format!(
                "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at) \
                 VALUES ('acc_v1', '{token_hash}', 'RUB', 80000, 0)"
            ),
            "INSERT INTO ledger (account_id, amount, kind, created_at) VALUES ('acc_v1', 100000, 'opening', 0)".into(),
            "INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, created_at) \
             VALUES ('acc_v1', -30000, 'payment', 'k1', 'c1', 'pay_0123456789abcdef0123456789abcdef', 1)".into(),
            "INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) \
             VALUES ('acc_v1', 10000, 'refund', 'k2', 'c2', 'pay_0123456789abcdef0123456789abcdef', 'ref_0123456789abcdef0123456789abcdef', 2)".into(),
            "INSERT INTO payments (payment_id, account_id, order_id, amount, currency, refunded, balance_after, idempotency_key, created_at) \
             VALUES ('pay_0123456789abcdef0123456789abcdef', 'acc_v1', 'ORD-1', 30000, 'RUB', 10000, 70000, 'k1', 1)".into(),
            "INSERT INTO refunds (refund_id, payment_id, amount, refunded_total_after, balance_after, idempotency_key, created_at) \
             VALUES ('ref_0123456789abcdef0123456789abcdef', 'pay_0123456789abcdef0123456789abcdef', 10000, 10000, 80000, 'k2', 2)".into(),
        ] {
            db.execute(&statement).await;
        }

        let server = Server::start(SERVER, &db).await;
        db.assert_invariants().await;
        assert_eq!(
            db.scalar("SELECT balance FROM accounts WHERE account_id = 'acc_before_shops'")
                .await,
            20_000,
            "{backend:?}: the counterpart holds what left the shopper"
        );
        let shopper = support::Api {
            token: Some(token.into()),
            ..server.api()
        };
        assert_eq!(shopper.balance().await, 80_000);
        let details = shopper
            .get("/api/payments/pay_0123456789abcdef0123456789abcdef")
            .await;
        assert_eq!(details.status, StatusCode::OK, "{}", details.body);
        let details = details.json();
        assert_eq!(details["amount"], 30_000);
        assert_eq!(details["refunded_total"], 10_000);
        assert_eq!(details["refunds"].as_array().unwrap().len(), 1);
    }
}

/// SQLite rolls a whole transaction back by itself when the file cannot grow (a full disk; here
/// the file's size cap): a batch of concurrent payments sharing one commit is lost with it. Each
/// of them is told so truly: every `201` is in the database, every `503` left nothing (no
/// payment, no key), and the books balance. Seen before the fix: the units after the failing one
/// ran outside any transaction and committed on their own, while all were answered `503`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_sqlite_file_loses_whole_batches_and_says_so_truly() {
    let db = TestDb::new(Backend::Sqlite).await;
    let mut server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка").await;
    let api = server.api();
    let shoppers = join_all((0..8).map(|_| api.shopper())).await;
    let mut sessions = Vec::new();
    for n in 0..240 {
        sessions.push(shop.session(&format!("ORD-FULL-{n}"), 100).await);
    }
    assert!(server.terminate().success());
    // The file may grow by a little: a few dozen payments' worth.
    let (pages, page_size) = (
        db.scalar("SELECT page_count FROM pragma_page_count()")
            .await,
        db.scalar("SELECT page_size FROM pragma_page_size()").await,
    );
    let cap_kib = (pages * page_size / 1024 + 64).to_string();
    let server = Server::start_with(
        SERVER,
        &db,
        &[("CHECKOUT_SQLITE_MAX_SIZE_KIB", cap_kib.as_str())],
    )
    .await;
    let shoppers: Vec<Api> = shoppers.iter().map(|s| s.on(&server)).collect();
    let answers = join_all(sessions.iter().enumerate().map(|(n, session)| {
        let (shopper, key) = (shoppers[n % shoppers.len()].clone(), new_key());
        async move {
            let answer = shopper.pay(&key, &pay_session(session)).await;
            (key, answer)
        }
    }))
    .await;
    let (mut paid, mut refused) = (0, 0);
    for (key, answer) in &answers {
        let payments = db
            .scalar(&format!(
                "SELECT COUNT(*) FROM payments WHERE idempotency_key = '{key}'"
            ))
            .await;
        let keys = db
            .scalar(&format!(
                "SELECT COUNT(*) FROM idempotency_keys WHERE idempotency_key = '{key}'"
            ))
            .await;
        match answer.status {
            StatusCode::CREATED => {
                paid += 1;
                assert_eq!((payments, keys), (1, 1), "a 201 is in the database");
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                refused += 1;
                answer.assert_problem(503, "service_unavailable");
                assert_eq!(
                    (payments, keys),
                    (0, 0),
                    "a 503 left nothing: {}",
                    answer.body
                );
            }
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }
    assert!(
        paid > 0 && refused > 0,
        "the file filled up: {paid} paid, {refused} refused"
    );
    db.assert_invariants().await;
}

/// Behind PgBouncer in transaction mode the server does not migrate (sqlx's migrator holds a
/// session's advisory lock, which such a pooler cannot keep): on a schema not brought up to date
/// it refuses to start with one line saying what to run; `checkout-server migrate` on
/// PostgreSQL itself brings it up, and then the server starts through the bouncer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_transaction_pooler_the_schema_is_migrated_by_the_operator() {
    let direct = support::postgres::cluster().create_database().await;
    let through = support::pgbouncer::bouncer().url_of(&direct);
    let url = through.clone();
    let out = tokio::task::spawn_blocking(move || {
        run_server(&[
            ("DATABASE_URL", url.as_str()),
            ("CHECKOUT_DB_POOLER", "transaction"),
        ])
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("schema is at version none")
            && stderr.contains("run `checkout-server migrate`"),
        "{stderr}"
    );

    let migrate = std::process::Command::new(SERVER)
        .arg("migrate")
        .env("DATABASE_URL", &direct)
        .output()
        .unwrap();
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&migrate.stdout).trim(),
        // The last migration's number: one a migration, numbered from 1.
        format!(
            r#"{{"schema_version":{}}}"#,
            checkout_backend::store::postgres_migrations().count()
        )
    );
    let db = TestDb::at(direct).served_through(through);
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка за пулером").await;
    let shopper = server.api().shopper().await;
    let session = shop.session("P-1", 10_000).await;
    let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    db.assert_invariants().await;
}

/// A connection that lands on a read-only server (a standby, during a failover or before a
/// proxy's first health check): the write is refused by the database, and the checkout says
/// `503` with `Retry-After` (retry with the same key), as for any database that cannot take
/// writes now, never `500`. Nothing moves; writable again, the same key pays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_that_lands_on_a_read_only_server_is_unavailable_not_an_error() {
    let db = TestDb::new(Backend::Postgres).await;
    let server = Server::start(SERVER, &db).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка").await;
    let body = shop.checkout("ord-standby", 7_000).await;
    let database = db.url.rsplit('/').next().unwrap().to_owned();
    // The settings are changed from another database of the cluster (this one turns read-only).
    let admin = TestDb::at(db.url.replace(&format!("/{database}"), "/postgres"));
    // Every connection the server has is cut; every new one is read-only, as a standby's.
    admin
        .execute(&format!(
            "ALTER DATABASE {database} SET default_transaction_read_only = on"
        ))
        .await;
    admin
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'"
        ))
        .await;
    let key = new_key();
    let mut refused = None;
    // The first attempts may meet the cut connections (also `503`); then a read-only one.
    for _ in 0..5 {
        let answer = shopper.pay(&key, &body).await;
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            answer.body
        );
        assert_eq!(answer.header("retry-after"), Some("1"), "{}", answer.body);
        refused = Some(answer);
    }
    refused.unwrap().assert_problem(503, "service_unavailable");
    assert!(
        server.log().contains("read-only transaction"),
        "the writes met a read-only server"
    );
    admin
        .execute(&format!(
            "ALTER DATABASE {database} SET default_transaction_read_only = off"
        ))
        .await;
    admin
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'"
        ))
        .await;
    // The first attempt may meet a cut connection again.
    let mut paid = shopper.pay(&key, &body).await;
    for _ in 0..5 {
        if paid.status != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        paid = shopper.pay(&key, &body).await;
    }
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    db.assert_invariants().await;
}
