//! The protocol (`checkout-idempotency`) on its own, with no HTTP in sight: a trivial operation
//! run through `Protocol::execute` against the real stores, SQLite and PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use checkout_backend::operations::error::OperationError;
use checkout_backend::store::{
    AccountKind, CONNECTION_LIFETIME, EntryKind, LedgerEntry, NewSession, Pooling, ShopRow, Store,
    StoreError, StoreSettings, Tx, sessions,
};
use checkout_idempotency::{
    Aborted, Claim, Decision, Fingerprint, HookFuture, Hooks, KeyStore, KeyTx, KeyedRequest,
    Operation, Outcome, Protocol, StoredResponse, now_ms,
};
use checkout_testkit::{Backend, TestDb};
use serde_json::json;
use tokio::sync::Notify;

checkout_testkit::on_every_database!(
    an_operation_runs_once_and_is_replayed,
    another_request_under_the_key_is_refused,
    keys_are_scoped_to_their_sender,
    a_failed_operation_leaves_no_key,
    a_lost_race_runs_again_and_gives_up_bounded,
    an_aborted_commit_leaves_no_trace,
    an_expired_key_is_taken_over,
    a_duplicate_of_an_in_flight_request_never_runs_twice,
    a_completion_without_its_claim_is_refused,
    expired_keys_are_swept_in_bounded_batches,
    a_failure_inside_a_batch_rolls_back_only_itself,
    copies_of_an_in_flight_request_wait_one_lock_timeout_in_all,
);

const TTL: Duration = Duration::from_secs(3600);
const LOCK_TIMEOUT: Duration = Duration::from_millis(150);

/// A store over a fresh database, with two accounts to scope keys to.
async fn setup(backend: Backend) -> (TestDb, Store) {
    let db = TestDb::new(backend).await;
    let store = open_store(&db, LOCK_TIMEOUT).await;
    store
        .write(|tx| {
            Box::pin(async move {
                for account in ["acc_a", "acc_b"] {
                    let hash = format!("hash-{account}");
                    tx.insert_account(
                        account,
                        &hash,
                        AccountKind::Shopper,
                        false,
                        "RUB",
                        0,
                        now_ms(),
                    )
                    .await?;
                }
                Ok(())
            })
        })
        .await
        .unwrap();
    (db, store)
}

/// A store (one server instance's) over `db`; the claim waits for a lock at most `lock_timeout`.
async fn open_store(db: &TestDb, lock_timeout: Duration) -> Store {
    Store::connect(&db.server_url, settings(db, lock_timeout))
        .await
        .unwrap()
}

/// One server instance's store settings over `db`.
fn settings(db: &TestDb, lock_timeout: Duration) -> StoreSettings {
    StoreSettings {
        pool_size: 8,
        lock_timeout,
        sqlite_batch: 64,
        // A second instance over one PostgreSQL database; a SQLite file is one process's.
        exclusive: false,
        sqlite_max_size_kib: None,
        // The suite also runs through PgBouncer in transaction mode (`pgbouncer::…`).
        pooling: if db.server_url == db.url {
            Pooling::Direct
        } else {
            Pooling::Transaction
        },
        connection_lifetime: CONNECTION_LIFETIME,
        after_sqlite_commit: Default::default(),
    }
}

fn protocol() -> Protocol {
    Protocol::new(TTL).with_lock_timeout(LOCK_TIMEOUT)
}

/// The trivial operation: credits its sender one kopeck (with the ledger row that records it)
/// and answers `201 {"n": …}`. It can be told to fail, to lose races, or to hold its
/// transaction open until released.
#[derive(Clone, Default)]
struct Tally {
    answer: u32,
    fail: bool,
    restarts: Arc<AtomicUsize>,
    /// Set: says so once inside the transaction, then waits to be released.
    hold: Option<(Arc<Notify>, Arc<Notify>)>,
}

impl Operation<Tx> for Tally {
    type Error = OperationError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, OperationError> {
        tx.credit(&claim.scope, 1).await?;
        tx.insert_ledger(&LedgerEntry {
            account_id: &claim.scope,
            amount: 1,
            kind: EntryKind::Opening,
            claim: Some(claim),
            payment_id: None,
            refund_id: None,
            created_at: claim.now_ms,
        })
        .await?;
        if let Some((inside, release)) = &self.hold {
            inside.notify_one();
            release.notified().await;
        }
        if self.fail {
            return Err(OperationError::InvalidRequest("told to fail".into()));
        }
        if self
            .restarts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Ok(Decision::Restart);
        }
        Ok(Decision::Respond(StoredResponse {
            status: 201,
            body: json!({ "n": self.answer }).to_string(),
        }))
    }
}

fn fingerprint(n: u32) -> Fingerprint {
    Fingerprint::of("POST", "/tally", &json!({ "n": n }))
}

async fn run(
    protocol: &Protocol,
    store: &Store,
    scope: &str,
    key: &str,
    tally: Tally,
) -> Result<Outcome, OperationError> {
    let body = json!({ "n": tally.answer });
    let request = KeyedRequest {
        scope,
        key,
        method: "POST",
        route: "/tally",
        body: &body,
    };
    protocol.execute(store, request, tally).await
}

async fn balance(db: &TestDb, account: &str) -> i64 {
    db.scalar(&format!(
        "SELECT balance FROM accounts WHERE account_id = '{account}'"
    ))
    .await
}

fn executed(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        body: body.into(),
    }
}

async fn an_operation_runs_once_and_is_replayed(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    let tally = Tally {
        answer: 7,
        ..Tally::default()
    };
    let before = now_ms();
    let first = run(&protocol, &store, "acc_a", "k1", tally.clone())
        .await
        .unwrap();
    let Outcome::Executed {
        response,
        expires_at_ms,
    } = first
    else {
        panic!("{first:?}")
    };
    assert_eq!(response, executed(r#"{"n":7}"#));
    assert!(expires_at_ms >= before + 3_600_000);
    for _ in 0..3 {
        let again = run(&protocol, &store, "acc_a", "k1", tally.clone())
            .await
            .unwrap();
        assert_eq!(
            again,
            Outcome::Replayed {
                response: response.clone(),
                expires_at_ms
            }
        );
    }
    assert_eq!(balance(&db, "acc_a").await, 1, "applied once");
    db.assert_invariants().await;
}

async fn another_request_under_the_key_is_refused(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    let first = Tally {
        answer: 1,
        ..Tally::default()
    };
    run(&protocol, &store, "acc_a", "k1", first.clone())
        .await
        .unwrap();
    let other = Tally {
        answer: 2,
        ..Tally::default()
    };
    let refused = run(&protocol, &store, "acc_a", "k1", other).await.unwrap();
    assert!(
        matches!(&refused, Outcome::KeyReused { fields, .. } if fields == &["n"]),
        "the differing field is named: {refused:?}"
    );
    assert!(matches!(
        run(&protocol, &store, "acc_a", "k1", first).await.unwrap(),
        Outcome::Replayed { .. }
    ));
    assert_eq!(balance(&db, "acc_a").await, 1);
    db.assert_invariants().await;
}

async fn keys_are_scoped_to_their_sender(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    for scope in ["acc_a", "acc_b"] {
        let outcome = run(&protocol, &store, scope, "shared", Tally::default())
            .await
            .unwrap();
        assert!(
            matches!(outcome, Outcome::Executed { .. }),
            "{scope}: {outcome:?}"
        );
    }
    assert_eq!(balance(&db, "acc_a").await, 1);
    assert_eq!(balance(&db, "acc_b").await, 1);
    db.assert_invariants().await;
}

async fn a_failed_operation_leaves_no_key(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    let failing = Tally {
        fail: true,
        ..Tally::default()
    };
    let error = run(&protocol, &store, "acc_a", "k1", failing)
        .await
        .unwrap_err();
    assert!(
        matches!(error, OperationError::InvalidRequest(_)),
        "{error:?}"
    );
    assert_eq!(store.stored_key("acc_a", "k1").await.unwrap(), None);
    assert_eq!(balance(&db, "acc_a").await, 0, "its change rolled back");
    // Not an outcome: the same key runs afresh.
    let outcome = run(&protocol, &store, "acc_a", "k1", Tally::default())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Executed { .. }), "{outcome:?}");
    assert_eq!(balance(&db, "acc_a").await, 1);
    db.assert_invariants().await;
}

async fn a_lost_race_runs_again_and_gives_up_bounded(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    let twice = Tally {
        restarts: Arc::new(AtomicUsize::new(2)),
        ..Tally::default()
    };
    let outcome = run(&protocol, &store, "acc_a", "k1", twice).await.unwrap();
    assert!(matches!(outcome, Outcome::Executed { .. }), "{outcome:?}");
    assert_eq!(
        balance(&db, "acc_a").await,
        1,
        "the lost attempts rolled back"
    );

    let always = Tally {
        restarts: Arc::new(AtomicUsize::new(usize::MAX)),
        ..Tally::default()
    };
    let outcome = run(&protocol, &store, "acc_a", "k2", always.clone())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::TryAgain);
    assert_eq!(
        usize::MAX - always.restarts.load(Ordering::SeqCst),
        checkout_idempotency::MAX_ATTEMPTS,
        "bounded attempts"
    );
    assert_eq!(store.stored_key("acc_a", "k2").await.unwrap(), None);
    assert_eq!(balance(&db, "acc_a").await, 1);
    db.assert_invariants().await;
}

struct AbortEveryCommit;

impl Hooks for AbortEveryCommit {
    fn before_commit(&self, _scope: &str, _key: &str) -> HookFuture {
        Box::pin(std::future::ready(Err(Aborted)))
    }
}

async fn an_aborted_commit_leaves_no_trace(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol().with_hooks(Arc::new(AbortEveryCommit));
    let outcome = run(&protocol, &store, "acc_a", "k1", Tally::default())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::TryAgain);
    assert_eq!(store.stored_key("acc_a", "k1").await.unwrap(), None);
    assert_eq!(balance(&db, "acc_a").await, 0);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM ledger").await, 0);
}

async fn an_expired_key_is_taken_over(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    run(&protocol, &store, "acc_a", "k1", Tally::default())
        .await
        .unwrap();
    let two_hours_ago = now_ms() - 2 * 3_600_000;
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {two_hours_ago}"
    ))
    .await;
    let outcome = run(&protocol, &store, "acc_a", "k1", Tally::default())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Executed { .. }),
        "an expired key is a new key: {outcome:?}"
    );
    assert_eq!(balance(&db, "acc_a").await, 2);
    let record = store.stored_key("acc_a", "k1").await.unwrap().unwrap();
    assert!(
        record.created_at_ms > two_hours_ago,
        "the key was claimed anew"
    );
    db.assert_invariants_after_key_reuse().await;
}

async fn a_duplicate_of_an_in_flight_request_never_runs_twice(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    let (inside, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let slow = Tally {
        hold: Some((inside.clone(), release.clone())),
        ..Tally::default()
    };
    let original = tokio::spawn({
        let (protocol, store) = (protocol.clone(), store.clone());
        async move { run(&protocol, &store, "acc_a", "k1", slow).await }
    });
    inside.notified().await; // the original holds its claim, uncommitted

    // A copy in this process waits for the original in memory, at most the lock timeout.
    let started = std::time::Instant::now();
    let copy = run(&protocol, &store, "acc_a", "k1", Tally::default())
        .await
        .unwrap();
    assert_eq!(copy, Outcome::InUse);
    let waited = started.elapsed();
    assert!(
        LOCK_TIMEOUT <= waited && waited < LOCK_TIMEOUT * 10,
        "waited {waited:?} for a {LOCK_TIMEOUT:?} bound"
    );
    if backend == Backend::Postgres {
        // Another instance (its own registry) is bounded by the database: its claim waits on
        // the original's key row for the lock timeout.
        let other_instance = protocol_elsewhere();
        let copy = run(&other_instance, &store, "acc_a", "k1", Tally::default())
            .await
            .unwrap();
        assert_eq!(copy, Outcome::InUse);
    }

    release.notify_one();
    let original = original.await.unwrap().unwrap();
    let Outcome::Executed { response, .. } = original else {
        panic!("{original:?}")
    };
    let retried = run(&protocol, &store, "acc_a", "k1", Tally::default())
        .await
        .unwrap();
    assert!(
        matches!(&retried, Outcome::Replayed { response: r, .. } if *r == response),
        "{retried:?}"
    );
    assert_eq!(balance(&db, "acc_a").await, 1, "applied once");
    db.assert_invariants().await;
}

/// A protocol with a registry of its own, as in another server process.
fn protocol_elsewhere() -> Protocol {
    protocol()
}

async fn a_completion_without_its_claim_is_refused(backend: Backend) {
    let (_db, store) = setup(backend).await;
    let error = store
        .write(|tx| {
            Box::pin(async move {
                let never_claimed = Claim {
                    scope: "acc_a".into(),
                    key: "k1".into(),
                    claim_id: "c1".into(),
                    request_hash: fingerprint(0).as_str().into(),
                    request_body: "{}".into(),
                    now_ms: now_ms(),
                };
                tx.complete(&never_claimed, &executed("{}")).await
            })
        })
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::LostClaim), "{error:?}");
}

/// Work queued while the writer is busy runs as one batch, one savepoint each: a unit that
/// fails or loses a race rolls back alone; the others commit, with their stored answers.
/// (On PostgreSQL each unit is a transaction of its own; the outcomes are the same.)
async fn a_failure_inside_a_batch_rolls_back_only_itself(backend: Backend) {
    let (db, store) = setup(backend).await;
    let protocol = protocol();
    let (inside, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let holder = tokio::spawn({
        let (protocol, store) = (protocol.clone(), store.clone());
        let hold = Tally {
            hold: Some((inside.clone(), release.clone())),
            ..Tally::default()
        };
        async move { run(&protocol, &store, "acc_b", "hold", hold).await }
    });
    inside.notified().await;

    let mut queued = Vec::new();
    for n in 0..4 {
        let good = Tally {
            answer: n,
            ..Tally::default()
        };
        queued.push(("good", format!("ok-{n}"), good));
    }
    let failing = Tally {
        fail: true,
        ..Tally::default()
    };
    queued.push(("fails", "fails".into(), failing));
    let loser = Tally {
        restarts: Arc::new(AtomicUsize::new(1)),
        ..Tally::default()
    };
    queued.push(("loses a race once", "race".into(), loser));
    let units = queued.len();
    let answers: Vec<_> = queued
        .into_iter()
        .map(|(what, key, tally)| {
            let (protocol, store) = (protocol.clone(), store.clone());
            tokio::spawn(async move {
                (
                    what,
                    key.clone(),
                    run(&protocol, &store, "acc_a", &key, tally).await,
                )
            })
        })
        .collect();
    if let Store::Sqlite(sqlite) = &store {
        let stats = sqlite.stats.clone();
        checkout_testkit::wait_until(
            "the units never queued behind the held writer",
            Duration::from_secs(20),
            || {
                let stats = stats.clone();
                async move { stats.queued.load(Ordering::SeqCst) == units as u64 }
            },
        )
        .await;
    }
    release.notify_one();
    assert!(matches!(
        holder.await.unwrap().unwrap(),
        Outcome::Executed { .. }
    ));
    for answer in answers {
        let (what, key, outcome) = answer.await.unwrap();
        match what {
            "fails" => {
                assert!(outcome.is_err(), "{what}: {outcome:?}");
                assert_eq!(store.stored_key("acc_a", &key).await.unwrap(), None);
            }
            _ => {
                assert!(
                    matches!(outcome, Ok(Outcome::Executed { .. })),
                    "{what}: {outcome:?}"
                );
                assert!(store.stored_key("acc_a", &key).await.unwrap().is_some());
            }
        }
    }
    if let Store::Sqlite(sqlite) = &store {
        assert!(
            sqlite.stats.largest_batch.load(Ordering::SeqCst) > units as u64,
            "the held unit and the queued ones shared one commit"
        );
    }
    assert_eq!(
        balance(&db, "acc_a").await,
        5,
        "four good units and the race's winner"
    );
    assert_eq!(balance(&db, "acc_b").await, 1);
    db.assert_invariants().await;
}

async fn expired_keys_are_swept_in_bounded_batches(backend: Backend) {
    let (db, store) = setup(backend).await;
    let old = now_ms() - 2 * 3_600_000;
    let keys = checkout_backend::workers::sweeper::BATCH * 2 + 37;
    db.execute(&format!(
        "WITH RECURSIVE numbers(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM numbers WHERE n < {keys}) \
         INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, \
                                       status, response_status, response_body, created_at) \
         SELECT 'acc_a', 'old-' || n, 'c-' || n, 'h', 'done', 201, '{{}}', {old} FROM numbers"
    ))
    .await;
    let protocol = protocol();
    run(&protocol, &store, "acc_a", "fresh", Tally::default())
        .await
        .unwrap();

    let cutoff = now_ms() - TTL.as_millis() as i64;
    let one_batch = store.sweep_expired_keys(cutoff, 100).await.unwrap();
    assert_eq!(one_batch, 100, "one call deletes one bounded batch");
    let rest = checkout_backend::workers::sweeper::sweep(&store, cutoff)
        .await
        .unwrap();
    assert_eq!(rest, keys as u64 - 100);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys").await,
        1,
        "only the live key is left"
    );
    assert!(store.stored_key("acc_a", "fresh").await.unwrap().is_some());
}

/// The in-memory wait of a copy for its in-flight original is one bound, however the copies
/// take turns: here the original fails after a while, a third copy takes its place, and the
/// copy still waiting gives up when the lock timeout since its arrival has passed (not a whole
/// lock timeout again).
async fn copies_of_an_in_flight_request_wait_one_lock_timeout_in_all(backend: Backend) {
    let (_db, store) = setup(backend).await;
    let bound = Duration::from_millis(1_000);
    let protocol = Protocol::new(TTL).with_lock_timeout(bound);
    let held = || (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (first_inside, first_release) = held();
    let failing = Tally {
        hold: Some((first_inside.clone(), first_release.clone())),
        fail: true,
        ..Tally::default()
    };
    let original = tokio::spawn({
        let (protocol, store) = (protocol.clone(), store.clone());
        async move { run(&protocol, &store, "acc_a", "k-turns", failing).await }
    });
    first_inside.notified().await;
    // Two copies arrive; each, should it become the one that executes, holds its transaction.
    let (inside, release) = held();
    let copies: Vec<_> = (0..2)
        .map(|_| {
            let (protocol, store) = (protocol.clone(), store.clone());
            let copy = Tally {
                hold: Some((inside.clone(), release.clone())),
                ..Tally::default()
            };
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let outcome = run(&protocol, &store, "acc_a", "k-turns", copy).await;
                (outcome, started.elapsed())
            })
        })
        .collect();
    // Most of the bound passes; then the original fails and one copy takes over.
    tokio::time::sleep(Duration::from_millis(600)).await;
    first_release.notify_one();
    assert!(original.await.unwrap().is_err(), "the original failed");
    inside.notified().await;
    // The other copy gives up within its bound (measured from its own arrival).
    checkout_testkit::wait_until("no copy gave up", Duration::from_secs(10), || async {
        copies.iter().any(|copy| copy.is_finished())
    })
    .await;
    release.notify_one();
    let mut in_use = 0;
    for copy in copies {
        let (outcome, elapsed) = copy.await.unwrap();
        match outcome.unwrap() {
            Outcome::InUse => {
                in_use += 1;
                assert!(
                    elapsed < bound + Duration::from_millis(350),
                    "a copy waited {elapsed:?}, more than its bound {bound:?}"
                );
            }
            Outcome::Executed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(in_use, 1, "one copy executed, the other gave up");
}

/// A store and a shop account with `count` checkout sessions that lapse at `expires_at`.
async fn lapsing_sessions(store: &Store, count: usize, expires_at: i64) -> Vec<String> {
    let ids: Vec<String> = (0..count).map(|n| format!("cs_{n:032x}")).collect();
    let sessions = ids.clone();
    store
        .write(move |tx| {
            Box::pin(async move {
                if tx.shop("shop_lapsing", false).await?.is_none() {
                    tx.insert_account(
                        "acc_shop",
                        "hash-shop",
                        AccountKind::Shop,
                        false,
                        "RUB",
                        0,
                        now_ms(),
                    )
                    .await?;
                    let shop = ShopRow {
                        shop_id: "shop_lapsing".into(),
                        account_id: "acc_shop".into(),
                        name: "Лавка".into(),
                        webhook_url: None,
                        signing_secret: "whsec_x".into(),
                        old_signing_secret: None,
                        origins: Vec::new(),
                        livemode: false,
                    };
                    tx.insert_shop(&shop, now_ms()).await?;
                }
                for (n, session_id) in sessions.iter().enumerate() {
                    tx.insert_session(&NewSession {
                        session_id,
                        shop_account_id: "acc_shop",
                        order_id: &format!("ORD-{n}"),
                        amount: 1_000,
                        currency: "RUB",
                        description: None,
                        items: "[]",
                        expires_at,
                        created_at: expires_at - 60_000,
                        return_url: None,
                    })
                    .await?;
                }
                Ok(())
            })
        })
        .await
        .unwrap();
    ids
}

/// Waits until `task` has finished or some statement of this database waits for a row lock.
async fn finished_or_waiting_for_a_lock<T>(db: &TestDb, task: &tokio::task::JoinHandle<T>) {
    checkout_testkit::wait_until(
        "the sweep neither finished nor waited for the held row",
        Duration::from_secs(20),
        || async {
            task.is_finished()
                || db
                    .scalar(
                        "SELECT COUNT(*) FROM pg_stat_activity \
                          WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    )
                    .await
                    > 0
        },
    )
    .await;
}

/// A payment takes a session a moment before it lapses and holds its transaction (as a slow
/// commit does) while the sweeper closes lapsed sessions: the session stays paid, and its shop
/// hears nothing of an expiry. Seen before the fix on PostgreSQL: the sweep waited for the
/// payment's row lock, re-read only `session_id IN (…)`, and marked the paid session expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_never_expires_a_session_a_payment_is_taking() {
    let db = TestDb::new(Backend::Postgres).await;
    // Long enough a lock wait that the sweep would rather wait than give up.
    let store = open_store(&db, Duration::from_secs(10)).await;
    let now = now_ms();
    let sessions = lapsing_sessions(&store, 2, now).await;
    let (held, witness) = (&sessions[0], &sessions[1]);

    let mut payment = db.connect().await;
    sqlx::query("BEGIN").execute(&mut payment).await.unwrap();
    let taken = sqlx::query(sessions::TAKE_SESSION)
        .bind(held.as_str())
        .bind("pay_held")
        .bind(now - 1_000)
        .execute(&mut payment)
        .await
        .unwrap();
    assert_eq!(
        taken.rows_affected(),
        1,
        "the payment took the open session"
    );

    let sweep = tokio::spawn({
        let store = store.clone();
        async move {
            checkout_backend::operations::events::expire_sessions(&store, now + 10_000, 500).await
        }
    });
    finished_or_waiting_for_a_lock(&db, &sweep).await;
    sqlx::query("COMMIT").execute(&mut payment).await.unwrap();
    sweep.await.unwrap().unwrap();

    let status =
        |id: &str| format!("SELECT status FROM checkout_sessions WHERE session_id = '{id}'");
    assert_eq!(db.scalar_text(&status(held)).await, "paid");
    assert_eq!(db.scalar_text(&status(witness)).await, "expired");
    let expired_events = |id: &str| {
        format!(
            "SELECT COUNT(*) FROM webhook_events \
              WHERE type = 'checkout_session.expired' AND subject_id = '{id}'"
        )
    };
    assert_eq!(
        db.scalar(&expired_events(held)).await,
        0,
        "no expiry told of a paid session"
    );
    assert_eq!(db.scalar(&expired_events(witness)).await, 1);
}

/// Two instances sweep one backlog of lapsed sessions at once: each session is closed once,
/// with one `checkout_session.expired` event (before the fix the slower sweep, having waited
/// for the faster one's rows, closed them again and wrote a second event with another id).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sweeping_one_backlog_expire_each_session_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let (one, two) = (
        open_store(&db, Duration::from_secs(10)).await,
        open_store(&db, Duration::from_secs(10)).await,
    );
    let now = now_ms();
    let count = 3 * checkout_backend::workers::sweeper::BATCH as usize + 100;
    lapsing_sessions(&one, count, now).await;
    let (a, b) = tokio::join!(
        checkout_backend::workers::sweeper::expire_sessions(&one),
        checkout_backend::workers::sweeper::expire_sessions(&two),
    );
    assert_eq!(
        a.unwrap() + b.unwrap(),
        count,
        "each session closed once in all"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM webhook_events WHERE type = 'checkout_session.expired'")
            .await,
        count as i64
    );
    db.assert_invariants().await;
}

/// A key string used again after its TTL is a new key: its new claim, held while the sweeper
/// deletes expired keys, survives the sweep, and a resend replays it instead of running it a
/// second time. Before the fix the sweep, blocked on the re-claimed row, deleted it anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_key_sweeper_spares_a_key_claimed_again_meanwhile() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = open_store(&db, Duration::from_secs(10)).await;
    for account in ["acc_a"] {
        let hash = format!("hash-{account}");
        store
            .write(move |tx| {
                Box::pin(async move {
                    tx.insert_account(
                        account,
                        &hash,
                        AccountKind::Shopper,
                        false,
                        "RUB",
                        0,
                        now_ms(),
                    )
                    .await
                })
            })
            .await
            .unwrap();
    }
    let protocol = protocol();
    run(&protocol, &store, "acc_a", "k-again", Tally::default())
        .await
        .unwrap();
    // Its TTL passes.
    db.execute("UPDATE idempotency_keys SET created_at = created_at - 7200000")
        .await;

    // The same key string again: a new request, holding its new claim.
    let (inside, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let again = tokio::spawn({
        let (protocol, store) = (protocol.clone(), store.clone());
        let slow = Tally {
            hold: Some((inside.clone(), release.clone())),
            ..Tally::default()
        };
        async move { run(&protocol, &store, "acc_a", "k-again", slow).await }
    });
    inside.notified().await;
    let sweep = tokio::spawn({
        let store = store.clone();
        let cutoff = now_ms() - TTL.as_millis() as i64;
        async move { store.sweep_expired_keys(cutoff, 500).await }
    });
    finished_or_waiting_for_a_lock(&db, &sweep).await;
    release.notify_one();
    assert!(matches!(
        again.await.unwrap().unwrap(),
        Outcome::Executed { .. }
    ));
    assert_eq!(
        sweep.await.unwrap().unwrap(),
        0,
        "nothing expired was left to sweep"
    );

    let resend = run(&protocol, &store, "acc_a", "k-again", Tally::default())
        .await
        .unwrap();
    assert!(matches!(resend, Outcome::Replayed { .. }), "{resend:?}");
    assert_eq!(
        balance(&db, "acc_a").await,
        2,
        "once before the TTL, once after: never a third"
    );
}

/// Another instance holds a key (its claim not committed yet): a claim here waits for it only
/// the store's lock timeout, then says the key is in use. Behind a transaction pooler no session
/// setting survives, so the timeout must travel with each transaction's `BEGIN`.
async fn a_key_held_by_another_instance_is_in_use_after_the_lock_timeout(backend: Backend) {
    let (db, store) = setup(backend).await;
    let mut other_instance = db.connect().await;
    sqlx::query("BEGIN")
        .execute(&mut other_instance)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, \
         status, created_at) VALUES ('acc_a', 'k-held', 'c-other', 'h', 'in_progress', 1)",
    )
    .execute(&mut other_instance)
    .await
    .unwrap();
    // The protocol's own bound (for copies within this process) is far longer: only the
    // database's lock timeout can end the wait this soon.
    let protocol = Protocol::new(TTL).with_lock_timeout(Duration::from_secs(30));
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        run(&protocol, &store, "acc_a", "k-held", Tally::default()),
    )
    .await
    .expect("the claim does not wait for the other instance's transaction");
    let waited = started.elapsed();
    assert!(
        matches!(outcome, Ok(Outcome::InUse) | Err(OperationError::KeyInUse)),
        "{outcome:?}"
    );
    assert!(
        waited >= LOCK_TIMEOUT && waited < Duration::from_secs(3),
        "waited {waited:?} for a lock timeout of {LOCK_TIMEOUT:?}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut other_instance)
        .await
        .unwrap();
    assert_eq!(balance(&db, "acc_a").await, 0, "nothing ran");
}

/// Key k1 expired, not yet swept. Instance A takes it over for a new request and holds its
/// transaction; the same request reaches instance B, whose claim waits on the key's row. A
/// commits. B must answer from A's record (the key now belongs to A's request): replaying A's
/// answer, never the expired record its statement's snapshot still sees (an old answer, or a
/// `422` naming the old body's fields).
async fn an_expired_key_taken_over_elsewhere_is_answered_from_its_new_holder(backend: Backend) {
    let (db, store_a) = setup(backend).await;
    let old = Tally {
        answer: 1,
        ..Tally::default()
    };
    run(&protocol(), &store_a, "acc_a", "k1", old)
        .await
        .unwrap();
    db.execute(&format!(
        "UPDATE idempotency_keys SET created_at = {}",
        now_ms() - 2 * 3_600_000
    ))
    .await;
    let (inside, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let taking_over = Tally {
        answer: 2,
        hold: Some((inside.clone(), release.clone())),
        ..Tally::default()
    };
    let a = tokio::spawn({
        let store = store_a.clone();
        async move { run(&protocol(), &store, "acc_a", "k1", taking_over).await }
    });
    inside.notified().await; // A holds the key's row, taken over, uncommitted
    let store_b = open_store(&db, Duration::from_secs(20)).await;
    let b = tokio::spawn(async move {
        let same = Tally {
            answer: 2,
            ..Tally::default()
        };
        run(&protocol_elsewhere(), &store_b, "acc_a", "k1", same).await
    });
    let waiting = || async {
        db.scalar(
            "SELECT COUNT(*) FROM pg_stat_activity               WHERE wait_event_type = 'Lock' AND query LIKE '%idempotency_keys%'",
        )
        .await
            >= 1
    };
    checkout_testkit::wait_until(
        "B never waited on the key",
        Duration::from_secs(20),
        waiting,
    )
    .await;
    release.notify_one();
    let a = a.await.unwrap().unwrap();
    let Outcome::Executed { response, .. } = a else {
        panic!("A: {a:?}")
    };
    assert_eq!(response, executed(r#"{"n":2}"#));
    let b = b.await.unwrap().unwrap();
    match &b {
        Outcome::Replayed {
            response: replayed,
            expires_at_ms,
        } => {
            assert_eq!(*replayed, response, "B replays A's answer");
            assert!(*expires_at_ms > now_ms(), "an expiry in the past: {b:?}");
        }
        other => panic!("B answered from the expired record: {other:?}"),
    }
    assert_eq!(
        balance(&db, "acc_a").await,
        2,
        "the old run and A's, once each"
    );
    db.assert_invariants_after_key_reuse().await;
}

mod another_instance {
    use checkout_testkit::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn takes_over_an_expired_key_while_this_one_waits() {
        super::an_expired_key_taken_over_elsewhere_is_answered_from_its_new_holder(
            Backend::Postgres,
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_postgres() {
        super::a_key_held_by_another_instance_is_in_use_after_the_lock_timeout(Backend::Postgres)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn through_pgbouncer() {
        super::a_key_held_by_another_instance_is_in_use_after_the_lock_timeout(Backend::PgBouncer)
            .await
    }
}

/// Connections of this test's database left inside a transaction (its own aside).
const IN_TRANSACTION: &str = "SELECT COUNT(*) FROM pg_stat_activity \
                              WHERE datname = current_database() AND pid <> pg_backend_pid() \
                                AND state LIKE 'idle in transaction%'";

/// A store over `db` (the suite's cluster, `TestDb::new`) reached through a link that delays
/// each byte by `delay` and witnesses what the store sends.
async fn store_through_link(
    db: &TestDb,
    delay: Duration,
    settings: StoreSettings,
) -> (checkout_testkit::slow_link::SlowLink, Store) {
    let cluster = checkout_testkit::postgres::cluster();
    let link = checkout_testkit::slow_link::SlowLink::start(cluster.port, delay).await;
    let database = db.url.rsplit('/').next().unwrap();
    assert_eq!(db.url, cluster.url(database));
    let via_link = format!("postgres://postgres@127.0.0.1:{}/{database}", link.port);
    let store = Store::connect(&via_link, settings).await.unwrap();
    (link, store)
}

/// PostgreSQL: a pooled connection past its lifetime is closed and replaced rather than lent
/// again (after a failover or a pooler's restart, the connections spread again); before it, a
/// connection is lent again as it is, with no new one opened. Counted by the connections'
/// startups on the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_connection_past_its_lifetime_is_replaced() {
    let (db, direct) = setup(Backend::Postgres).await;
    drop(direct);
    for (lifetime, opened) in [(CONNECTION_LIFETIME, 0), (Duration::ZERO, 3)] {
        let settings = StoreSettings {
            connection_lifetime: lifetime,
            ..settings(&db, LOCK_TIMEOUT)
        };
        let (link, store) = store_through_link(&db, Duration::ZERO, settings).await;
        store.ping().await.unwrap();
        let before = link.sends().len();
        for _ in 0..3 {
            store.ping().await.unwrap();
        }
        assert_eq!(
            link.startups_since(before),
            opened,
            "connections opened for three reads, lifetime {lifetime:?}"
        );
    }
}

/// An opening entry of `amount` on `acc_a`, outside any key.
fn opening(amount: i64) -> LedgerEntry<'static> {
    LedgerEntry {
        account_id: "acc_a",
        amount,
        kind: EntryKind::Opening,
        claim: None,
        payment_id: None,
        refund_id: None,
        created_at: now_ms(),
    }
}

/// PostgreSQL, on the wire: a connection given back to the pool costs no round trip. sqlx's own
/// pool pinged each one given back (a lone Sync): a keyed payment, a read then one statement,
/// cost the server four round trips, not two. A read is one message, a unit of work its `BEGIN`,
/// its statement and its `COMMIT`; and a unit dropped inside its transaction is still rolled
/// back at once, its locks not left waiting for the connection's next borrower.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_given_back_to_the_pool_costs_no_round_trip() {
    let (db, direct) = setup(Backend::Postgres).await;
    drop(direct);
    // A link with no delay: it only witnesses what the store sends.
    let (link, store) = store_through_link(&db, Duration::ZERO, settings(&db, LOCK_TIMEOUT)).await;
    // Each statement's first use on a connection prepares it (P); later ones only bind (B).
    store.ping().await.unwrap();
    store
        .write(move |tx| Box::pin(async move { tx.insert_ledger(&opening(1)).await }))
        .await
        .unwrap();

    let before = link.sends().len();
    for _ in 0..3 {
        store.ping().await.unwrap();
    }
    store
        .write(move |tx| Box::pin(async move { tx.insert_ledger(&opening(2)).await }))
        .await
        .unwrap();
    // By PostgreSQL's message types: B a prepared statement run, Q a simple query (BEGIN,
    // COMMIT), S a lone Sync (a ping).
    let sent = link.message_types_since(before);
    assert_eq!(
        sent, "BBBQBQ",
        "three reads, then BEGIN, the insert, COMMIT"
    );

    // A unit whose caller goes away inside its transaction, after its insert.
    let inserted = Arc::new(Notify::new());
    let leaving = tokio::spawn({
        let (store, inserted) = (store.clone(), inserted.clone());
        async move {
            store
                .write(move |tx| {
                    Box::pin(async move {
                        tx.insert_ledger(&opening(4)).await?;
                        inserted.notify_one();
                        std::future::pending::<Result<(), StoreError>>().await
                    })
                })
                .await
        }
    });
    inserted.notified().await;
    assert_eq!(db.scalar(IN_TRANSACTION).await, 1);
    leaving.abort();
    assert!(leaving.await.unwrap_err().is_cancelled());
    checkout_testkit::wait_until(
        "the dropped unit's transaction is rolled back",
        Duration::from_secs(5),
        || async { db.scalar(IN_TRANSACTION).await == 0 },
    )
    .await;
    assert_eq!(
        db.scalar(
            "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM ledger WHERE account_id = 'acc_a'"
        )
        .await,
        3,
        "the two units that committed, not the one dropped"
    );
}

/// A unit of work dropped wherever it is (a client that goes away: wrk ending a run, a shopper
/// closing the tab) must not leave its pooled connection inside a transaction. Dropped while
/// its `BEGIN` was on the wire, sqlx 0.8 gave the connection back to the pool in it: the next
/// unit's statements ran inside that transaction, an autocommit statement's write was not
/// committed though it had been answered, and after the first error every statement on the
/// connection failed ("current transaction is aborted": the bench's `500`s). PostgreSQL
/// behind a slow link, one pooled connection, so that the `BEGIN` is seen arriving at the
/// database before its answer reaches the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unit_dropped_while_its_transaction_begins_leaves_none_open() {
    let (db, direct) = setup(Backend::Postgres).await;
    drop(direct);
    let settings = StoreSettings {
        pool_size: 1,
        ..settings(&db, LOCK_TIMEOUT)
    };
    let (_link, store) = store_through_link(&db, Duration::from_millis(300), settings).await;
    assert_eq!(db.scalar(IN_TRANSACTION).await, 0);

    let leaving = tokio::spawn({
        let store = store.clone();
        async move { store.write(|_| Box::pin(async { Ok(()) })).await }
    });
    checkout_testkit::wait_until(
        "the BEGIN reached the database",
        Duration::from_secs(10),
        || async { db.scalar(IN_TRANSACTION).await == 1 },
    )
    .await;
    assert!(!leaving.is_finished(), "its answer is still on the link");
    leaving.abort();
    assert!(leaving.await.unwrap_err().is_cancelled());
    // Its transaction ends once the `BEGIN`'s answer is back (a round trip: 0.6 s), before the
    // connection is lent again: an autocommit statement (a read, a payment at once) must not
    // run inside it.
    checkout_testkit::wait_until(
        "the dropped unit's transaction is rolled back",
        Duration::from_secs(5),
        || async { db.scalar(IN_TRANSACTION).await == 0 },
    )
    .await;

    // The next unit gets the pool's one connection: what it commits is committed.
    store
        .write(|tx| Box::pin(async move { tx.insert_ledger(&opening(1)).await }))
        .await
        .unwrap();
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ledger WHERE account_id = 'acc_a'")
            .await,
        1,
        "the unit's write is committed"
    );
    assert_eq!(
        db.scalar(IN_TRANSACTION).await,
        0,
        "no transaction is left open"
    );
}
