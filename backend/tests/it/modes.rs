//! Test money and live money, and the three principals: a shop (a secret key per mode), a test
//! shopper (anyone; test money; test sessions only) and a live shopper (signs up and in; money
//! only from the operator's keyed deposit; live sessions only). Real server, both databases;
//! each scenario ends with the invariants, money conserved per mode.

use checkout_testkit as support;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Api, Backend, OPENING_BALANCE, Server, TestDb, new_key, pay_session};

checkout_testkit::on_both_databases!(
    a_live_shopper_signs_up_is_funded_once_and_pays_a_live_session,
    test_and_live_money_never_mix,
    sign_in_guessing_is_throttled_and_the_wait_is_honoured,
    test_shoppers_are_limited_per_address,
    a_principal_holds_a_bounded_number_of_keys_in_progress,
    sign_ins_that_ended_are_refused_and_swept,
    a_sign_up_is_an_account_only_once_its_code_comes_back,
    a_taken_address_answers_exactly_as_a_new_one,
    a_code_expires_and_locks_after_its_tries,
    recovery_sets_a_new_password_and_ends_every_old_sign_in,
    a_shopper_from_before_codes_is_neither_funded_nor_paid_for_until_confirmed,
    a_passwordless_account_opens_only_by_code_or_passkey,
    a_passkey_answer_is_checked_and_its_ceremony_used_once,
    the_owners_password_is_not_held_back_by_a_guesser_elsewhere,
    a_rolled_key_stops_at_once_on_every_instance_unless_an_overlap_is_asked,
);

/// The server's resident memory, in KiB (Linux: `VmRSS` of `/proc/<pid>/status`).
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The peak of the server's resident memory, in KiB (`VmHWM`).
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Sixty sign-ins at once (each an Argon2id check of 19 MiB): the server runs only as many
/// at a time as it has cores, so its memory peaks at a few of them, not at sixty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn argon2_work_is_bounded_however_many_sign_ins_come_at_once() {
    let db = TestDb::new(Backend::Sqlite).await;
    let server =
        Server::start_with(SERVER, &db, &[("CHECKOUT_SIGN_IN_PER_ADDRESS", "10000")]).await;
    let api = server.api();
    api.sign_in("warm@example.ru", PASSWORD).await;
    let before = peak_kib(server.pid());
    let answers = join_all((0..60).map(|i| {
        let api = api.clone();
        async move { api.sign_in(&format!("n{i}@example.ru"), PASSWORD).await }
    }))
    .await;
    for answer in &answers {
        answer.assert_problem(401, "invalid_credentials");
    }
    let grown = peak_kib(server.pid()).saturating_sub(before);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(
        grown < (cores + 2) * 20 * 1024,
        "the peak grew by {grown} KiB for {cores} cores"
    );
}

/// Thirty sign-ins (the per-address allowance) with a 1 MB e-mail each: refused, and the
/// limiter keeps no copy of those e-mails (it kept each, 30 MB that never came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_emails_leave_nothing_behind_in_the_limiter() {
    let db = TestDb::new(Backend::Sqlite).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    // Warm up: the allocator's and the runtime's first growth is not the limiter's.
    for i in 0..3 {
        api.sign_in(&format!("warm{i}@example.ru"), PASSWORD).await;
    }
    let before = resident_kib(server.pid());
    for i in 0..30 {
        let email = format!("{i}{}@example.ru", "x".repeat(1_000_000));
        let answer = api.sign_in(&email, PASSWORD).await;
        assert!(answer.status.is_client_error(), "{}", answer.status);
    }
    let grown = resident_kib(server.pid()).saturating_sub(before);
    assert!(grown < 10_240, "the server grew by {grown} KiB and kept it");
}

const PASSWORD: &str = "correct horse battery";

fn events_of(answer: &support::Answer) -> Vec<Value> {
    answer.json()["events"].as_array().unwrap().clone()
}

async fn a_live_shopper_signs_up_is_funded_once_and_pays_a_live_session(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Живая лавка").await;
    let live = server.api().live_shopper("Anna@Example.ru", PASSWORD).await;
    let account = live.get("/api/account").await;
    assert_eq!(account.status, StatusCode::OK);
    assert_eq!(account.json()["balance"], 0);
    assert_eq!(account.json()["livemode"], true);
    assert_eq!(account.json()["email"], "anna@example.ru");

    // The operator funds it: the same key twice is one deposit; another amount under it is
    // refused; an unknown e-mail is refused.
    let key = new_key();
    let (ok, first) = server.deposit("anna@example.ru", 150_000, &key).await;
    assert!(ok, "{first}");
    assert_eq!(first["balance"], 150_000);
    assert_eq!(first["replayed"], false);
    let (ok, again) = server.deposit("ANNA@example.ru ", 150_000, &key).await;
    assert!(ok, "{again}");
    assert_eq!(again["replayed"], true);
    assert_eq!(again["deposit_id"], first["deposit_id"]);
    let (ok, other) = server.deposit("anna@example.ru", 999, &key).await;
    assert!(!ok, "another amount under the key: {other}");
    assert!(other.as_str().unwrap().contains("amount"), "{other}");
    let (ok, nobody) = server.deposit("nobody@example.ru", 100, &new_key()).await;
    assert!(
        !ok && nobody.as_str().unwrap().contains("no live shopper"),
        "{nobody}"
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM deposits").await, 1);
    let (ok, shown, err) = server
        .operator(&["shopper", "show", "--email", "anna@example.ru"])
        .await;
    assert!(ok, "{err}");
    let shown: Value = serde_json::from_str(shown.trim()).unwrap();
    assert_eq!(shown["balance"], 150_000);
    assert_eq!(shown["livemode"], true);

    // A sign-in elsewhere; it pays a live session: one debit, the shop credited, live events.
    let signed_in = server.api().sign_in("anna@example.ru", PASSWORD).await;
    assert_eq!(signed_in.status, StatusCode::OK, "{}", signed_in.body);
    let live = Api {
        token: Some(signed_in.json()["token"].as_str().unwrap().to_owned()),
        ..server.api()
    };
    let made = shop
        .live_api
        .send(shop.live_api.post(
            "/api/checkout-sessions",
            Some(&new_key()),
            &json!({"order_id": "LIVE-1", "amount": 40_000}),
        ))
        .await
        .unwrap();
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(made.json()["livemode"], true);
    let session = made.json()["session_id"].as_str().unwrap().to_owned();
    let key = new_key();
    let paid = live.pay(&key, &pay_session(&session)).await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    assert_eq!(paid.json()["livemode"], true);
    assert_eq!(paid.json()["balance"], 110_000);
    assert!(live.pay(&key, &pay_session(&session)).await.replayed());
    let shop_account = shop.live_api.get("/api/account").await;
    assert_eq!(shop_account.json()["balance"], 40_000);
    assert_eq!(shop_account.json()["livemode"], true);
    let events = shop.live_api.get("/api/events").await;
    let events = events_of(&events);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["body"]["type"], "payment.succeeded");
    assert_eq!(events[0]["body"]["livemode"], true);
    assert_eq!(events[0]["body"]["data"]["livemode"], true);

    // «Выйти»: that token stops working at once; the other sign-in does not.
    let out = live
        .send(live.post("/api/shoppers/sign-out", None, &json!({})))
        .await
        .unwrap();
    assert_eq!(out.status, StatusCode::NO_CONTENT, "{}", out.body);
    let after = live.get("/api/account").await;
    after.assert_problem(401, "unauthorized");
    db.assert_invariants().await;
}

async fn test_and_live_money_never_mix(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка двух режимов").await;
    let tester = server.api().shopper().await;
    let live = server
        .api()
        .live_shopper("boris@example.ru", PASSWORD)
        .await;
    let (ok, deposit) = server.deposit("boris@example.ru", 50_000, &new_key()).await;
    assert!(ok, "{deposit}");
    let test_session = shop.session("ORD-TEST", 10_000).await;
    let live_session = {
        let made = shop
            .live_api
            .send(shop.live_api.post(
                "/api/checkout-sessions",
                Some(&new_key()),
                &json!({"order_id": "ORD-LIVE", "amount": 20_000}),
            ))
            .await
            .unwrap();
        made.json()["session_id"].as_str().unwrap().to_owned()
    };
    let public = tester
        .get(&format!("/api/checkout-sessions/{test_session}"))
        .await;
    assert_eq!(public.json()["livemode"], false);

    // Across modes: a clear 403, nothing stored under the key, no money moved, still open.
    for (payer, session) in [(&tester, &live_session), (&live, &test_session)] {
        let key = new_key();
        let refused = payer.pay(&key, &pay_session(session)).await;
        refused.assert_problem(403, "livemode_mismatch");
        let status = payer.get(&format!("/api/idempotency-keys/{key}")).await;
        assert_eq!(
            status.status,
            StatusCode::NOT_FOUND,
            "nothing kept under the key"
        );
        let view = payer
            .get(&format!("/api/checkout-sessions/{session}"))
            .await;
        assert_eq!(view.json()["status"], "open");
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, 0);
    let balance = |api: &Api| {
        let api = api.clone();
        async move { api.get("/api/account").await.json()["balance"].clone() }
    };
    assert_eq!(balance(&tester).await, OPENING_BALANCE);
    assert_eq!(balance(&live).await, 50_000);

    // Each pays its own mode's session; the shop refunds the live one in part.
    let paid_test = tester.pay(&new_key(), &pay_session(&test_session)).await;
    assert_eq!(paid_test.status, StatusCode::CREATED, "{}", paid_test.body);
    let paid_live = live.pay(&new_key(), &pay_session(&live_session)).await;
    assert_eq!(paid_live.status, StatusCode::CREATED, "{}", paid_live.body);
    let live_payment = paid_live.json()["payment_id"].as_str().unwrap().to_owned();
    // The test key cannot see or refund the live payment.
    let foreign = shop
        .api
        .send(shop.api.post(
            &format!("/api/payments/{live_payment}/refunds"),
            Some(&new_key()),
            &json!({"amount": 1_000}),
        ))
        .await
        .unwrap();
    foreign.assert_problem(404, "not_found");
    let refund = shop
        .live_api
        .send(shop.live_api.post(
            &format!("/api/payments/{live_payment}/refunds"),
            Some(&new_key()),
            &json!({"amount": 5_000}),
        ))
        .await
        .unwrap();
    assert_eq!(refund.status, StatusCode::CREATED, "{}", refund.body);
    assert_eq!(refund.json()["livemode"], true);

    // Events never cross: each key lists its own mode's, each says so.
    let test_events = events_of(&shop.api.get("/api/events").await);
    let live_events = events_of(&shop.live_api.get("/api/events").await);
    let types = |events: &[Value]| {
        events
            .iter()
            .map(|e| {
                (
                    e["body"]["type"].as_str().unwrap().to_owned(),
                    e["body"]["livemode"].as_bool().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        types(&test_events),
        vec![("payment.succeeded".to_owned(), false)]
    );
    assert_eq!(
        types(&live_events),
        vec![
            ("refund.succeeded".to_owned(), true),
            ("payment.succeeded".to_owned(), true)
        ]
    );
    let test_event = &test_events[0]["event_id"];
    let cross = shop
        .live_api
        .get(&format!("/api/events/{}", test_event.as_str().unwrap()))
        .await;
    assert_eq!(cross.status, StatusCode::NOT_FOUND);
    db.assert_invariants().await;
}

async fn sign_in_guessing_is_throttled_and_the_wait_is_honoured(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_SIGN_IN_PER_ACCOUNT", "3"),
            ("CHECKOUT_LIMIT_WINDOW_SECS", "3"),
        ],
    )
    .await;
    let api = server.api();
    api.live_shopper("vera@example.ru", PASSWORD).await; // right guesses: they do not count
    // Four guesses at once: three fit the allowance of wrong ones (each counted before it is
    // checked), the fourth waits.
    let guesses = join_all((0..4).map(|_| api.sign_in("vera@example.ru", "wrong password"))).await;
    let mut throttled = None;
    for guess in &guesses {
        match guess.status.as_u16() {
            401 => guess.assert_problem(401, "invalid_credentials"),
            _ => {
                guess.assert_problem(429, "too_many_requests");
                throttled = Some(guess);
            }
        }
    }
    let refused = guesses.iter().filter(|g| g.status.as_u16() == 429).count();
    assert_eq!(refused, 1, "{refused} of 4 guesses refused");
    let wait: u64 = throttled
        .expect("a refused guess")
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=3).contains(&wait), "Retry-After: {wait}");
    // Another account is not held back by this one's guesses.
    api.live_shopper("gleb@example.ru", PASSWORD).await;
    // After the wait it says, the right password works.
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let after = api.sign_in("vera@example.ru", PASSWORD).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    db.assert_invariants().await;
}

async fn test_shoppers_are_limited_per_address(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server =
        Server::start_with(SERVER, &db, &[("CHECKOUT_TEST_SHOPPERS_PER_ADDRESS", "2")]).await;
    let api = server.api();
    for _ in 0..2 {
        api.shopper().await;
    }
    let refused = api
        .send(api.post("/api/test/shoppers", None, &json!({})))
        .await
        .unwrap();
    refused.assert_problem(429, "too_many_requests");
    assert!(refused.header("retry-after").is_some());
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM accounts WHERE kind = 'shopper'")
            .await,
        2
    );
    db.assert_invariants().await;
}

async fn a_principal_holds_a_bounded_number_of_keys_in_progress(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(SERVER, &db, &[("CHECKOUT_KEYS_IN_PROGRESS", "1")]).await;
    let shopper = server.api().shopper().await;
    let shop = server.add_shop("Лавка").await;
    let mut sessions = Vec::new();
    for n in 0..48 {
        sessions.push(shop.session(&format!("ORD-{n}"), 100).await);
    }
    let answers = join_all(sessions.iter().map(|session| {
        let shopper = shopper.clone();
        async move { shopper.pay(&new_key(), &pay_session(session)).await }
    }))
    .await;
    let paid = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count() as i64;
    let mut refused = 0;
    for answer in &answers {
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            answer.assert_problem(429, "too_many_requests");
            assert_eq!(answer.header("retry-after"), Some("1"));
            refused += 1;
        } else {
            assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        }
    }
    assert!(refused > 0 && paid > 0, "{paid} paid, {refused} refused");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, paid);
    let balance = shopper.get("/api/account").await;
    assert_eq!(balance.json()["balance"], OPENING_BALANCE - 100 * paid);
    db.assert_invariants().await;
}

/// A sign-in unused for the idle limit is refused, like a revoked one; the sweeper deletes both
/// rows, and keeps the one in use.
async fn sign_ins_that_ended_are_refused_and_swept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_SHOPPER_IDLE_SECS", "3"),
            ("CHECKOUT_SWEEP_SECS", "1"),
        ],
    )
    .await;
    let api = server.api();
    let idle = api.live_shopper("idle@example.ru", PASSWORD).await;
    let revoked = api.live_shopper("out@example.ru", PASSWORD).await;
    let out = revoked
        .send(revoked.post("/api/shoppers/sign-out", None, &json!({})))
        .await
        .unwrap();
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    revoked
        .get("/api/account")
        .await
        .assert_problem(401, "unauthorized");
    // The idle one outlives its limit unused: refused, and both rows go.
    support::wait_until(
        "the idle sign-in is refused",
        Duration::from_secs(10),
        || {
            let idle = idle.clone();
            async move { idle.get("/api/account").await.status == StatusCode::UNAUTHORIZED }
        },
    )
    .await;
    let active = api.live_shopper("active@example.ru", PASSWORD).await;
    support::wait_until("ended sign-ins are swept", Duration::from_secs(10), || {
        let db = &db;
        async move { db.scalar("SELECT COUNT(*) FROM sign_ins").await == 1 }
    })
    .await;
    assert_eq!(active.get("/api/account").await.status, StatusCode::OK);
    db.assert_invariants().await;
}

/// A wrong password and an unknown e-mail cost the same: medians of 50 tries each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_email_takes_as_long_as_a_wrong_password() {
    let db = TestDb::new(Backend::Sqlite).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    api.live_shopper("dina@example.ru", PASSWORD).await;
    let mut wrong = Vec::new();
    let mut unknown = Vec::new();
    for n in 0..50 {
        // Interleaved, so that the machine's noise falls on both alike.
        for (email, times) in [
            ("dina@example.ru".to_owned(), &mut wrong),
            (format!("nobody{n}@example.ru"), &mut unknown),
        ] {
            let started = Instant::now();
            api.sign_in(&email, "not the password")
                .await
                .assert_problem(401, "invalid_credentials");
            times.push(started.elapsed());
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (wrong, unknown) = (median(&mut wrong), median(&mut unknown));
    let ratio = unknown.as_secs_f64() / wrong.as_secs_f64();
    eprintln!("median wrong password {wrong:?}, unknown e-mail {unknown:?}: {ratio:.2}");
    assert!(
        (0.5..2.0).contains(&ratio),
        "wrong password {wrong:?}, unknown e-mail {unknown:?}"
    );
}

/// Live money and the e-mail it belongs to: after a sign-up nothing exists but a code in the
/// address's mailbox. Until it is entered, the operator's deposit to that address is refused
/// and moves nothing; a wrong code is refused; the right one makes the account, signed in, and
/// only then can it be funded (by e-mail or by account id) and pay.
async fn a_sign_up_is_an_account_only_once_its_code_comes_back(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    let email = "lena@example.ru";
    let code = api.sign_up(email, PASSWORD).await;
    assert_eq!(db.scalar("SELECT COUNT(*) FROM shoppers").await, 0);
    let kept = db.scalar_text("SELECT code_hash FROM email_codes").await;
    assert!(
        kept.starts_with("$argon2id$") && !kept.contains(&code),
        "{kept}"
    );

    let (ok, refused) = server.deposit(email, 50_000, &new_key()).await;
    assert!(
        !ok,
        "a deposit to an address that is not confirmed: {refused}"
    );
    assert!(
        refused.as_str().unwrap().contains("no live shopper"),
        "{refused}"
    );
    let wrong = if code == "000000" { "111111" } else { "000000" };
    api.confirm(email, wrong)
        .await
        .assert_problem(400, "invalid_code");
    api.sign_in(email, PASSWORD)
        .await
        .assert_problem(401, "invalid_credentials");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM deposits").await, 0);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'deposit'")
            .await,
        0
    );
    db.assert_invariants().await;

    let confirmed = api.confirm(email, &code).await;
    assert_eq!(confirmed.status, StatusCode::CREATED, "{}", confirmed.body);
    let account_id = confirmed.json()["account_id"].as_str().unwrap().to_owned();
    let shopper = Api {
        token: Some(confirmed.json()["token"].as_str().unwrap().to_owned()),
        ..api.clone()
    };
    assert_eq!(shopper.get("/api/account").await.json()["balance"], 0);
    // The code is used: it makes nothing twice.
    api.confirm(email, &code)
        .await
        .assert_problem(400, "invalid_code");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM email_codes").await, 0);

    let (ok, by_account, err) = server
        .operator(&[
            "shopper",
            "deposit",
            "--account",
            &account_id,
            "--amount",
            "70000",
            "--key",
            &new_key(),
        ])
        .await;
    assert!(ok, "{err}");
    let by_account: Value = serde_json::from_str(by_account.trim()).unwrap();
    assert_eq!(by_account["balance"], 70_000);
    assert_eq!(by_account["email"], email);
    let (ok, by_email) = server.deposit(email, 30_000, &new_key()).await;
    assert!(ok, "{by_email}");
    assert_eq!(by_email["account_id"], account_id.as_str());
    assert_eq!(shopper.get("/api/account").await.json()["balance"], 100_000);
    db.assert_invariants().await;
}

/// Signing up with an address that has an account tells nothing to the one who asks: the same
/// status and body as for a new address. The mail goes to the owner, says an account exists,
/// carries no code; the owner's password and money are untouched, the asker's password opens
/// nothing.
async fn a_taken_address_answers_exactly_as_a_new_one(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    let owner = api.live_shopper("anna@example.ru", PASSWORD).await;
    let ask = |email: &'static str| {
        let api = api.clone();
        async move {
            api.send(api.post(
                "/api/shoppers",
                None,
                &json!({"email": email, "password": "the intruder's password"}),
            ))
            .await
            .unwrap()
        }
    };
    let mut taken = None;
    let mail = api
        .mailed_after("anna@example.ru", async {
            taken = Some(ask("anna@example.ru").await);
        })
        .await;
    let taken = taken.unwrap();
    let fresh = ask("new@example.ru").await;
    assert_eq!(taken.status, StatusCode::ACCEPTED, "{}", taken.body);
    assert_eq!((taken.status, &taken.body), (fresh.status, &fresh.body));
    assert_eq!(taken.body, r#"{"status":"code_sent","expires_in":600}"#);
    assert_eq!(mail.subject, "У вас уже есть счёт");
    assert_eq!(mail.code(), None, "{mail:?}");
    // The owner's sign-in and password still work; the intruder's password opens nothing.
    assert_eq!(owner.get("/api/account").await.status, StatusCode::OK);
    assert_eq!(
        api.sign_in("anna@example.ru", PASSWORD).await.status,
        StatusCode::OK
    );
    api.sign_in("anna@example.ru", "the intruder's password")
        .await
        .assert_problem(401, "invalid_credentials");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM email_codes WHERE email = 'anna@example.ru'")
            .await,
        0
    );
    db.assert_invariants().await;
}

/// A code has five tries: after five wrong ones even the right code is refused. A code past its
/// ten minutes is refused. A new sign-up mails a fresh code, and that one works.
async fn a_code_expires_and_locks_after_its_tries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    let email = "oleg@example.ru";
    let code = api.sign_up(email, PASSWORD).await;
    let wrong = if code == "000000" { "111111" } else { "000000" };
    // Five wrong tries at once: each is counted, none is let through.
    let tries = join_all((0..5).map(|_| api.confirm(email, wrong))).await;
    for answer in &tries {
        answer.assert_problem(400, "invalid_code");
    }
    api.confirm(email, &code)
        .await
        .assert_problem(400, "invalid_code");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM shoppers").await, 0);

    let code = api.sign_up(email, PASSWORD).await;
    db.execute("UPDATE email_codes SET expires_at = 1").await;
    api.confirm(email, &code)
        .await
        .assert_problem(400, "invalid_code");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM shoppers").await, 0);

    let code = api.sign_up(email, PASSWORD).await;
    let confirmed = api.confirm(email, &code).await;
    assert_eq!(confirmed.status, StatusCode::CREATED, "{}", confirmed.body);
    db.assert_invariants().await;
}

/// Recovery: a code to the confirmed address, then a new password. Every earlier sign-in of the
/// account ends at once, the old password opens nothing, the new one does; the money stays. An
/// address with no account gets the same answer, and a mail with no code.
async fn recovery_sets_a_new_password_and_ends_every_old_sign_in(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    let email = "rita@example.ru";
    let first = api.live_shopper(email, PASSWORD).await;
    let (ok, deposit) = server.deposit(email, 20_000, &new_key()).await;
    assert!(ok, "{deposit}");
    let second = api.sign_in(email, PASSWORD).await;
    assert_eq!(second.status, StatusCode::OK);
    let second = Api {
        token: Some(second.json()["token"].as_str().unwrap().to_owned()),
        ..api.clone()
    };
    let ask = |email: &'static str| {
        let api = api.clone();
        async move {
            api.send(api.post("/api/shoppers/recovery", None, &json!({ "email": email })))
                .await
                .unwrap()
        }
    };
    let mut asked = None;
    let mail = api
        .mailed_after(email, async { asked = Some(ask(email).await) })
        .await;
    let asked = asked.unwrap();
    let nobody_mail = api
        .mailed_after("nobody@example.ru", async {
            let nobody = ask("nobody@example.ru").await;
            assert_eq!((nobody.status, &nobody.body), (asked.status, &asked.body));
        })
        .await;
    assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
    assert_eq!(nobody_mail.code(), None, "{nobody_mail:?}");
    let code = mail.code().expect("the recovery mail carries a code");

    let recover = |code: String, password: &'static str| {
        let api = api.clone();
        async move {
            api.send(api.post(
                "/api/shoppers/recovery/confirm",
                None,
                &json!({"email": email, "code": code, "password": password}),
            ))
            .await
            .unwrap()
        }
    };
    recover("999999".into(), "a new long password")
        .await
        .assert_problem(400, "invalid_code");
    let recovered = recover(code.clone(), "a new long password").await;
    assert_eq!(recovered.status, StatusCode::OK, "{}", recovered.body);
    for old in [&first, &second] {
        old.get("/api/account")
            .await
            .assert_problem(401, "unauthorized");
    }
    let now = Api {
        token: Some(recovered.json()["token"].as_str().unwrap().to_owned()),
        ..api.clone()
    };
    assert_eq!(now.get("/api/account").await.json()["balance"], 20_000);
    api.sign_in(email, PASSWORD)
        .await
        .assert_problem(401, "invalid_credentials");
    assert_eq!(
        api.sign_in(email, "a new long password").await.status,
        StatusCode::OK
    );
    recover(code, "yet another password")
        .await
        .assert_problem(400, "invalid_code");
    db.assert_invariants().await;
}

/// A live shopper made before e-mail codes (written here as the old server wrote it: no
/// confirmation) holds a sign-in. It cannot pay a live session, the operator cannot fund it by
/// e-mail or by account, its right password is told to confirm: clear refusals, nothing moved.
/// Signing up again with its address and entering the code confirms that very account (the new
/// password; the old sign-in ends).
async fn a_shopper_from_before_codes_is_neither_funded_nor_paid_for_until_confirmed(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Живая лавка").await;
    let api = server.api();
    let email = "old@example.ru";
    let hash = checkout_backend::operations::passwords::hash(PASSWORD.into())
        .await
        .unwrap();
    let token = "tok_live_from_before_codes";
    let token_hash = checkout_backend::operations::authentication::token_hash(token);
    for statement in [
        "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind, livemode) \
         VALUES ('acc_old', 'no token: signs in (acc_old)', 'RUB', 0, 0, 'shopper', 1)"
            .to_owned(),
        format!(
            "INSERT INTO shoppers (account_id, email, password_hash, created_at) \
             VALUES ('acc_old', '{email}', '{hash}', 0)"
        ),
        format!(
            "INSERT INTO sign_ins (token_hash, account_id, created_at, last_used_at) \
             VALUES ('{token_hash}', 'acc_old', {now}, {now})",
            now = checkout_backend::clock::now_ms()
        ),
    ] {
        db.execute(&statement).await;
    }
    let old = Api {
        token: Some(token.into()),
        ..api.clone()
    };
    let made = shop
        .live_api
        .send(shop.live_api.post(
            "/api/checkout-sessions",
            Some(&new_key()),
            &json!({"order_id": "OLD-1", "amount": 100}),
        ))
        .await
        .unwrap();
    let session = made.json()["session_id"].as_str().unwrap().to_owned();
    old.pay(&new_key(), &pay_session(&session))
        .await
        .assert_problem(403, "email_unconfirmed");
    old.get("/api/account")
        .await
        .assert_problem(403, "email_unconfirmed");
    api.sign_in(email, PASSWORD)
        .await
        .assert_problem(403, "email_unconfirmed");
    for by in [["--email", email], ["--account", "acc_old"]] {
        let (ok, out, err) = server
            .operator(&[
                "shopper",
                "deposit",
                by[0],
                by[1],
                "--amount",
                "100",
                "--key",
                &new_key(),
            ])
            .await;
        assert!(!ok, "{out}");
        assert!(err.contains("has not confirmed the e-mail"), "{err}");
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM deposits").await, 0);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, 0);
    db.assert_invariants().await;

    let code = api.sign_up(email, "a password of my own").await;
    let confirmed = api.confirm(email, &code).await;
    assert_eq!(confirmed.status, StatusCode::CREATED, "{}", confirmed.body);
    assert_eq!(confirmed.json()["account_id"], "acc_old");
    old.get("/api/account")
        .await
        .assert_problem(401, "unauthorized");
    let (ok, deposit) = server.deposit(email, 100, &new_key()).await;
    assert!(ok, "{deposit}");
    db.assert_invariants().await;
}

/// A sign-up with no password: the code makes the account (signed in, to make a passkey next),
/// and no password at all opens it. A recovery with no password ends every sign-in and starts
/// one (for a new passkey), and still no password opens it.
async fn a_passwordless_account_opens_only_by_code_or_passkey(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    let email = "vera@example.ru";
    let mail = api
        .mailed_after(email, async {
            let asked = api
                .send(api.post("/api/shoppers", None, &json!({ "email": email })))
                .await
                .unwrap();
            assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
        })
        .await;
    let confirmed = api.confirm(email, &mail.code().unwrap()).await;
    assert_eq!(confirmed.status, StatusCode::CREATED, "{}", confirmed.body);
    let first = Api {
        token: Some(confirmed.json()["token"].as_str().unwrap().to_owned()),
        ..api.clone()
    };
    assert_eq!(first.get("/api/account").await.json()["balance"], 0);
    assert_eq!(
        first.get("/api/shoppers/passkeys").await.json(),
        json!({"passkeys": []})
    );
    for guess in ["", "nopassword_", PASSWORD] {
        api.sign_in(email, guess)
            .await
            .assert_problem(401, "invalid_credentials");
    }

    let mail = api
        .mailed_after(email, async {
            let asked = api
                .send(api.post("/api/shoppers/recovery", None, &json!({ "email": email })))
                .await
                .unwrap();
            assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);
        })
        .await;
    let recovered = api
        .send(api.post(
            "/api/shoppers/recovery/confirm",
            None,
            &json!({"email": email, "code": mail.code().unwrap()}),
        ))
        .await
        .unwrap();
    assert_eq!(recovered.status, StatusCode::OK, "{}", recovered.body);
    first
        .get("/api/account")
        .await
        .assert_problem(401, "unauthorized");
    let now = Api {
        token: Some(recovered.json()["token"].as_str().unwrap().to_owned()),
        ..api.clone()
    };
    assert_eq!(now.get("/api/account").await.status, StatusCode::OK);
    api.sign_in(email, PASSWORD)
        .await
        .assert_problem(401, "invalid_credentials");
    db.assert_invariants().await;
}

/// The passkey ceremonies as a client that is not a browser would drive them: a challenge in
/// WebAuthn's JSON form; an answer that does not verify is `400 passkey_rejected`, and uses the
/// ceremony up (the right answer after it would find none); an unknown ceremony is refused the
/// same way. Registering is a live shopper's only; a test shopper is `403`, a stranger `401`.
async fn a_passkey_answer_is_checked_and_its_ceremony_used_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();
    let challenge = api
        .send(api.post("/api/shoppers/passkeys/authentication", None, &json!({})))
        .await
        .unwrap();
    assert_eq!(challenge.status, StatusCode::OK, "{}", challenge.body);
    let challenge = challenge.json();
    let options = &challenge["options"]["publicKey"];
    assert!(
        options["challenge"].as_str().unwrap().len() >= 43,
        "{options}"
    );
    assert_eq!(options["rpId"], "localhost");
    assert_eq!(options["userVerification"], "required");
    // A well-formed answer signed by no passkey anyone registered.
    let forged = json!({
        "id": "AAAA", "rawId": "AAAA", "type": "public-key",
        "response": {
            "clientDataJSON": "e30", "authenticatorData": "AAAA", "signature": "AAAA",
            "userHandle": "AAAAAAAAAAAAAAAAAAAAAA"
        },
        "clientExtensionResults": {}
    });
    let answer = |ceremony: Value| {
        let (api, forged) = (api.clone(), forged.clone());
        async move {
            api.send(api.post(
                "/api/shoppers/passkeys/sign-in",
                None,
                &json!({"ceremony_id": ceremony, "credential": forged}),
            ))
            .await
            .unwrap()
        }
    };
    answer(challenge["ceremony_id"].clone())
        .await
        .assert_problem(400, "passkey_rejected");
    let again = answer(challenge["ceremony_id"].clone()).await;
    again.assert_problem(400, "passkey_rejected");
    assert!(again.body.contains("expired or used"), "{}", again.body);
    answer(json!("pkc_unknown"))
        .await
        .assert_problem(400, "passkey_rejected");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM passkey_ceremonies").await,
        0
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM sign_ins").await, 0);

    let stranger = api.post("/api/shoppers/passkeys/registration", None, &json!({}));
    api.send(stranger)
        .await
        .unwrap()
        .assert_problem(401, "unauthorized");
    let test_shopper = Api {
        token: Some(api.shopper_token().await),
        ..api.clone()
    };
    test_shopper
        .send(test_shopper.post("/api/shoppers/passkeys/registration", None, &json!({})))
        .await
        .unwrap()
        .assert_problem(403, "forbidden");
    let live = api.live_shopper("pavel@example.ru", PASSWORD).await;
    let begun = live
        .send(live.post("/api/shoppers/passkeys/registration", None, &json!({})))
        .await
        .unwrap();
    assert_eq!(begun.status, StatusCode::OK, "{}", begun.body);
    let options = &begun.json()["options"]["publicKey"];
    assert_eq!(options["user"]["name"], "pavel@example.ru");
    assert_eq!(options["authenticatorSelection"]["residentKey"], "required");
    db.assert_invariants().await;
}

/// `api`, its requests sent from 127.0.0.`last` (a loopback address of its own).
fn from_address(api: &Api, last: u8) -> Api {
    let address = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, last));
    Api {
        http: reqwest::Client::builder()
            .local_address(address)
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
        ..api.clone()
    }
}

/// The per-account limit counts wrong guesses, not sign-ins, and per client address: the owner
/// signs in again and again without being refused; a guesser at another address is held back
/// after its allowance of wrong passwords, while the owner's right password still works; and a
/// guessing address waits even with the right password.
async fn the_owners_password_is_not_held_back_by_a_guesser_elsewhere(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(SERVER, &db, &[("CHECKOUT_SIGN_IN_PER_ACCOUNT", "3")]).await;
    let api = server.api();
    let (owner, guesser) = (from_address(&api, 3), from_address(&api, 2));
    owner.live_shopper("lida@example.ru", PASSWORD).await;
    for _ in 0..6 {
        let again = owner.sign_in("lida@example.ru", PASSWORD).await;
        assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    }
    for _ in 0..3 {
        guesser
            .sign_in("lida@example.ru", "a guess")
            .await
            .assert_problem(401, "invalid_credentials");
    }
    guesser
        .sign_in("lida@example.ru", PASSWORD)
        .await
        .assert_problem(429, "too_many_requests");
    let owners = owner.sign_in("lida@example.ru", PASSWORD).await;
    assert_eq!(owners.status, StatusCode::OK, "{}", owners.body);
    db.assert_invariants().await;
}

/// A rolled secret key stops at once on every instance (none trusts it for a while from a
/// cache); asked for an overlap (`--overlap 1h`), the old key keeps working until then, and not
/// a moment after.
async fn a_rolled_key_stops_at_once_on_every_instance_unless_an_overlap_is_asked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let a = Server::start(SERVER, &db).await;
    // SQLite has one server process per file; PostgreSQL as many instances as one likes.
    let b = match backend {
        Backend::Sqlite => None,
        _ => Some(Server::start(SERVER, &db).await),
    };
    let servers: Vec<&Server> = std::iter::once(&a).chain(b.as_ref()).collect();
    let shop = a.add_shop("Книжная лавка").await;
    let orders = std::sync::atomic::AtomicU64::new(0);
    let status = |server: &Server, key: &str| {
        let api = Api {
            token: Some(key.to_owned()),
            ..Api::new(&server.base)
        };
        let order = format!(
            "ORD-{}",
            orders.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        async move {
            api.send(api.post(
                "/api/checkout-sessions",
                Some(&new_key()),
                &support::session_request(&order, 100),
            ))
            .await
            .unwrap()
            .status
        }
    };
    let roll = |overlap: Option<&str>| {
        let mut args = vec![
            "shop",
            "roll-key",
            "--shop",
            &shop.shop_id,
            "--mode",
            "test",
        ];
        args.extend(overlap.map(|o| ["--overlap", o]).into_iter().flatten());
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let a = &a;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, out, err) = a.operator(&args).await;
            assert!(ok, "roll-key: {out} {err}");
            serde_json::from_str::<Value>(&out).unwrap()
        }
    };
    let first = shop.api.token.clone().unwrap();
    // Both instances have just let it in (and would remember it).
    for &server in &servers {
        assert_eq!(status(server, &first).await, StatusCode::CREATED);
    }
    let rolled = roll(None).await;
    let second = rolled["secret_key"].as_str().unwrap().to_owned();
    assert!(rolled["old_key_expires_at"].is_null(), "{rolled}");
    for &server in &servers {
        assert_eq!(status(server, &first).await, StatusCode::UNAUTHORIZED);
        assert_eq!(status(server, &second).await, StatusCode::CREATED);
    }

    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let rolled = roll(Some("1h")).await;
    let third = rolled["secret_key"].as_str().unwrap().to_owned();
    let until = time::OffsetDateTime::parse(
        rolled["old_key_expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let until_ms = (until.unix_timestamp_nanos() / 1_000_000) as i64;
    assert!(
        (asked_at + 3_600_000..asked_at + 3_660_000).contains(&until_ms),
        "{rolled}"
    );
    for &server in &servers {
        assert_eq!(status(server, &second).await, StatusCode::CREATED);
        assert_eq!(status(server, &third).await, StatusCode::CREATED);
    }
    // The overlap ends (its end moved to the past behind the servers' backs): at once, everywhere.
    db.execute("UPDATE retired_keys SET expires_at = 0").await;
    for &server in &servers {
        assert_eq!(status(server, &second).await, StatusCode::UNAUTHORIZED);
        assert_eq!(status(server, &third).await, StatusCode::CREATED);
    }
    let (ok, _, err) = a
        .operator(&[
            "shop",
            "roll-key",
            "--shop",
            &shop.shop_id,
            "--mode",
            "test",
            "--overlap",
            "forever",
        ])
        .await;
    assert!(!ok && err.contains("overlap"), "{err}");
    db.assert_invariants().await;
}
