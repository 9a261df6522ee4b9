//! A batch of messages through the protocol in one transaction (`issue_receipts`, what the
//! consumer runs for each batch of deliveries), on each database: new messages get their
//! receipts; a copy inside the same batch and a message seen in an earlier batch change
//! nothing and get the first answer; a second event of a payment that has its receipt is
//! refused with that receipt's id; a message id reused with another body is told apart; a
//! message whose inbox row has expired runs afresh, and its payment's receipt still refuses a
//! second one. The receipts and the inbox are then what the books say. A batch whose
//! transaction fails commits nothing of itself, and each of its messages then runs alone. Two
//! consumers racing for one message (PostgreSQL) issue one receipt. A batch of new messages
//! writes each inbox row once, and costs three round trips whatever its size.

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

/// Each inbox row as "message status response_status", by message id.
async fn inbox(db: &TestDb) -> Vec<String> {
    db.texts(
        "SELECT message_id || ' ' || status || ' ' || CAST(response_status AS TEXT) \
           FROM inbox ORDER BY message_id",
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

    // evt_2's row expired (older than the inbox's TTL), then evt_2 again beside a new message:
    // the key is taken over and runs afresh, and the receipts' own index refuses pay_2 a second
    // receipt. One row for evt_2 still, fresh, with that refusal.
    let raw = TestDb::at(db.url.clone());
    raw.execute("UPDATE inbox SET created_at = 0 WHERE message_id = 'evt_2'")
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
    assert_eq!(evt_2, ["fresh"], "one row for the message, taken over");

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
    // Every message the batches took is done in the inbox, with its answer.
    let inbox = inbox(&raw).await;
    assert_eq!(
        inbox,
        [
            "evt_1 done 201",
            "evt_2 done 409",
            "evt_3 done 201",
            "evt_3b done 409",
            "evt_4 done 201"
        ]
    );
}

/// Every message of the second batch is new, but one is a second event of a payment that has
/// its receipt: on PostgreSQL the batch's one statement (its receipts and its keys) is refused
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
    let answers: Vec<(u16, String)> = outcomes(&store, &protocol, &second)
        .await
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Executed { response, .. } => (response.status, response.body),
            other => panic!("{other:?}"),
        })
        .collect();
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
        inbox(&TestDb::at(db.url.clone())).await,
        ["evt_1 done 201", "evt_1b done 409", "evt_2 done 201"]
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
    let inbox = inbox(&TestDb::at(db.url.clone())).await;
    assert_eq!(
        inbox,
        ["evt_1 done 201", "evt_2 done 201", "evt_3 done 201"]
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

/// PostgreSQL: two consumers' batches share a message (a redelivery racing its first copy).
/// The second's receipt for it waits on the first's uncommitted one (the receipts' unique
/// index; its id is claimed in the same statement, after its receipts); the first commits,
/// the second's statement is refused (the event has its receipt), and its batch runs again
/// with its claims first: it replays the first's answer while its other message runs. One
/// receipt per payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_racing_for_a_message_issue_one_receipt() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let first_hooks = Arc::new(HoldFirstCommit::default());
    let first = Protocol::new(INBOX_TTL).with_hooks(first_hooks.clone());
    let second = Protocol::new(INBOX_TTL);

    let shared = ("evt_shared", payment("pay_shared", 1_000));
    let first_run = {
        let (store, shared) = (store.clone(), shared.clone());
        tokio::spawn(async move {
            let messages = [(shared.0, shared.1)];
            batch(&store, &first, &messages).await
        })
    };
    first_hooks.arrived.notified().await;
    let second_run = {
        let store = store.clone();
        tokio::spawn(async move {
            let messages = [shared, ("evt_second", payment("pay_second", 2_000))];
            batch(&store, &second, &messages).await
        })
    };
    // The second batch waits on the first's uncommitted receipt.
    checkout_testkit::wait_until(
        "the second batch never waited for the first",
        std::time::Duration::from_secs(10),
        || async {
            db.scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await
                == 1
        },
    )
    .await;
    first_hooks.release.notify_one();

    assert_eq!(first_run.await.unwrap(), ["executed 201"]);
    // Had the second claimed the message as new, its receipt would be refused (409) as the
    // payment's second: it replays the first consumer's answer instead.
    assert_eq!(
        second_run.await.unwrap(),
        ["replayed 201", "executed 201"],
        "the shared message replays the first consumer's answer"
    );
    let totals = store.totals().await.unwrap();
    assert_eq!((totals.income, totals.net), (2, 3_000));
    assert_eq!(
        inbox(&db).await,
        ["evt_second done 201", "evt_shared done 201"]
    );
}

/// PostgreSQL: a batch of new messages writes each message id once — its inbox row, inserted
/// with its outcome after the receipts (the protocol's late claim), in one statement — rather
/// than a claim and then its update (two row versions each, and a statement more per batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_new_messages_writes_each_inbox_row_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = Store::open(&db.url).await.expect("the store opens");
    let protocol = Protocol::new(INBOX_TTL);
    let messages = three_payments();
    let outcomes = batch(&store, &protocol, &messages).await;
    assert_eq!(outcomes, ["executed 201", "executed 201", "executed 201"]);

    // Every version of an inbox row the batch left in the table's page, live or dead (a page
    // this empty is never pruned).
    db.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        .await;
    let versions = db
        .scalar("SELECT COUNT(*) FROM heap_page_items(get_raw_page('inbox', 0))")
        .await;
    assert_eq!(versions, 3, "one row version per message id");
    assert_eq!(
        inbox(&db).await,
        ["evt_1 done 201", "evt_2 done 201", "evt_3 done 201"]
    );
    assert_eq!(store.totals().await.unwrap().net, 6_000);
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
