//! The failover campaign on the engines an operator deploys beyond one machine: Patroni (three
//! PostgreSQL nodes over three etcd members), HAProxy in front of the database and of two
//! checkout instances, and (when the plan asks for receipts) a three-node RabbitMQ cluster with
//! two `receipts` consumers. Under load (sessions, payments, refunds, some sent twice at once)
//! the plan's faults strike in turn: the Patroni leader's PostgreSQL SIGKILLed, an etcd member,
//! a RabbitMQ node, a checkout instance, HAProxy. Replication is synchronous, or asynchronous to
//! count what that loses; the nodes may stream over a slow link (another zone's distance).
//!
//! Afterwards every request without a definite answer is resent with its key until it has one,
//! every event is left to be delivered, and the campaign counts what a shop and a shopper would
//! check: acknowledged payments and refunds that exist exactly once (or were lost by the
//! promotion), double charges, `5xx` other than `503`, `503` without `Retry-After`, the seconds
//! each fault left the checkout unable to take a payment, `verify`, and the receipts.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkout_testkit::patroni::{HaCluster, HaSettings};
use checkout_testkit::rabbitmq::BrokerCluster;
use checkout_testkit::receipts::{Consumer, mismatches_with_the_books};
use checkout_testkit::receiver::Receiver;
use checkout_testkit::{Answer, Api, Server, TestDb, add_shop_with, new_key, session_request};
use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};

#[derive(Clone, Debug, Default)]
pub struct FailoverReport {
    pub replication: String,
    pub failovers: u32,
    pub requests: u64,
    pub duplicates: u64,
    /// Payments and refunds a client received a `2xx` for.
    pub payments_acknowledged: u64,
    pub refunds_acknowledged: u64,
    /// Of those, missing after the promotion (their keys then ran again: a first execution).
    pub acknowledged_lost: u64,
    /// Sessions a shop was given that the promotion lost.
    pub sessions_lost: u64,
    /// Stored refusals (`402`, `409`…) a client was given that the promotion lost with their
    /// keys: resent, the request ran again and may have been answered otherwise.
    pub refusals_lost: u64,
    /// Requests answered by nobody or by `503`, resent with their key afterwards.
    pub in_doubt: u64,
    pub resolved_by_replay: u64,
    pub resolved_by_first_execution: u64,
    pub unavailable_503: u64,
    pub without_retry_after: u64,
    pub other_5xx: u64,
    /// Shopper charged twice for one session or by one key (from `verify`).
    pub double_charges: u64,
    /// From the primary's death to the first `2xx` of a request sent after it.
    pub outages: Vec<Duration>,
    /// The same per fault, named by its kind (`leader's postgres killed`, …).
    pub outages_by_fault: Vec<(String, Duration)>,
    /// `2xx` answers after the last failover (the checkout recovered without a restart).
    pub answered_after_last: u64,
    pub events: i64,
    pub events_undelivered: i64,
    /// From the end of the load to the last event delivered (none: not within the bound).
    pub drained_after: Option<Duration>,
    /// What the deployment cost: idle before the load, and under it (when measured).
    pub idle: Option<crate::footprint::Sample>,
    pub under_load: Option<crate::footprint::Cost>,
    /// Events the shop received for a payment or refund the promotion then lost.
    pub events_of_lost_changes: u64,
    /// Fiscal receipts issued by the consumers (when the campaign has a broker).
    pub receipts: Option<usize>,
    pub verify_holds: bool,
    pub verify_took: Duration,
    pub violations: Vec<String>,
}

impl FailoverReport {
    pub fn outage_median_max(&self) -> (f64, f64) {
        let mut secs: Vec<f64> = self.outages.iter().map(Duration::as_secs_f64).collect();
        secs.sort_by(f64::total_cmp);
        match secs.len() {
            0 => (0.0, 0.0),
            n => (secs[n / 2], secs[n - 1]),
        }
    }

    pub fn summary(&self) -> String {
        let (median, max) = self.outage_median_max();
        format!(
            "failover ({}): {} failovers, {} requests ({} duplicates); acknowledged {} payments, \
             {} refunds; lost {} acknowledged (+{} sessions, {} refusals); in doubt {} (replayed {}, first \
             executions {}); 503 {} (without Retry-After {}), other 5xx {}; double charges {}; \
             unavailable median {median:.2} s, max {max:.2} s; answered after the last {}; \
             events {} ({} undelivered, {} of lost changes); verify {} in {:.2} s; {} violations",
            self.replication,
            self.failovers,
            self.requests,
            self.duplicates,
            self.payments_acknowledged,
            self.refunds_acknowledged,
            self.acknowledged_lost,
            self.sessions_lost,
            self.refusals_lost,
            self.in_doubt,
            self.resolved_by_replay,
            self.resolved_by_first_execution,
            self.unavailable_503,
            self.without_retry_after,
            self.other_5xx,
            self.double_charges,
            self.answered_after_last,
            self.events,
            self.events_undelivered,
            self.events_of_lost_changes,
            if self.verify_holds { "holds" } else { "BROKEN" },
            self.verify_took.as_secs_f64(),
            self.violations.len(),
        ) + &self
            .receipts
            .map(|n| format!("; {n} receipts, matching the books"))
            .unwrap_or_default()
            + &self
                .drained_after
                .map(|d| format!("; outbox drained {:.1} s after the load", d.as_secs_f64()))
                .unwrap_or_default()
            + &match (self.idle, self.under_load) {
                (Some(idle), Some(load)) => format!(
                    "; idle {} MiB over {} processes, under load at most {} MiB over {}, {:.2} cores",
                    idle.pss_bytes >> 20,
                    idle.processes,
                    load.peak.pss_bytes >> 20,
                    load.peak.processes,
                    load.cores
                ),
                _ => String::new(),
            }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Session,
    Payment,
    Refund,
}

#[derive(Clone, Debug)]
struct Request {
    kind: Kind,
    token: String,
    path: String,
    body: Value,
}

#[derive(Default)]
struct Book {
    requests: HashMap<String, Request>,
    /// The first definite answer a client saw for each key.
    first: HashMap<String, Answer>,
    /// When each `2xx` was answered, and when its request was sent.
    successes: Vec<(Instant, Instant)>,
    /// Requests sent (each copy counted).
    sends: u64,
    unavailable_503: u64,
    without_retry_after: u64,
    other_5xx: Vec<String>,
}

/// A definite answer: the key's stored outcome.
fn is_definite(answer: &Answer) -> bool {
    answer.status.is_success()
        || answer.status.is_client_error()
            && !(answer.status == StatusCode::CONFLICT && answer.code() == "idempotency_key_in_use")
            && answer.status != StatusCode::TOO_MANY_REQUESTS
}

struct Load {
    /// Where every request goes (HAProxy, in front of the instances).
    base: String,
    http: reqwest::Client,
    shop_key: String,
    book: Mutex<Book>,
}

impl Load {
    /// The load on `base`, the shop acting with `shop_key`; a new connection per request, so
    /// that none outlives a fault unseen.
    fn new(base: String, shop_key: String) -> Arc<Load> {
        Arc::new(Load {
            base,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
            shop_key,
            book: Mutex::default(),
        })
    }

    /// Sends `key`'s request; the answer, if one came.
    async fn send(&self, key: &str, request: &Request) -> Option<Answer> {
        let api = Api {
            base: self.base.clone(),
            http: self.http.clone(),
            token: Some(request.token.clone()),
            mail_from: None,
        };
        let sent = Instant::now();
        let answer = api
            .send(
                api.post(&request.path, Some(key), &request.body)
                    .timeout(Duration::from_secs(15)),
            )
            .await
            .ok();
        let mut book = self.book.lock().unwrap();
        book.sends += 1;
        book.requests
            .entry(key.to_owned())
            .or_insert_with(|| request.clone());
        if let Some(answer) = &answer {
            if answer.status.is_success() {
                book.successes.push((sent, Instant::now()));
            }
            if answer.status == StatusCode::SERVICE_UNAVAILABLE {
                book.unavailable_503 += 1;
                if answer.header("retry-after").is_none() {
                    book.without_retry_after += 1;
                }
            } else if answer.status.is_server_error() {
                book.other_5xx.push(format!(
                    "{} {}: {}",
                    request.path, answer.status, answer.body
                ));
            }
            if is_definite(answer) && !book.first.contains_key(key) {
                book.first.insert(key.to_owned(), answer.clone());
            }
        }
        answer
    }

    /// A new test shopper (its test money full), if the checkout gives one now.
    async fn new_shopper(&self) -> Option<String> {
        let answer = self
            .http
            .post(format!("{}/api/test/shoppers", self.base))
            .send()
            .await
            .ok()?;
        if !answer.status().is_success() {
            return None;
        }
        let body: Value = answer.json().await.ok()?;
        Some(body["token"].as_str()?.to_owned())
    }

    /// One client's orders until told to stop: a new shopper whenever the last one's test
    /// money ran out (so that a long campaign moves money to the end, not only declines).
    async fn orders(
        &self,
        mut shopper: String,
        budget: u64,
        sent: &AtomicU64,
        going: &AtomicBool,
        duplicates: &AtomicU64,
    ) {
        let mut n = 0;
        while going.load(Ordering::SeqCst) || sent.load(Ordering::SeqCst) < budget {
            n += 1;
            if self.order(&shopper, n, duplicates).await
                && let Some(fresh) = self.new_shopper().await
            {
                shopper = fresh;
            }
            sent.fetch_add(2, Ordering::SeqCst);
        }
    }

    /// One shopper's order: the shop makes a session, the shopper pays it (now and then two
    /// copies at once), the shop refunds part of some. `true`: the shopper's money ran out.
    async fn order(&self, shopper: &str, n: u64, duplicates: &AtomicU64) -> bool {
        let amount = 500 + (n % 7) as i64 * 100;
        let session = Request {
            kind: Kind::Session,
            token: self.shop_key.clone(),
            path: "/api/checkout-sessions".into(),
            body: session_request(&format!("F-{}", new_key()), amount),
        };
        let Some(answer) = self.send(&new_key(), &session).await else {
            backoff().await;
            return false;
        };
        if answer.status != StatusCode::CREATED {
            backoff().await;
            return false;
        }
        let session_id = answer.json()["session_id"].as_str().unwrap().to_owned();
        let payment = Request {
            kind: Kind::Payment,
            token: shopper.to_owned(),
            path: "/api/payments".into(),
            body: json!({ "checkout_session_id": session_id }),
        };
        let key = new_key();
        let copies = if rand::rng().random_bool(0.2) { 2 } else { 1 };
        duplicates.fetch_add(copies - 1, Ordering::SeqCst);
        let answers =
            futures::future::join_all((0..copies).map(|_| self.send(&key, &payment))).await;
        if !answers.iter().flatten().any(is_definite) {
            backoff().await;
        }
        let paid = answers
            .iter()
            .flatten()
            .find(|a| a.status == StatusCode::CREATED);
        if let Some(paid) = paid
            && rand::rng().random_bool(0.3)
        {
            let payment_id = paid.json()["payment_id"].as_str().unwrap().to_owned();
            let refund = Request {
                kind: Kind::Refund,
                token: self.shop_key.clone(),
                path: format!("/api/payments/{payment_id}/refunds"),
                body: json!({ "amount": amount / 2 }),
            };
            self.send(&new_key(), &refund).await;
        }
        answers
            .iter()
            .flatten()
            .any(|a| a.status == StatusCode::PAYMENT_REQUIRED)
    }
}

/// The clients, one per shopper, ordering until the faults are over and `budget` requests are
/// sent: the copies sent twice at once.
async fn drive(
    load: &Arc<Load>,
    shoppers: Vec<String>,
    budget: u64,
    going: &Arc<AtomicBool>,
) -> u64 {
    let sent = Arc::new(AtomicU64::new(0));
    let duplicates = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = shoppers
        .into_iter()
        .map(|shopper| {
            let (load, sent, duplicates, going) = (
                load.clone(),
                sent.clone(),
                duplicates.clone(),
                going.clone(),
            );
            tokio::spawn(async move {
                load.orders(shopper, budget, &sent, &going, &duplicates)
                    .await
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    duplicates.load(Ordering::SeqCst)
}

/// A client's pause after `503` or no answer, before its next order (the unanswered key is
/// resent at the end). Shorter than the `Retry-After: 1` the checkout sends, so that the
/// unavailability is measured to a tenth of a second.
async fn backoff() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A checkout instance for the campaign, on `port` (behind HAProxy, where it must come back on
/// the same one).
async fn start_server_at(binary: &str, db: &TestDb, port: u16, amqp_url: Option<&str>) -> Server {
    let addr = format!("127.0.0.1:{port}");
    let mut env = vec![
        ("CHECKOUT_ADDR", addr.as_str()),
        ("RUST_LOG", "warn,checkout_backend=info"),
        ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
        ("CHECKOUT_WEBHOOK_TIMEOUT_MS", "1000"),
        ("CHECKOUT_WEBHOOK_FIRST_RETRY_MS", "50"),
        ("CHECKOUT_WEBHOOK_ATTEMPTS", "100"),
        ("CHECKOUT_DB_POOL_SIZE", "8"),
        ("CHECKOUT_KEYS_IN_PROGRESS", "64"),
        ("CHECKOUT_TEST_SHOPPERS_PER_ADDRESS", "1000"),
    ];
    if let Some(url) = amqp_url {
        env.push(("CHECKOUT_AMQP_URL", url));
    }
    Server::start_with(binary, db, &env).await
}

/// What a campaign's load left behind, to be settled and counted.
struct Settling<'a> {
    /// Every acknowledged change must survive (a synchronous standby was promoted).
    synchronous: bool,
    load: &'a Load,
    duplicates: u64,
    /// Each fault, and when it struck.
    faults: Vec<(&'static str, Instant)>,
    db: &'a TestDb,
    receiver: &'a Receiver,
}

/// Settles what the load left (every key without a definite answer resent until it has one;
/// every key with one resent once, which must replay it) and counts what a shop and a shopper
/// would check.
async fn settle(settling: Settling<'_>) -> FailoverReport {
    let Settling {
        synchronous,
        load,
        duplicates,
        faults,
        db,
        receiver,
    } = settling;
    let failovers: Vec<Instant> = faults.iter().map(|(_, at)| *at).collect();
    // Settle: every key without a definite answer is resent until it has one; every key with
    // one is resent once, and must replay it (unless the promotion lost it).
    let mut report = FailoverReport {
        replication: if synchronous {
            "synchronous"
        } else {
            "asynchronous"
        }
        .into(),
        failovers: failovers.len() as u32,
        duplicates,
        ..FailoverReport::default()
    };
    let (requests, first, attack_sends) = {
        let book = load.book.lock().unwrap();
        (
            book.requests
                .iter()
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect::<Vec<(String, Request)>>(),
            book.first.clone(),
            book.sends,
        )
    };
    let settling = Instant::now();
    let mut finals = HashMap::new();
    for (key, request) in &requests {
        let mut tries = 0;
        let answer = loop {
            tries += 1;
            match load.send(key, request).await {
                Some(answer) if is_definite(&answer) => break Some(answer),
                _ if tries >= 200 => break None,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let Some(answer) = answer else {
            report
                .violations
                .push(format!("key {key} never got a definite answer"));
            continue;
        };
        match first.get(key) {
            None => {
                report.in_doubt += 1;
                if answer.replayed() {
                    report.resolved_by_replay += 1;
                } else {
                    report.resolved_by_first_execution += 1;
                }
            }
            Some(seen) if seen.status != answer.status || seen.body != answer.body => {
                // The stored answer is gone: the promotion lost the change and its key, and
                // the resend executed it again.
                if seen.status.is_success() {
                    match request.kind {
                        Kind::Session => report.sessions_lost += 1,
                        Kind::Payment | Kind::Refund => report.acknowledged_lost += 1,
                    }
                } else {
                    // A stored refusal (a `402` when the shopper's money ran short, say), gone
                    // with its key; the request ran again against today's balance.
                    report.refusals_lost += 1;
                }
            }
            Some(_) => {}
        }
        finals.insert(key.clone(), answer);
    }
    let kinds: HashMap<&str, Kind> = requests.iter().map(|(k, r)| (k.as_str(), r.kind)).collect();
    for (key, seen) in &first {
        if !seen.status.is_success() {
            continue;
        }
        match kinds.get(key.as_str()) {
            Some(Kind::Payment) => report.payments_acknowledged += 1,
            Some(Kind::Refund) => report.refunds_acknowledged += 1,
            _ => {}
        }
    }
    {
        let book = load.book.lock().unwrap();
        report.requests = attack_sends;
        report.unavailable_503 = book.unavailable_503;
        report.without_retry_after = book.without_retry_after;
        report.other_5xx = book.other_5xx.len() as u64;
        for error in book.other_5xx.iter().take(5) {
            report
                .violations
                .push(format!("a 5xx other than 503: {error}"));
        }
        for (fault, killed) in &faults {
            let first_success = book
                .successes
                .iter()
                .filter(|(sent, _)| sent > killed)
                .map(|(_, answered)| *answered)
                .min();
            match first_success {
                Some(at) => {
                    report.outages.push(at - *killed);
                    report
                        .outages_by_fault
                        .push((fault.to_string(), at - *killed));
                }
                None => report.violations.push(format!(
                    "no request sent after a fault ({fault}) was answered 2xx"
                )),
            }
        }
        if let Some(last) = failovers.last() {
            report.answered_after_last = book
                .successes
                .iter()
                .filter(|(sent, _)| sent > last && *sent < settling)
                .count() as u64;
        }
    }
    if report.in_doubt > 0 && report.resolved_by_replay + report.resolved_by_first_execution == 0 {
        report
            .violations
            .push("in-doubt requests were not resolved".into());
    }

    // Every event delivered, once the outbox drains; none for a change that no longer exists
    // is expected only of asynchronous replication.
    let draining = Instant::now();
    let deadline = draining + Duration::from_secs(60);
    loop {
        let pending = db
            .scalar("SELECT COUNT(*) FROM webhook_events WHERE status <> 'delivered'")
            .await;
        if pending == 0 || Instant::now() > deadline {
            report.events_undelivered = pending;
            report.drained_after = (pending == 0).then(|| draining.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    report.events = db.scalar("SELECT COUNT(*) FROM webhook_events").await;
    let received: HashSet<String> = receiver
        .deliveries()
        .into_iter()
        .map(|d| d.webhook_id)
        .collect();
    let in_db: HashSet<String> = db
        .texts("SELECT event_id FROM webhook_events")
        .await
        .into_iter()
        .collect();
    let never_received = in_db.difference(&received).count();
    if never_received > 0 {
        report
            .violations
            .push(format!("{never_received} events never reached the shop"));
    }
    report.events_of_lost_changes = received.difference(&in_db).count() as u64;
    if report.events_undelivered > 0 {
        // What holds them: their state, tries, lease and last error, for whoever reads the failure.
        let held = db
            .texts(
                "SELECT status || ' × ' || COUNT(*) || ', attempts ' || MIN(attempts) || '..' \
                        || MAX(attempts) || ', leased ' || COUNT(locked_until) \
                        || ', last error ' || COALESCE(MIN(last_error), '-') \
                   FROM webhook_events WHERE status <> 'delivered' GROUP BY status",
            )
            .await;
        report.violations.push(format!(
            "{} events not delivered within 60 s: {held:?}",
            report.events_undelivered
        ));
    }

    // The books, by `checkout-server verify`'s own code, on the new primary.
    let verified = db.verify(checkout_testkit::Scope::KeysNeverReused).await;
    report.verify_holds = verified.holds();
    report.verify_took = verified.took;
    for checked in &verified.checked {
        if checked.violations.is_empty() {
            continue;
        }
        if matches!(
            checked.invariant.name,
            "one_payment_per_session"
                | "one_movement_per_claim"
                | "one_movement_per_key_string"
                | "payments_moved_once"
                | "refunds_moved_once"
        ) {
            report.double_charges += checked.violations.len() as u64;
        }
        report.violations.push(format!(
            "invariant {} broken: {:?}",
            checked.invariant.name, checked.violations
        ));
    }
    if synchronous && report.acknowledged_lost + report.sessions_lost > 0 {
        report.violations.push(format!(
            "synchronous replication lost {} acknowledged payments or refunds and {} sessions",
            report.acknowledged_lost, report.sessions_lost
        ));
    }
    if report.without_retry_after > 0 {
        report.violations.push(format!(
            "{} answers 503 without Retry-After",
            report.without_retry_after
        ));
    }
    if report.answered_after_last == 0 {
        report
            .violations
            .push("the checkout did not recover after the last failover".into());
    }
    report
}

/// A fault of the campaign ([`run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL to the Patroni leader's PostgreSQL: Patroni promotes the synchronous standby,
    /// HAProxy moves the connections; the old leader comes back as a replica (`pg_rewind`).
    LeaderPostgres,
    /// SIGKILL to an etcd member, started again a while later: two of three keep the quorum.
    EtcdMember,
    /// SIGKILL to a checkout instance, started again: HAProxy sends its clients to the other.
    CheckoutInstance,
    /// HAProxy SIGKILLed and started again: every connection through it is cut.
    HaproxyRestart,
    /// SIGKILL to a RabbitMQ node (of three), started again: the quorum queue lives on.
    BrokerNode,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::LeaderPostgres,
        Fault::EtcdMember,
        Fault::BrokerNode,
        Fault::CheckoutInstance,
        Fault::HaproxyRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::LeaderPostgres => "the leader's PostgreSQL killed",
            Fault::EtcdMember => "an etcd member killed",
            Fault::CheckoutInstance => "a checkout instance killed",
            Fault::HaproxyRestart => "HAProxy restarted",
            Fault::BrokerNode => "a RabbitMQ node killed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct FailoverPlan {
    /// In this order, each after `load_before` of load (and the cluster whole again).
    pub faults: Vec<Fault>,
    pub requests: u64,
    pub clients: usize,
    pub load_before: Duration,
    /// Patroni's `synchronous_mode`; off, the acknowledged changes a promotion loses are
    /// counted rather than called violations.
    pub synchronous: bool,
    /// One way, between the database nodes (zero: loopback's own).
    pub link_delay: Duration,
    /// A three-node RabbitMQ cluster and two `receipts` consumers, whose receipts must match
    /// the books (required by [`Fault::BrokerNode`]).
    pub receipts: bool,
}

/// The receipts' side of a campaign: the broker, the consumers and their database.
struct Receipts {
    broker: Arc<BrokerCluster>,
    consumers: [Consumer; 2],
    _db: TestDb,
}

impl Receipts {
    async fn start(receipts_bin: &str) -> Receipts {
        let broker = Arc::new(
            tokio::task::spawn_blocking(|| BrokerCluster::start(3))
                .await
                .unwrap(),
        );
        let amqp = broker.urls();
        let db = TestDb::new(checkout_testkit::Backend::Sqlite).await;
        let env = [("RECEIPTS_PREFETCH", "50")];
        let consumers = [
            Consumer::start(receipts_bin, &amqp, &db.url, &env).await,
            Consumer::start(receipts_bin, &amqp, &db.url, &env).await,
        ];
        Receipts {
            broker,
            consumers,
            _db: db,
        }
    }

    /// One receipt per payment and refund the books hold, within two minutes: what does not
    /// match is a violation.
    async fn check(&self, db: &TestDb, report: &mut FailoverReport) {
        let expected = (db.scalar("SELECT COUNT(*) FROM payments").await
            + db.scalar("SELECT COUNT(*) FROM refunds").await) as usize;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.consumers[0].count().await < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let listed = self.consumers[0].listed().await;
        report.receipts = listed["receipts"].as_array().map(Vec::len);
        report
            .violations
            .extend(mismatches_with_the_books(db, &listed).await);
        let dead: usize = self
            .consumers
            .iter()
            .map(|c| c.log().matches("message dead-lettered").count())
            .sum();
        if dead > 0 {
            report
                .violations
                .push(format!("{dead} messages dead-lettered"));
        }
    }
}

/// The campaign: the deployment of `plan`, the load through HAProxy, the faults in turn, then
/// the failover checks (and the receipts against the books, when there are receipts).
/// Runs the campaign on the HA cluster, phase by phase: the stage set (the cluster, two
/// checkout instances behind HAProxy, a webhook receiver, a shop, shoppers, and with receipts a
/// RabbitMQ cluster and its consumer), each fault struck in turn while the clients load it, every
/// request settled, then the books, the events and the receipts checked.
pub async fn run(plan: &FailoverPlan, server_bin: &str, receipts_bin: &str) -> FailoverReport {
    assert!(
        plan.receipts || !plan.faults.contains(&Fault::BrokerNode),
        "a RabbitMQ node can be killed only in a campaign with receipts"
    );
    let mut stage = Stage::set(plan, server_bin, receipts_bin).await;
    let servers = std::mem::take(&mut stage.servers);
    let idle = crate::footprint::sample();
    let sampler = crate::footprint::Sampler::start(Duration::from_secs(1));
    let failing_over = Arc::new(AtomicBool::new(true));
    let chaos = strike_in_turn(plan, &stage, servers, server_bin, failing_over.clone());
    let duplicates = drive(
        &stage.load,
        stage.shoppers.clone(),
        plan.requests,
        &failing_over,
    )
    .await;
    let (faults, servers) = chaos.await.unwrap();
    let under_load = sampler.stop();
    let mut report = settle(Settling {
        synchronous: plan.synchronous,
        load: &stage.load,
        duplicates,
        faults,
        db: &stage.db,
        receiver: &stage.receiver,
    })
    .await;
    if let Some(receipts) = &stage.receipts {
        receipts.check(&stage.db, &mut report).await;
    }
    report.idle = Some(idle);
    report.under_load = Some(under_load);
    if report.events_undelivered > 0 {
        // What the senders said last, for whoever reads the failure.
        for (i, server) in servers.iter().enumerate() {
            let log = server.log();
            let said: Vec<&str> = log
                .lines()
                .filter(|line| line.contains("webhook") || line.contains("slow statement"))
                .collect();
            report.violations.push(format!(
                "instance {i} delivered {}, its last words on delivery: {:?}",
                log.matches("webhook delivered").count(),
                &said[said.len().saturating_sub(3)..]
            ));
        }
    }
    drop(servers);
    report
}

/// Everything the campaign runs against, started before the load.
struct Stage {
    receipts: Option<Receipts>,
    broker: Option<Arc<BrokerCluster>>,
    amqp: Option<String>,
    cluster: Arc<HaCluster>,
    db: TestDb,
    /// Handed to the chaos, which kills and restarts them.
    servers: Vec<Server>,
    receiver: Receiver,
    shoppers: Vec<String>,
    load: Arc<Load>,
}

impl Stage {
    async fn set(plan: &FailoverPlan, server_bin: &str, receipts_bin: &str) -> Stage {
        let receipts = if plan.receipts {
            Some(Receipts::start(receipts_bin).await)
        } else {
            None
        };
        let broker = receipts.as_ref().map(|r| r.broker.clone());
        let amqp = broker.as_ref().map(|b| b.urls());
        let cluster = Arc::new(
            HaCluster::start_with(HaSettings {
                web_instances: 2,
                synchronous: plan.synchronous,
                link_delay: plan.link_delay,
            })
            .await,
        );
        let db = TestDb::at(cluster.create_database().await);
        let mut servers = Vec::new();
        for port in &cluster.web_ports {
            servers.push(start_server_at(server_bin, &db, *port, amqp.as_deref()).await);
        }
        let front = format!("http://127.0.0.1:{}", cluster.web_port);
        // HAProxy has seen the instances up.
        let health = format!("{front}/healthz");
        checkout_testkit::wait_until(
            "HAProxy reaches a checkout",
            Duration::from_secs(30),
            || async {
                reqwest::get(&health)
                    .await
                    .is_ok_and(|a| a.status().is_success())
            },
        )
        .await;
        let receiver = Receiver::start().await;
        let shop = add_shop_with(
            server_bin,
            &db.url,
            &front,
            "Лавка кластера",
            Some(&receiver.url),
            &[],
        )
        .await;
        let mut shoppers = Vec::new();
        for _ in 0..plan.clients {
            shoppers.push(Api::new(&front).shopper_token().await);
        }
        let load = Load::new(front, shop.api.token.clone().unwrap());
        Stage {
            receipts,
            broker,
            amqp,
            cluster,
            db,
            servers,
            receiver,
            shoppers,
            load,
        }
    }
}

/// When each fault struck, by its name.
type Struck = Vec<(&'static str, Instant)>;

/// The faults, in turn, each after `plan.load_before` of load, until the last has been
/// recovered from; then the load goes on a while and stops. Returns when each fault struck, and
/// the checkout instances as they are at the end.
fn strike_in_turn(
    plan: &FailoverPlan,
    stage: &Stage,
    mut servers: Vec<Server>,
    server_bin: &str,
    failing_over: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Struck, Vec<Server>)> {
    let (plan, cluster) = (plan.clone(), stage.cluster.clone());
    let (server_bin, db_url) = (server_bin.to_owned(), stage.db.url.clone());
    let (broker, amqp) = (stage.broker.clone(), stage.amqp.clone());
    tokio::spawn(async move {
        let db = TestDb::at(db_url);
        let mut struck = Vec::new();
        for (round, fault) in plan.faults.iter().enumerate() {
            tokio::time::sleep(plan.load_before).await;
            // When the fault has struck: once the blow has landed (the killed process is
            // surely gone), so that nothing sent after it can have been answered by it.
            let at = match fault {
                Fault::LeaderPostgres => {
                    let leader = cluster.leader().await.expect("a leader");
                    cluster.kill_postgres(leader);
                    let at = Instant::now();
                    cluster.until_writable().await;
                    // The next fault finds the cluster whole: the old leader a replica.
                    cluster.until_whole().await;
                    at
                }
                Fault::EtcdMember => {
                    let member = round % 3;
                    cluster.kill_etcd(member);
                    let at = Instant::now();
                    tokio::time::sleep(plan.load_before).await;
                    cluster.restart_etcd(member);
                    at
                }
                Fault::CheckoutInstance => {
                    let instance = round % servers.len();
                    servers[instance].kill();
                    let at = Instant::now();
                    tokio::time::sleep(plan.load_before).await;
                    let port = cluster.web_ports[instance];
                    servers[instance] =
                        start_server_at(&server_bin, &db, port, amqp.as_deref()).await;
                    at
                }
                Fault::BrokerNode => {
                    let broker = broker.clone().expect("a broker");
                    let node = round % broker.nodes.len();
                    tokio::task::spawn_blocking(move || {
                        broker.nodes[node].kill();
                        let at = Instant::now();
                        broker.nodes[node].start_again();
                        at
                    })
                    .await
                    .unwrap()
                }
                Fault::HaproxyRestart => {
                    cluster.kill_haproxy();
                    let at = Instant::now();
                    cluster.start_haproxy();
                    at
                }
            };
            struck.push((fault.name(), at));
        }
        // The load goes on a while after the last: the checkout must recover by itself.
        tokio::time::sleep(plan.load_before).await;
        failing_over.store(false, Ordering::SeqCst);
        (struck, servers)
    })
}
