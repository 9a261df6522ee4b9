//! The receipts campaign: the checkout publishing its outbox to RabbitMQ and two `receipts`
//! consumers sharing the quorum queue (prefetch 50), under a steady load of payments and
//! refunds, while every so often one consumer is SIGKILLed (with whatever it holds
//! unacknowledged, committed or not) and started again, and now and then the broker is
//! restarted under them. Afterwards every payment and every refund must have exactly one
//! receipt of its amount, none may be dead-lettered, every event must be published and
//! confirmed, and the books must balance. Counted from the consumers' own logs (a killed
//! process's counters die with it): messages redelivered, duplicates absorbed by the inbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use checkout_testkit::rabbitmq::BrokerCluster;
use checkout_testkit::receipts::{Consumer, mismatches_with_the_books};
use checkout_testkit::{Api, Backend, Server, Shop, TestDb, new_key, pay_session};
use reqwest::StatusCode;

#[derive(Clone, Debug)]
pub struct ReceiptsPlan {
    pub backend: Backend,
    /// Clients paying and refunding at once.
    pub clients: usize,
    /// How long the load and the chaos go on.
    pub load: Duration,
    /// Time between two acts of chaos.
    pub chaos_every: Duration,
    /// Every this many acts, the broker is restarted (one node: stopped and started; a
    /// cluster: one node SIGKILLed and started again, in turn); else a consumer is killed.
    pub broker_every: u64,
    /// RabbitMQ nodes: 1, or a cluster of 3 (the quorum queue survives one node's death).
    pub broker_nodes: usize,
}

#[derive(Clone, Debug, Default)]
pub struct ReceiptsReport {
    pub backend: String,
    pub requests: u64,
    pub payments: u64,
    pub refunds: u64,
    pub consumer_kills: u64,
    pub broker_restarts: u64,
    pub receipts: usize,
    /// Deliveries the broker flagged `redelivered`.
    pub redelivered: usize,
    /// Messages whose receipt existed already: absorbed, nothing changed.
    pub duplicates_absorbed: usize,
    pub dead_lettered: usize,
    /// From the end of the load until every receipt was there.
    pub drained_in: Duration,
    pub violations: Vec<String>,
}

impl ReceiptsReport {
    pub fn summary(&self) -> String {
        format!(
            "receipts on {}: {} requests, {} payments + {} refunds, {} consumer kills, {} broker \
             restarts; {} receipts, {} redelivered, {} duplicates absorbed, {} dead-lettered, \
             drained in {:.1} s; {} violations",
            self.backend,
            self.requests,
            self.payments,
            self.refunds,
            self.consumer_kills,
            self.broker_restarts,
            self.receipts,
            self.redelivered,
            self.duplicates_absorbed,
            self.dead_lettered,
            self.drained_in.as_secs_f64(),
            self.violations.len()
        )
    }
}

/// Runs the campaign with `server_bin` (a checkout-server) and `receipts_bin`.
pub async fn run(plan: &ReceiptsPlan, server_bin: &str, receipts_bin: &str) -> ReceiptsReport {
    let nodes = plan.broker_nodes;
    let broker = Arc::new(
        tokio::task::spawn_blocking(move || BrokerCluster::start(nodes))
            .await
            .unwrap(),
    );
    let db = TestDb::new(plan.backend).await;
    let receipts_db = TestDb::new(plan.backend).await;
    // Every node, comma-separated: the checkout and the consumers move to the next one that
    // lives when theirs dies.
    let url = broker.urls();
    // Each ack waits 20 ms after its commit (as over a slow link): a kill then finds more
    // messages committed and unacknowledged, each of which must come back and be absorbed.
    let consumer_env = [
        ("RECEIPTS_PREFETCH", "50"),
        ("RECEIPTS_FAULTS", "delay_after_commit_ms=20"),
    ];
    let start_consumer = || Consumer::start(receipts_bin, &url, &receipts_db.url, &consumer_env);
    let mut consumers = [start_consumer().await, start_consumer().await];
    consumers[0]
        .wait_for_log("consuming", Duration::from_secs(60))
        .await;
    let server = Server::start_with(
        server_bin,
        &db,
        &[
            ("CHECKOUT_AMQP_URL", &url),
            ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
        ],
    )
    .await;
    let shop = server.add_shop("Лавка под нагрузкой").await;

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut clients = Vec::new();
    for client in 0..plan.clients {
        let (api, shop, stop, counts) = (server.api(), shop.clone(), stop.clone(), counts.clone());
        clients.push(tokio::spawn(async move {
            trade(client, &api, &shop, &stop, &counts).await
        }));
    }

    let mut report = ReceiptsReport {
        backend: format!("{:?}", plan.backend).to_lowercase(),
        ..ReceiptsReport::default()
    };
    let mut graveyard = Vec::new();
    let started = Instant::now();
    let mut act = 0u64;
    while started.elapsed() < plan.load {
        tokio::time::sleep(plan.chaos_every).await;
        act += 1;
        if act.is_multiple_of(plan.broker_every) {
            let (broker, which) = (broker.clone(), report.broker_restarts as usize);
            tokio::task::spawn_blocking(move || match broker.nodes.as_slice() {
                // One node: stopped as an operator would (a SIGKILLed lone node may lose what
                // it confirmed but had not yet written: README).
                [node] => {
                    node.stop();
                    node.start_again();
                }
                // A cluster: a node dies outright, and comes back on its data.
                nodes => {
                    let node = &nodes[which % nodes.len()];
                    node.kill();
                    node.start_again();
                }
            })
            .await
            .unwrap();
            report.broker_restarts += 1;
        } else {
            let which = (act % 2) as usize;
            consumers[which].kill();
            let fresh = start_consumer().await;
            graveyard.push(std::mem::replace(&mut consumers[which], fresh));
            report.consumer_kills += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        if let Err(why) = client.await.unwrap() {
            report.violations.push(why);
        }
    }
    let ended = Instant::now();
    report.requests = counts[0].load(Ordering::SeqCst);
    report.payments = counts[1].load(Ordering::SeqCst);
    report.refunds = counts[2].load(Ordering::SeqCst);
    let expected = (report.payments + report.refunds) as usize;

    // Every receipt, within two minutes of the load's end.
    let deadline = ended + Duration::from_secs(120);
    while consumers[0].count().await < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = consumers[0].listed().await;
    report.drained_in = ended.elapsed();
    report.receipts = listed["receipts"].as_array().unwrap().len();
    if report.receipts != expected {
        report.violations.push(format!(
            "{} receipts for {} payments and {} refunds",
            report.receipts, report.payments, report.refunds
        ));
    }
    report
        .violations
        .extend(mismatches_with_the_books(&db, &listed).await);
    let unpublished = db
        .scalar("SELECT COUNT(*) FROM webhook_events WHERE published_at IS NULL")
        .await;
    if unpublished > 0 {
        report.violations.push(format!(
            "{unpublished} events never confirmed by the broker"
        ));
    }
    for broken in db.broken_invariants().await {
        report
            .violations
            .push(format!("invariant broken: {broken}"));
    }
    let logs: Vec<String> = graveyard
        .iter()
        .chain(consumers.iter())
        .map(Consumer::log)
        .collect();
    let count = |needle: &str| logs.iter().map(|log| log.matches(needle).count()).sum();
    report.redelivered = count("redelivered=true");
    report.duplicates_absorbed = count("a message seen before");
    report.dead_lettered = count("message dead-lettered");
    if report.dead_lettered > 0 {
        report
            .violations
            .push(format!("{} messages dead-lettered", report.dead_lettered));
    }
    report
}

/// One client: pays sessions of its shop (a new test shopper whenever the last one's test
/// money runs low) and refunds a part of every fourth payment, until told to stop. Every
/// request is answered at once here: the checkout is not attacked in this campaign.
async fn trade(
    client: usize,
    api: &Api,
    shop: &Shop,
    stop: &AtomicBool,
    counts: &[AtomicU64; 3],
) -> Result<(), String> {
    let mut shopper = api.shopper().await;
    let mut spent = 0;
    let mut i = 0i64;
    while !stop.load(Ordering::SeqCst) {
        let amount = 100 + i % 50;
        if spent + amount > 90_000 {
            shopper = api.shopper().await;
            spent = 0;
        }
        let session = shop.session(&format!("R{client}-{i}"), amount).await;
        let paid = shopper.pay(&new_key(), &pay_session(&session)).await;
        counts[0].fetch_add(2, Ordering::SeqCst);
        if paid.status != StatusCode::CREATED {
            return Err(format!("a payment answered {}: {}", paid.status, paid.body));
        }
        counts[1].fetch_add(1, Ordering::SeqCst);
        spent += amount;
        if i % 4 == 0 {
            let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
            let refund = shop.refund(&payment_id, &new_key(), 50).await;
            counts[0].fetch_add(1, Ordering::SeqCst);
            if refund.status != StatusCode::CREATED {
                return Err(format!(
                    "a refund answered {}: {}",
                    refund.status, refund.body
                ));
            }
            counts[2].fetch_add(1, Ordering::SeqCst);
        }
        i += 1;
    }
    Ok(())
}
