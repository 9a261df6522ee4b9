//! A batch of messages through the protocol in one transaction (`issue_receipts`, what the
//! consumer runs for each batch of deliveries), on each database: new messages get their
//! receipts; a copy inside the same batch and a message seen in an earlier batch change
//! nothing and get the first answer; a second event of a payment that has its receipt is
//! refused with that receipt's id; a message id reused with another body is told apart; a
//! message whose key has expired runs afresh, and its payment's receipt still refuses a
//! second one. The receipts and the inbox are then what the books say. A batch whose
//! transaction fails commits nothing of itself, and each of its messages then runs alone. Two
//! consumers racing for one message (PostgreSQL) issue one receipt, whichever claimed it first.
//! A batch of new messages writes its receipts alone (each holds its message's key), and
//! costs three round trips whatever its size.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use checkout_idempotency::{Aborted, HookFuture, Hooks, Outcome, Protocol};
use checkout_receipts::consumer::{INBOX_TTL, issue_receipts};
use checkout_receipts::receipt;
use checkout_receipts::store::Store;
use checkout_testkit::slow_link::SlowLink;
use checkout_testkit::{Backend, TestDb};
use serde_json::{Value, json};

checkout_testkit::on_both_databases!(
    a_batch_absorbs_copies_and_redeliveries,
    a_new_message_whose_payment_has_its_receipt_is_refused_in_a_batch,
    a_failed_batch_commits_nothing_and_each_message_runs_alone
);

fn payment(payment_id: &str, amount: i64) -> Value {
    json!({"type": "payment.succeeded", "livemode": false, "timestamp": "2026-12-04T10:00:00.000Z",
           "data": {"payment_id": payment_id, "order_id": format!("B-{payment_id}"),
                    "amount": amount, "currency": "RUB", "status": "succeeded",
                    "items": [{"name": "Чай", "quantity": 1, "unit_price": amount}],
                    "description": null}})
}

/// Three new messages, each of its own payment (1 000, 2 000 and 3 000 kopecks).
fn three_payments() -> [(&'static str, Value); 3] {
    [
        ("evt_1", payment("pay_1", 1_000)),
        ("evt_2", payment("pay_2", 2_000)),
        ("evt_3", payment("pay_3", 3_000)),
    ]
}

/// Runs one batch of (message id, event): each message's outcome.
async fn outcomes(store: &Store, protocol: &Protocol, messages: &[(&str, Value)]) -> Vec<Outcome> {
    issue_receipts(
        store,
        protocol,
        "receipts",
        messages
            .iter()
            .map(|(id, body)| (*id, body, receipt::from_event(id, body).unwrap()))
            .collect(),
    )
    .await
    .into_iter()
    .map(|outcome| outcome.expect("the batch's store works"))
    .collect()
}

/// Runs one batch of (message id, event); each message's answer as (status, body), every
/// outcome `Executed` (or, if `replayed`, `Replayed`).
async fn answers(
    store: &Store,
    protocol: &Protocol,
    messages: &[(&str, Value)],
    replayed: bool,
) -> Vec<(u16, String)> {
    outcomes(store, protocol, messages)
        .await
        .into_iter()
        .map(|outcome| match (outcome, replayed) {
            (Outcome::Executed { response, .. }, false)
            | (Outcome::Replayed { response, .. }, true) => (response.status, response.body),
            (other, _) => panic!("{other:?}"),
        })
        .collect()
}

/// Runs one batch of (message id, event); each message's outcome as "executed 201", "replayed
/// 201"…, or the outcome's name.
async fn batch(store: &Store, protocol: &Protocol, messages: &[(&str, Value)]) -> Vec<String> {
    outcomes(store, protocol, messages)
        .await
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Executed { response, .. } => format!("executed {}", response.status),
            Outcome::Replayed { response, .. } => format!("replayed {}", response.status),
            Outcome::KeyReused { .. } => "key reused".to_owned(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Each message's record, by message id: "message receipt" for a message whose receipt holds
/// its key (its fingerprint on the receipt's row: no inbox row), "message status
/// response_status" for an inbox row.
async fn keys(db: &TestDb) -> Vec<String> {
    db.texts(
        "SELECT line FROM ( \
           SELECT message_id AS id, message_id || ' ' || status || ' ' \
                  || CAST(response_status AS TEXT) AS line FROM inbox \
           UNION ALL \
           SELECT event_id, event_id || ' receipt' FROM receipts WHERE request_hash IS NOT NULL \
         ) AS records ORDER BY id, line",
    )
    .await
}

async fn a_batch_absorbs_copies_and_redeliveries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let protocol = Protocol::new(INBOX_TTL);

    // Two new messages and a copy of the first in the same batch.
    let first = batch(
        &store,
        &protocol,
        &[
            ("evt_1", payment("pay_1", 1_000)),
            ("evt_2", payment("pay_2", 2_000)),
            ("evt_1", payment("pay_1", 1_000)),
        ],
    )
    .await;
    assert_eq!(first, ["executed 201", "executed 201", "replayed 201"]);

    // A redelivery of evt_2, a new payment, and a second event of that same payment.
    let second = batch(
        &store,
        &protocol,
        &[
            ("evt_2", payment("pay_2", 2_000)),
            ("evt_3", payment("pay_3", 3_000)),
            ("evt_3b", payment("pay_3", 3_000)),
        ],
    )
    .await;
    assert_eq!(second, ["replayed 201", "executed 201", "executed 409"]);

    // evt_1 again with another body: not a copy.
    let third = batch(&store, &protocol, &[("evt_1", payment("pay_1", 1_500))]).await;
    assert_eq!(third, ["key reused"]);

    // evt_2's key expired (its receipt, which holds it, older than the inbox's TTL), then
    // evt_2 again beside a new message: the key is taken over and runs afresh, and the
    // receipts' own index refuses pay_2 a second receipt. evt_2's record is now that refusal,
    // fresh, in the inbox.
    let raw = TestDb::at(db.url.clone());
    raw.execute("UPDATE receipts SET issued_at = 0 WHERE event_id = 'evt_2'")
        .await;
    let fourth = batch(
        &store,
        &protocol,
        &[
            ("evt_2", payment("pay_2", 2_000)),
            ("evt_4", payment("pay_4", 4_000)),
        ],
    )
    .await;
    assert_eq!(fourth, ["executed 409", "executed 201"]);
    let evt_2 = raw
        .texts(
            "SELECT CASE WHEN created_at > 0 THEN 'fresh' ELSE 'expired' END \
               FROM inbox WHERE message_id = 'evt_2'",
        )
        .await;
    assert_eq!(
        evt_2,
        ["fresh"],
        "one inbox row for the message, taken over"
    );
    let again = outcomes(&store, &protocol, &[("evt_2", payment("pay_2", 2_000))]).await;
    assert!(
        matches!(&again[..], [Outcome::Replayed { response, .. }] if response.status == 409),
        "the fresh refusal is the key's record, not the expired receipt: {again:?}"
    );

    let receipts = store.receipts(None, None, 100).await.unwrap();
    let mut paid: Vec<(String, i64)> = receipts
        .iter()
        .map(|r| (r.payment_id.clone(), r.total))
        .collect();
    paid.sort();
    assert_eq!(
        paid,
        [
            ("pay_1".to_owned(), 1_000),
            ("pay_2".to_owned(), 2_000),
            ("pay_3".to_owned(), 3_000),
            ("pay_4".to_owned(), 4_000)
        ],
        "one receipt per payment, of its amount"
    );
    let totals = store.totals().await.unwrap();
    assert_eq!((totals.income, totals.returns, totals.net), (4, 0, 10_000));
    // Every message the batches took has its record: a receipt's on the receipt, a
    // refusal's in the inbox (and evt_2's receipt, expired, stays the receipt it is).
    assert_eq!(
        keys(&raw).await,
        [
            "evt_1 receipt",
            "evt_2 done 409",
            "evt_2 receipt",
            "evt_3 receipt",
            "evt_3b done 409",
            "evt_4 receipt"
        ]
    );
}

/// Every message of the second batch is new, but one is a second event of a payment that has
/// its receipt: on PostgreSQL the batch's one statement (its receipts, holding its keys) is refused
/// by the receipts' own index, and the batch runs again with its claims first. The refusal is
/// answered with the receipt issued, the other message gets its own, and nothing is written
/// twice.
async fn a_new_message_whose_payment_has_its_receipt_is_refused_in_a_batch(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let protocol = Protocol::new(INBOX_TTL);
    let first = batch(&store, &protocol, &[("evt_1", payment("pay_1", 1_000))]).await;
    assert_eq!(first, ["executed 201"]);
    let issued = store.receipts(None, None, 10).await.unwrap()[0]
        .receipt_id
        .clone();

    let second = [
        ("evt_1b", payment("pay_1", 1_000)),
        ("evt_2", payment("pay_2", 2_000)),
    ];
    let answers = answers(&store, &protocol, &second, false).await;
    assert_eq!(answers[0].0, 409);
    assert!(
        answers[0].1.contains(&issued),
        "the refusal names the receipt issued: {}",
        answers[0].1
    );
    assert_eq!(answers[1].0, 201);

    let totals = store.totals().await.unwrap();
    assert_eq!((totals.income, totals.net), (2, 3_000));
    assert_eq!(
        keys(&TestDb::at(db.url.clone())).await,
        ["evt_1 receipt", "evt_1b done 409", "evt_2 receipt"]
    );
}

/// Aborts the first transaction that reaches its commit (the batch's), lets every later one
/// commit, and counts them.
#[derive(Default)]
struct AbortFirstCommit {
    commits: AtomicUsize,
}

impl Hooks for AbortFirstCommit {
    fn before_commit(&self, _scope: &str, _key: &str) -> HookFuture {
        let first = self.commits.fetch_add(1, Ordering::SeqCst) == 0;
        Box::pin(std::future::ready(if first {
            Err(Aborted)
        } else {
            Ok(())
        }))
    }
}

async fn a_failed_batch_commits_nothing_and_each_message_runs_alone(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let hooks = Arc::new(AbortFirstCommit::default());
    let protocol = Protocol::new(INBOX_TTL).with_hooks(hooks.clone());

    let messages = three_payments();
    let outcomes = batch(&store, &protocol, &messages).await;
    assert_eq!(outcomes, ["executed 201", "executed 201", "executed 201"]);
    // The batch's transaction reached its commit once and was aborted there; then each
    // message committed alone.
    assert_eq!(hooks.commits.load(Ordering::SeqCst), 1 + 3);

    let totals = store.totals().await.unwrap();
    assert_eq!(
        (totals.income, totals.returns, totals.net),
        (3, 0, 6_000),
        "one receipt per payment: nothing of the aborted batch stayed"
    );
    assert_eq!(
        keys(&TestDb::at(db.url.clone())).await,
        ["evt_1 receipt", "evt_2 receipt", "evt_3 receipt"],
        "a message's claim is gone with its receipt written: the receipt holds the key"
    );

    // The same messages again, in one batch: every one a replay, nothing written.
    let again = batch(&store, &protocol, &messages).await;
    assert_eq!(again, ["replayed 201", "replayed 201", "replayed 201"]);
    assert_eq!(store.totals().await.unwrap().income, 3);
}

/// Holds the first transaction that reaches its commit until told, and says when it got there.
#[derive(Default)]
struct HoldFirstCommit {
    arrived: tokio::sync::Notify,
    release: Arc<tokio::sync::Notify>,
    commits: AtomicUsize,
}

impl Hooks for HoldFirstCommit {
    fn before_commit(&self, _scope: &str, _key: &str) -> HookFuture {
        if self.commits.fetch_add(1, Ordering::SeqCst) > 0 {
            return Box::pin(std::future::ready(Ok(())));
        }
        self.arrived.notify_one();
        let release = self.release.clone();
        Box::pin(async move {
            release.notified().await;
            Ok(())
        })
    }
}

/// PostgreSQL: runs `first` in a batch held at its commit, then `second` in another batch of
/// another consumer; once one of the second's statements that `waiting` tells (a `LIKE`
/// pattern of its text) waits for a lock, lets the first commit. Both batches' outcomes.
async fn second_waits_for_first(
    db: &TestDb,
    store: &Store,
    first: Vec<(&'static str, Value)>,
    second: Vec<(&'static str, Value)>,
    waiting: &'static str,
) -> (Vec<String>, Vec<String>) {
    let first_hooks = Arc::new(HoldFirstCommit::default());
    let first_run = {
        let protocol = Protocol::new(INBOX_TTL).with_hooks(first_hooks.clone());
        let store = store.clone();
        tokio::spawn(async move { batch(&store, &protocol, &first).await })
    };
    first_hooks.arrived.notified().await;
    let second_run = {
        let store = store.clone();
        tokio::spawn(async move { batch(&store, &Protocol::new(INBOX_TTL), &second).await })
    };
    checkout_testkit::wait_until(
        "the second batch never waited for the first",
        std::time::Duration::from_secs(10),
        || async {
            let waiters = format!(
                "SELECT COUNT(*) FROM pg_stat_activity \
                  WHERE datname = current_database() AND wait_event_type = 'Lock' \
                    AND query LIKE '{waiting}'"
            );
            db.scalar(&waiters).await == 1
        },
    )
    .await;
    first_hooks.release.notify_one();
    (first_run.await.unwrap(), second_run.await.unwrap())
}

/// PostgreSQL: two consumers' batches share a message (a redelivery racing its first copy).
/// The second's receipt for it waits on the first's uncommitted one (the receipts' unique
/// index on the event, which is the message id the receipt holds); the first commits,
/// the second's statement is refused (the event has its receipt), and its batch runs again
/// with its claims first: it replays the first's answer while its other message runs. One
/// receipt per payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_racing_for_a_message_issue_one_receipt() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let shared = ("evt_shared", payment("pay_shared", 1_000));
    // The second batch's one statement waits on the first's uncommitted receipt.
    let (first, second) = second_waits_for_first(
        &db,
        &store,
        vec![shared.clone()],
        vec![shared, ("evt_second", payment("pay_second", 2_000))],
        "%",
    )
    .await;
    assert_eq!(first, ["executed 201"]);
    // Had the second claimed the message as new, its receipt would be refused (409) as the
    // payment's second: it replays the first consumer's answer instead.
    assert_eq!(
        second,
        ["replayed 201", "executed 201"],
        "the shared message replays the first consumer's answer"
    );
    let totals = store.totals().await.unwrap();
    assert_eq!((totals.income, totals.net), (2, 3_000));
    assert_eq!(
        keys(&db).await,
        ["evt_second receipt", "evt_shared receipt"]
    );
}

/// PostgreSQL: a batch of new messages writes its receipts and nothing else — each receipt
/// holds its message's key (the message id is its event, beside the message's fingerprint), so
/// the inbox keeps no row of its own for it (a row per message was what the inbox cost). A
/// redelivery still finds the key, and replays the first answer byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_new_messages_writes_only_its_receipts() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let protocol = Protocol::new(INBOX_TTL);
    let messages = three_payments();
    let first = answers(&store, &protocol, &messages, false).await;
    assert!(first.iter().all(|(status, _)| *status == 201), "{first:?}");

    // Not a page of the inbox was written.
    assert_eq!(db.scalar("SELECT pg_relation_size('inbox')").await, 0);
    assert_eq!(
        keys(&db).await,
        ["evt_1 receipt", "evt_2 receipt", "evt_3 receipt"]
    );
    assert_eq!(store.totals().await.unwrap().net, 6_000);

    let again = answers(&store, &protocol, &messages, true).await;
    assert_eq!(again, first, "each redelivery replays its first answer");
    assert_eq!(store.totals().await.unwrap().income, 3);
}

/// PostgreSQL: a consumer claims a message while another consumer's receipt for it is written
/// and not yet committed (the second's batch fell back to claiming first, for another message
/// it had seen before): its claim finds nothing committed, its receipt waits on the first's,
/// and once that commits it is refused. The message is not a second event of a paid payment
/// (a 409, dead-lettered): its key was taken meanwhile, so the second runs it again and
/// replays the first's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_overtaken_by_another_consumers_receipt_replays_it() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let plain = Protocol::new(INBOX_TTL);
    // Seen before: the second batch's late claim is refused at once by its receipt.
    let seen = ("evt_a_seen", payment("pay_seen", 500));
    assert_eq!(
        batch(&store, &plain, std::slice::from_ref(&seen)).await,
        ["executed 201"]
    );

    // The second batch claims the shared message first (its inbox row, uncommitted), and its
    // receipt waits on the first's.
    let shared = ("evt_shared", payment("pay_shared", 1_000));
    let (first, second) = second_waits_for_first(
        &db,
        &store,
        vec![shared.clone()],
        vec![seen, shared],
        "INSERT INTO receipts%",
    )
    .await;
    assert_eq!(first, ["executed 201"]);
    assert_eq!(
        second,
        ["replayed 201", "replayed 201"],
        "the shared message replays the first consumer's answer"
    );
    let totals = store.totals().await.unwrap();
    assert_eq!((totals.income, totals.net), (2, 1_500));
    assert_eq!(
        keys(&db).await,
        ["evt_a_seen receipt", "evt_shared receipt"]
    );
}

/// PostgreSQL: a batch of new messages costs three round trips whatever its size — BEGIN, one
/// statement writing every receipt and the inbox's row of every message, COMMIT — whatever
/// else the pool does: no ping of a connection in steady use before it is lent (sqlx's
/// default, a round trip per batch for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_new_messages_is_three_round_trips() {
    let db = TestDb::new(Backend::Postgres).await;
    let cluster = checkout_testkit::postgres::cluster();
    let database = db.url.rsplit('/').next().unwrap();
    assert_eq!(db.url, cluster.url(database));
    // A link with no delay: it only witnesses what the consumer sends.
    let link = SlowLink::start(cluster.port, Duration::ZERO).await;
    let store = Store::open(&format!(
        "postgres://postgres@127.0.0.1:{}/{database}",
        link.port
    ))
    .await
    .expect("the store opens");
    let protocol = Protocol::new(INBOX_TTL);
    let first = [("evt_0", payment("pay_0", 500))];
    assert_eq!(batch(&store, &protocol, &first).await, ["executed 201"]);
    // sqlx pings each connection given back to its pool (which also sends the ROLLBACK of a
    // transaction dropped unfinished), off the batch's way: the first batch's, seen, so that it
    // is not taken for the next batch's.
    checkout_testkit::wait_until(
        "the first batch's connection given back",
        Duration::from_secs(5),
        || {
            let sends = link.sends();
            async move { sends.last() == Some(&b'S') }
        },
    )
    .await;

    let before = link.sends().len();
    let outcomes = batch(&store, &protocol, &three_payments()).await;
    assert_eq!(outcomes, ["executed 201", "executed 201", "executed 201"]);
    // What the batch sent, by PostgreSQL's message types: Q a simple query (BEGIN, COMMIT), B a
    // prepared statement's execution, S a lone Sync (sqlx's ping; the one that gives the
    // connection back after the batch may or may not be sent yet). Left out: P, a statement
    // prepared on a connection's first use, and a new connection's startup (0): the pool lends
    // whichever connection it likes.
    let sent = link.message_types_since(before);
    assert_eq!(
        sent.trim_end_matches('S'),
        "QBQ",
        "BEGIN, the receipts with the inbox's rows in one statement, COMMIT"
    );
    assert_eq!(store.totals().await.unwrap().net, 6_500);
}
