//! What the receipts consumer's inbox costs, and how far behind the money its receipts come
//! (`checkout-bench --receipts N`, written to bench/receipts.md and BENCHMARKS.md's section).
//!
//! Throughput: N `payment.succeeded` messages are put on a fresh quorum queue of a real
//! RabbitMQ node, then consumed the consumer's way (its default prefetch, batches of what is here, a few
//! written at once, ack after the commit), once through the inbox (`issue_receipts`: claim the
//! message ids, write the receipts, store the outcomes, commit) and once writing the same
//! receipts alone in one transaction, alternately, seven times each, on SQLite and on
//! PostgreSQL. Lag: the checkout (publishing to the broker) and
//! the real `receipts` binary under the bench's load; from each payment's time (taken in its
//! transaction, just before its commit) to its receipt's commit.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use checkout_idempotency::{Outcome, Protocol};
use checkout_receipts::consumer::{self, ConsumerSettings, INBOX_TTL};
use checkout_receipts::receipt;
use checkout_receipts::store::Store;
use checkout_testkit::rabbitmq::Broker;
use checkout_testkit::receipts::Consumer;
use checkout_testkit::{Backend, Server, TestDb, new_key, pay_session};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use serde_json::json;

const PREFETCH: u16 = consumer::DEFAULT_PREFETCH;
/// Runs of each, alternately: the machine is shared, and the best of several is what the
/// consumer can do.
const RUNS: usize = 9;

pub struct Throughput {
    pub database: &'static str,
    pub messages: usize,
    /// Each run in the order run.
    pub with_inbox: Vec<Run>,
    pub without: Vec<Run>,
}

/// One consumption of the queue.
pub struct Run {
    /// Receipts per second.
    pub rate: f64,
    /// Messages per transaction, on average: what the consumer's batches came to.
    pub batch: f64,
}

impl Throughput {
    fn best(runs: &[Run]) -> f64 {
        runs.iter().map(|run| run.rate).fold(0.0, f64::max)
    }

    pub fn ratio(&self) -> f64 {
        Self::best(&self.with_inbox) / Self::best(&self.without)
    }

    /// The median of each run with the inbox against the run without it beside it: the two
    /// of a pair share the machine's moment, which the bests of all runs need not.
    pub fn paired_ratio(&self) -> f64 {
        let mut ratios: Vec<f64> = self
            .with_inbox
            .iter()
            .zip(&self.without)
            .map(|(with, without)| with.rate / without.rate)
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    }
}

pub struct Lag {
    pub database: &'static str,
    pub poll_ms: u64,
    pub clients: usize,
    pub payments: usize,
    pub payments_per_second: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Puts `messages` payment events on a fresh queue, then consumes them all with or without
/// the inbox: receipts per second.
async fn consume_once(
    broker: &Broker,
    backend: Backend,
    messages: usize,
    inbox: bool,
    run: usize,
) -> Run {
    let db = durable(backend).await;
    let store = Store::open(&db.url)
        .await
        .expect("the receipts' database opens");
    let settings = ConsumerSettings {
        amqp_url: broker.url(),
        queue: format!("bench.{}.{run}", if inbox { "inbox" } else { "plain" }),
        prefetch: PREFETCH,
    };
    let connection =
        lapin::Connection::connect(&settings.amqp_url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
    let channel = connection.create_channel().await.unwrap();
    consumer::declare(&channel, &settings).await.unwrap();
    fill(
        &connection.create_channel().await.unwrap(),
        &settings.queue,
        messages,
        run,
    )
    .await;

    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let mut deliveries = channel
        .basic_consume(
            settings.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let protocol = Protocol::new(INBOX_TTL);
    let done = Arc::new(AtomicUsize::new(0));
    let (finished, mut all_done) = tokio::sync::mpsc::channel::<()>(1);
    let turns = Arc::new(tokio::sync::Semaphore::new(consumer::BATCHES_AT_ONCE));
    let started = Instant::now();
    let (mut taken, mut batches) = (0, 0);
    // The consumer's own loop: batches of what is here, a few written at once.
    while taken < messages {
        let turn = turns.clone().acquire_owned().await.unwrap();
        let batch = consumer::next_batch(&mut deliveries, usize::from(PREFETCH))
            .await
            .unwrap();
        taken += batch.len();
        batches += 1;
        let (store, protocol, queue, done, finished) = (
            store.clone(),
            protocol.clone(),
            settings.queue.clone(),
            done.clone(),
            finished.clone(),
        );
        tokio::spawn(async move {
            let (read, receipts): (Vec<(String, serde_json::Value)>, Vec<receipt::NewReceipt>) =
                batch
                    .iter()
                    .map(|delivery| {
                        let id = consumer::message_id(delivery);
                        let (body, receipt) = consumer::read(&id, &delivery.data).unwrap();
                        ((id, body), receipt)
                    })
                    .unzip();
            if inbox {
                let outcomes = consumer::issue_receipts(
                    &store,
                    &protocol,
                    &queue,
                    read.iter()
                        .zip(receipts)
                        .map(|((id, body), receipt)| (id.as_str(), body, receipt))
                        .collect(),
                )
                .await;
                for outcome in outcomes {
                    let outcome = outcome.unwrap();
                    assert!(matches!(outcome, Outcome::Executed { .. }), "{outcome:?}");
                }
            } else {
                let now = checkout_idempotency::now_ms();
                let written = store.insert_without_inbox(&receipts, now).await.unwrap();
                assert_eq!(written, receipts.len());
            }
            futures::future::join_all(
                batch
                    .iter()
                    .map(|delivery| delivery.ack(BasicAckOptions::default())),
            )
            .await;
            drop(turn);
            if done.fetch_add(read.len(), Ordering::SeqCst) + read.len() == messages {
                let _ = finished.send(()).await;
            }
        });
    }
    all_done.recv().await;
    let run = Run {
        rate: messages as f64 / started.elapsed().as_secs_f64(),
        batch: messages as f64 / batches as f64,
    };
    // A quorum queue left behind keeps its Raft members ticking on the broker: every later run
    // would pay for the ones before it.
    for queue in [settings.dead_letter_queue(), settings.queue.clone()] {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    run
}

/// A fresh database that keeps what it commits: SQLite's files are `synchronous=FULL` (the
/// consumer's and the checkout's own setting); PostgreSQL the cluster with `fsync` on, not the
/// tests' one without it.
async fn durable(backend: Backend) -> TestDb {
    match backend {
        Backend::Postgres => TestDb::on(checkout_testkit::postgres::durable_cluster()).await,
        other => TestDb::new(other).await,
    }
}

/// An id as the checkout makes them (time-ordered: the indexes they go into grow at one end).
fn checkout_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

/// `messages` distinct payment events on `queue`, confirmed by the broker.
async fn fill(channel: &Channel, queue: &str, messages: usize, run: usize) {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::with_capacity(messages);
    for i in 0..messages {
        let event = json!({"type": "payment.succeeded", "livemode": false,
            "timestamp": "2026-12-04T10:00:00.000Z",
            "data": {"payment_id": checkout_id("pay_"), "order_id": format!("B-{run}-{i}"),
                     "amount": 1_500, "currency": "RUB", "status": "succeeded",
                     "items": [{"name": "Чай", "quantity": 1, "unit_price": 1_000},
                               {"name": "Мёд", "quantity": 1, "unit_price": 500}]}});
        let properties = BasicProperties::default()
            .with_message_id(checkout_id("evt_").into())
            .with_delivery_mode(2);
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    event.to_string().as_bytes(),
                    properties,
                )
                .await
                .unwrap(),
        );
    }
    for confirm in confirms {
        assert!(confirm.await.unwrap().is_ack());
    }
}

pub async fn throughput(broker: &Broker, messages: usize) -> Vec<Throughput> {
    let mut results = Vec::new();
    let mut run = 0;
    for (database, backend) in [
        ("SQLite", Backend::Sqlite),
        ("PostgreSQL", Backend::Postgres),
    ] {
        let mut result = Throughput {
            database,
            messages,
            with_inbox: Vec::new(),
            without: Vec::new(),
        };
        // The first queue of a run is consumed faster than any after it, whatever it holds (the
        // broker's fresh log): it warms up and counts for neither.
        run += 1;
        consume_once(broker, backend, messages, false, run).await;
        // Each pair's order turned round from the last: whatever drifts over a run (the
        // broker's log, the cluster's checkpoints) falls on both sides alike.
        let pairs = (0..RUNS).map(|pair| [pair % 2 == 1, pair % 2 == 0]);
        for inbox in pairs.flatten() {
            run += 1;
            let measured = consume_once(broker, backend, messages, inbox, run).await;
            eprintln!(
                "{database}: {:.0} receipts/s {} (batches of {:.1} on average)",
                measured.rate,
                if inbox { "with the inbox" } else { "without" },
                measured.batch
            );
            if inbox {
                result.with_inbox.push(measured);
            } else {
                result.without.push(measured);
            }
        }
        results.push(result);
    }
    results
}

/// The checkout under `clients` paying clients for `seconds`, publishing to `broker`, and the
/// real consumer: from each payment to its receipt.
pub async fn lag(
    broker: &Broker,
    server_bin: &str,
    receipts_bin: &str,
    backend: Backend,
    poll_ms: u64,
    clients: usize,
    seconds: u64,
) -> Lag {
    let db = durable(backend).await;
    let receipts_db = durable(backend).await;
    let queue = format!(
        "bench.lag.{poll_ms}.{}",
        if backend == Backend::Sqlite {
            "sqlite"
        } else {
            "postgres"
        }
    );
    let consumer = Consumer::start(
        receipts_bin,
        &broker.url(),
        &receipts_db.url,
        &[("RECEIPTS_QUEUE", &queue)],
    )
    .await;
    let poll = poll_ms.to_string();
    let url = broker.url();
    let server = Server::start_with(
        server_bin,
        &db,
        &[
            ("CHECKOUT_AMQP_URL", &url),
            ("CHECKOUT_WEBHOOK_POLL_MS", &poll),
        ],
    )
    .await;
    // The queue exists before the first payment (the consumer declared it on starting).
    let consuming = Instant::now();
    while consumer.counter("receipts_consuming").await < 1.0 {
        assert!(
            consuming.elapsed() < Duration::from_secs(30),
            "the consumer consumes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shop = server.add_shop("Лавка для замеров").await;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (api, shop) = (server.api(), shop.clone());
        tasks.push(tokio::spawn(async move {
            let mut shopper = api.shopper().await;
            let (mut paid, mut spent) = (0usize, 0i64);
            while Instant::now() < deadline {
                if spent > 99_000 {
                    shopper = api.shopper().await;
                    spent = 0;
                }
                let session = shop.session(&format!("L{client}-{paid}"), 100).await;
                let answer = shopper.pay(&new_key(), &pay_session(&session)).await;
                assert_eq!(answer.status, 201, "{}", answer.body);
                paid += 1;
                spent += 100;
            }
            paid
        }));
    }
    let mut payments = 0;
    for task in tasks {
        payments += task.await.unwrap();
    }
    let payments_per_second = payments as f64 / seconds as f64;
    consumer
        .wait_for_receipts(payments, Duration::from_secs(120))
        .await;
    let paid_at: std::collections::HashMap<String, i64> = db
        .texts("SELECT payment_id || ' ' || CAST(created_at AS TEXT) FROM payments")
        .await
        .into_iter()
        .map(|row| {
            let (id, at) = row.split_once(' ').unwrap();
            (id.to_owned(), at.parse().unwrap())
        })
        .collect();
    let mut lags: Vec<f64> = TestDb::at(receipts_db.url.clone())
        .texts("SELECT payment_id || ' ' || CAST(issued_at AS TEXT) FROM receipts")
        .await
        .into_iter()
        .map(|row| {
            let (id, at) = row.split_once(' ').unwrap();
            (at.parse::<i64>().unwrap() - paid_at[id]) as f64 / 1_000.0
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    let at = |q: f64| lags[((lags.len() as f64 - 1.0) * q).round() as usize];
    Lag {
        database: if backend == Backend::Sqlite {
            "SQLite"
        } else {
            "PostgreSQL"
        },
        poll_ms,
        clients,
        payments,
        payments_per_second,
        p50: at(0.50),
        p99: at(0.99),
        max: at(1.0),
    }
}

pub fn markdown(throughput: &[Throughput], lags: &[Lag]) -> String {
    let mut md = String::new();
    writeln!(md, "Written by `scripts/bench --receipts N` (`bench/src/receipts.rs`) from one run, on a real RabbitMQ node (Debian's 3.10.8).\n").unwrap();
    writeln!(md, "**Consumer throughput, with the inbox and without it.** N `payment.succeeded` messages on a fresh quorum queue, consumed the consumer's way (prefetch {PREFETCH}; each batch is whatever deliveries are here, up to {BATCHES} batches written at once; ack after the commit): \"with the inbox\" runs the protocol for the batch (`Protocol::execute_many`, the protocol's late claim: each receipt holds its message's id and fingerprint, and the inbox writes no row of its own for it; on PostgreSQL one statement writing every receipt of the batch, on SQLite each receipt; then one commit), \"without\" writes the same receipts in one transaction alone, the same way (on PostgreSQL one statement). Alternately, {RUNS} times each, after one run that counts for neither (the first queue of a broker is consumed faster than any after it); each pair run in turn, its order turned round from the last (without first in odd pairs, with the inbox first in even ones), so that what drifts over a run falls on both sides alike; two ratios: of the best of each, and the median of each pair's (a run with the inbox against the run without it beside it, on the machine as it was then); in brackets, the messages per transaction on average. Durable both: SQLite `synchronous=FULL`, PostgreSQL with `fsync` on. Goal: ≥ 0.9 on PostgreSQL (issue 37; 0.8 before).\n", BATCHES = consumer::BATCHES_AT_ONCE).unwrap();
    writeln!(md, "| database | messages | without the inbox (receipts/s) | with the inbox (receipts/s) | best ÷ best | median of pairs |").unwrap();
    writeln!(md, "|---|---|---|---|---|---|").unwrap();
    let runs = |runs: &[Run]| {
        runs.iter()
            .map(|run| format!("{:.0} ({:.1})", run.rate, run.batch))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for t in throughput {
        writeln!(
            md,
            "| {} | {} | {} | {} | **{:.2}** | **{:.2}** |",
            t.database,
            t.messages,
            runs(&t.without),
            runs(&t.with_inbox),
            t.ratio(),
            t.paired_ratio()
        )
        .unwrap();
    }
    writeln!(md, "\n**End-to-end lag, from the payment to its receipt.** The checkout (release build) publishing its outbox to the broker, the real `receipts` binary consuming, clients paying as fast as they are answered; from each payment's time (taken in its transaction, just before its commit) to its receipt's commit. At this load (the checkout saturated by 32 clients, on the same 2 cores as the database, the broker, the consumer and the load generator) the consumer keeps up: it issues receipts several times faster than the checkout takes payments here. The lag is the outbox's wait (its poll interval, `CHECKOUT_WEBHOOK_POLL_MS`, when it was empty), the publisher's confirm, the broker's delivery, and the consumer's batch and commit.\n").unwrap();
    writeln!(
        md,
        "| database | outbox poll | clients | payments | payments/s | lag p50 | lag p99 | lag max |"
    )
    .unwrap();
    writeln!(md, "|---|---|---|---|---|---|---|---|").unwrap();
    for l in lags {
        writeln!(
            md,
            "| {} | {} ms | {} | {} | {:.0} | {:.3} s | {:.3} s | {:.3} s |",
            l.database,
            l.poll_ms,
            l.clients,
            l.payments,
            l.payments_per_second,
            l.p50,
            l.p99,
            l.max
        )
        .unwrap();
    }
    md
}
