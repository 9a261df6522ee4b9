//! The campaign: each shop is a demo shop process with its own database and webhook receiver;
//! its storefront's orders become checkout sessions, shoppers pay them, shops refund, about 30 %
//! of the requests duplicates (concurrent copies, and retries of the same key after a while),
//! while servers and shops are SIGKILLed and restarted, PostgreSQL is stopped with
//! `-m immediate` and started again, the servers cut some connections right after their commit,
//! and the shops answer some webhooks only after the sender gave up (after their own commit).
//! Afterwards every key is retried until it has a definite answer, every event is delivered, and
//! every promise of the contract is checked: money conserved, and every payment and refund known
//! to its shop exactly once in effect (order paid, refunded total, bonus).

pub mod failover;
pub mod footprint;
pub mod receipts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use checkout_testkit::{
    Answer, Api, Backend, DemoShop, Server, TestDb, add_shop_with, new_key, pay_session, postgres,
};
use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub struct Plan {
    pub backend: Backend,
    /// Server instances (all sharing the one database; SQLite gets one).
    pub servers: usize,
    /// HTTP requests to send in the attack phase, duplicates included.
    pub requests: u64,
    pub clients: usize,
    /// Shoppers.
    pub accounts: usize,
    pub shops: usize,
    /// Percent of committed answers the servers cut off.
    pub cut_percent: u64,
    /// Time between two acts of chaos.
    pub chaos_every: Duration,
    /// The attack goes on until at least this many acts of chaos have happened.
    pub min_chaos_acts: u64,
    /// Percent of applied webhooks whose answer the shops hold past the sender's timeout.
    pub late_webhook_percent: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub backend: String,
    pub servers: usize,
    pub requests: u64,
    pub duplicates: u64,
    pub keys: u64,
    pub sessions: u64,
    pub payments: u64,
    pub refunds: u64,
    pub declines: u64,
    pub no_answer: u64,
    pub server_kills: u64,
    pub shop_kills: u64,
    pub database_restarts: u64,
    /// Events the checkout wrote, and delivery attempts it made for them.
    pub events: i64,
    pub webhook_attempts: i64,
    /// Orders whose state in the shop was checked against the checkout.
    pub shop_orders: u64,
    pub final_retries: u64,
    /// Every balance (shops' waiting credits included), and every opening entry: equal when no
    /// money was made or lost.
    pub money_held: i64,
    pub money_issued: i64,
    /// Payments in live money (the rest were test money).
    pub live_payments: i64,
    /// What the shops hold at the end.
    pub shops_hold: i64,
    pub violations: Vec<String>,
}

/// What a key asks for, and who asks.
#[derive(Clone, Debug)]
struct Intent {
    kind: Kind,
    token: String,
    path: String,
    body: Value,
}

#[derive(Clone, Debug)]
enum Kind {
    /// A shopper orders in a shop's storefront; the shop makes the order's session. The key is
    /// the cart form's token; the body, the quantity.
    Session { shop: usize },
    /// A shopper pays a session of this shop.
    Payment { shop: usize },
    /// A shop refunds part of a payment it was paid.
    Refund,
}

/// One key: what it asks, and the first definite answer a client saw for it.
#[derive(Clone, Debug)]
struct KeyRecord {
    intent: Intent,
    first_answer: Option<(StatusCode, String)>,
}

#[derive(Default)]
struct Ledger {
    keys: HashMap<String, KeyRecord>,
    /// Keys to send again later (after no answer, or just to check the replay).
    to_retry: Vec<String>,
    /// Sessions made and not handed to a payment yet, with their shop.
    open_sessions: Vec<(String, usize)>,
    /// Every session made, paid or not (a few payments try one already paid).
    all_sessions: Vec<(String, usize)>,
    /// Acknowledged payments per shop, for refunds: (payment_id, amount).
    paid: HashMap<usize, Vec<(String, i64)>>,
    violations: Vec<String>,
}

/// A definite answer is the key's outcome, stored by the server: success, or a stored refusal.
fn is_definite(answer: &Answer) -> bool {
    answer.status.is_success()
        || answer.status == StatusCode::PAYMENT_REQUIRED
        || answer.status == StatusCode::GONE
        || (answer.status == StatusCode::CONFLICT && answer.code() != "idempotency_key_in_use")
}

struct World {
    db: TestDb,
    servers: Vec<Mutex<Server>>,
    ports: Vec<String>,
    /// Test shoppers' tokens (they pay the test shops' sessions), live shoppers' sign-ins (the
    /// live shops'), then shops' secret keys (of the shop's mode).
    tokens: Vec<String>,
    live_tokens: Vec<String>,
    shop_keys: Vec<String>,
    /// Whether each shop runs on its live key (every other one): money of both modes moves side
    /// by side, and must be conserved in each.
    shop_live: Vec<bool>,
    http: reqwest::Client,
    server_bin: String,
    cut_percent: u64,
    /// The demo shops, each with its own database and webhook receiver.
    shops: Vec<tokio::sync::Mutex<DemoShop>>,
    shop_bases: Vec<String>,
    shop_accounts: Vec<String>,
    shop_faults: String,
    /// The shops' credentials files: a shop reads its file again when it restarts.
    credentials: Option<tempfile::TempDir>,
}

impl World {
    async fn send(&self, server: usize, key: &str, intent: &Intent) -> Option<Answer> {
        if let Kind::Session { shop } = intent.kind {
            return self.order(shop, key, &intent.body).await;
        }
        let api = Api {
            base: format!("http://127.0.0.1:{}", self.ports[server]),
            http: self.http.clone(),
            token: Some(intent.token.clone()),
            mail_from: None,
        };
        api.send(
            api.post(&intent.path, Some(key), &intent.body)
                .timeout(Duration::from_secs(10)),
        )
        .await
        .ok()
    }

    /// Submits a storefront cart form (its token: `key`) and reads the order page the shop
    /// redirects to: the order and its session, as a `201` for the ledger. No session on the
    /// page (the checkout was down) is no answer yet: the same form is sent again later.
    async fn order(&self, shop: usize, key: &str, body: &Value) -> Option<Answer> {
        let base = &self.shop_bases[shop];
        let form = format!("cart_token={key}&qty_chocolate={}", body["qty"]);
        let page = self
            .http
            .post(format!("{base}/orders"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()?;
        if page.status() != StatusCode::OK {
            return None;
        }
        let order = page.url().path().trim_start_matches("/orders/").to_owned();
        let html = page.text().await.ok()?;
        let session = html
            .split("data-checkout-session=\"")
            .nth(1)?
            .split('"')
            .next()?
            .to_owned();
        Some(Answer {
            status: StatusCode::CREATED,
            headers: HashMap::new(),
            body: json!({ "session_id": session, "order_id": order }).to_string(),
        })
    }

    async fn start_server(&self, port: &str) -> Server {
        let faults = format!("drop_after_commit_percent={}", self.cut_percent);
        let addr = format!("127.0.0.1:{port}");
        Server::start_with(
            &self.server_bin,
            &self.db,
            &[
                ("CHECKOUT_ADDR", &addr),
                ("CHECKOUT_FAULTS", &faults),
                ("RUST_LOG", "warn,checkout_backend=info"),
                ("CHECKOUT_WEBHOOK_POLL_MS", "50"),
                ("CHECKOUT_WEBHOOK_TIMEOUT_MS", "1000"),
                ("CHECKOUT_WEBHOOK_FIRST_RETRY_MS", "50"),
                ("CHECKOUT_WEBHOOK_ATTEMPTS", "100"),
            ],
        )
        .await
    }
}

/// Runs the campaign, phase by phase: the world set up, struck while the clients load it, every
/// key settled, then the money and the shops checked.
pub async fn run(plan: &Plan, server_bin: &str, shop_bin: &str) -> Report {
    let world = Arc::new(World::set_up(plan, server_bin, shop_bin).await);
    let load = Arc::new(Load::new());
    let chaos = strike(world.clone(), plan, load.clone());
    drive(world.clone(), plan, load.clone()).await;
    load.attacking.store(false, Ordering::SeqCst);
    let (server_kills, database_restarts, shop_kills) = chaos.await.unwrap();
    let settled = settle(&world, &load.ledger).await;
    let mut violations = std::mem::take(&mut load.ledger.lock().unwrap().violations);
    let money = check_money(&world, &settled.finals, &mut violations).await;
    // The shops: every event delivered, and each shop knows every payment and refund of its
    // orders exactly once in effect.
    let (events, webhook_attempts, shop_orders) = check_shops(&world, &mut violations).await;

    Report {
        backend: format!("{:?}", plan.backend),
        servers: world.servers.len(),
        requests: load.sent.load(Ordering::SeqCst),
        duplicates: load.duplicates.load(Ordering::SeqCst),
        keys: settled.keys as u64,
        sessions: money.sessions,
        payments: money.payments,
        refunds: money.refunds,
        declines: money.declines,
        no_answer: load.no_answer.load(Ordering::SeqCst),
        server_kills,
        shop_kills,
        database_restarts,
        events,
        webhook_attempts,
        shop_orders,
        final_retries: settled.final_retries,
        money_held: money.held,
        money_issued: money.issued,
        live_payments: money.live_payments,
        shops_hold: money.shops_hold,
        violations,
    }
}

/// What the clients did, shared with the chaos that runs beside them.
struct Load {
    ledger: Mutex<Ledger>,
    sent: AtomicU64,
    duplicates: AtomicU64,
    no_answer: AtomicU64,
    /// The chaos goes on while this holds.
    attacking: AtomicBool,
    /// Acts of chaos so far.
    acts: AtomicU64,
}

impl Load {
    fn new() -> Load {
        Load {
            ledger: Mutex::default(),
            sent: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            no_answer: AtomicU64::new(0),
            attacking: AtomicBool::new(true),
            acts: AtomicU64::new(0),
        }
    }
}

impl World {
    /// The phase before the load: the database, the servers, the shoppers (test ones, and live
    /// ones funded by the operator's deposits), and the shops, each a demo shop process.
    async fn set_up(plan: &Plan, server_bin: &str, shop_bin: &str) -> World {
        let db = match plan.backend {
            Backend::Postgres => TestDb::on(postgres::durable_cluster()).await,
            other => TestDb::new(other).await,
        };
        let servers = if plan.backend == Backend::Sqlite {
            1
        } else {
            plan.servers
        };
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let mut world = World {
            db,
            servers: Vec::new(),
            ports: Vec::new(),
            tokens: Vec::new(),
            live_tokens: Vec::new(),
            shop_keys: Vec::new(),
            shop_live: Vec::new(),
            http,
            server_bin: server_bin.to_owned(),
            cut_percent: plan.cut_percent,
            shops: Vec::new(),
            shop_bases: Vec::new(),
            shop_accounts: Vec::new(),
            shop_faults: format!(
                "late_webhook_answer_percent={},late_webhook_answer_ms=1500",
                plan.late_webhook_percent
            ),
            credentials: None,
        };
        for _ in 0..servers {
            let port = postgres::free_port().to_string();
            let server = world.start_server(&port).await;
            world.ports.push(port);
            world.servers.push(Mutex::new(server));
        }
        let base = format!("http://127.0.0.1:{}", world.ports[0]);
        // The servers' mail comes from each one's own sender: the shoppers read the first's.
        let signup = Api {
            mail_from: Some(world.servers[0].lock().unwrap().mail_from.clone()),
            ..Api::new(&base)
        };
        for i in 0..plan.accounts {
            world.tokens.push(signup.shopper_token().await);
            // A live shopper, funded by the operator's deposit (as much as a test wallet holds).
            let email = format!("shopper{i}@campaign.test");
            let live = signup.live_shopper(&email, "campaign password").await;
            world.live_tokens.push(live.token.expect("a sign-in"));
            let deposit = tokio::process::Command::new(server_bin)
                .args([
                    "shopper", "deposit", "--email", &email, "--amount", "100000", "--key",
                ])
                .arg(new_key())
                .env("DATABASE_URL", &world.db.url)
                .env("RUST_LOG", "warn")
                .output()
                .await
                .expect("checkout-server shopper deposit runs");
            assert!(
                deposit.status.success(),
                "deposit: {}",
                String::from_utf8_lossy(&deposit.stderr)
            );
        }
        // Each shop: its credentials in a file, its process on a port fixed first (the checkout
        // sends its webhooks there), talking to one of the servers.
        let credentials = tempfile::tempdir().unwrap();
        world.credentials = Some(credentials);
        let credentials = world.credentials.as_ref().expect("just set");
        let shop_faults = world.shop_faults.clone();
        for i in 0..plan.shops {
            let addr = format!("127.0.0.1:{}", postgres::free_port());
            let webhook_url = format!("http://{addr}/webhooks/checkout");
            let shop = add_shop_with(
                server_bin,
                &world.db.url,
                &base,
                &format!("Лавка {i}"),
                Some(&webhook_url),
                // The demo shop's pages: where its sessions' `return_url`s lead.
                &[&format!("http://{addr}")],
            )
            .await;
            let live = i % 2 == 1;
            let file = credentials.path().join(format!("shop-{i}.json"));
            let credentials_of_mode = shop.credentials(live);
            std::fs::write(&file, credentials_of_mode.to_string()).unwrap();
            let secret = credentials_of_mode["secret_key"]
                .as_str()
                .expect("a secret key")
                .to_owned();
            world.shop_live.push(live);
            let checkout = format!("http://127.0.0.1:{}", world.ports[i % world.ports.len()]);
            let process = DemoShop::start(
                shop_bin,
                &checkout,
                &file,
                &[("SHOP_ADDR", &addr), ("SHOP_FAULTS", &shop_faults)],
            )
            .await;
            world.shop_bases.push(process.base.clone());
            world.shops.push(tokio::sync::Mutex::new(process));
            let account = world
                .db
                .scalar_text(&format!(
                    "SELECT account_id FROM shops WHERE shop_id = '{}' AND livemode = {}",
                    shop.shop_id,
                    i64::from(live)
                ))
                .await;
            world.shop_accounts.push(account);
            world.shop_keys.push(secret);
        }
        world
    }
}

/// The chaos: kills and restarts servers and shops, and crashes the database, every
/// `plan.chaos_every`, until the load stops. Returns (server kills, database restarts, shop
/// kills).
fn strike(
    world: Arc<World>,
    plan: &Plan,
    load: Arc<Load>,
) -> tokio::task::JoinHandle<(u64, u64, u64)> {
    let (backend, every) = (plan.backend, plan.chaos_every);
    tokio::spawn(async move {
        let (mut kills, mut restarts, mut shop_kills) = (0u64, 0u64, 0u64);
        let mut round = 0u64;
        while load.attacking.load(Ordering::SeqCst) {
            tokio::time::sleep(every).await;
            if !load.attacking.load(Ordering::SeqCst) {
                break;
            }
            round += 1;
            if round % 4 == 2 {
                // A shop dies (mid-webhook, maybe) and comes back on its database.
                let victim = rand::rng().random_range(0..world.shops.len());
                let faults = world.shop_faults.clone();
                world.shops[victim]
                    .lock()
                    .await
                    .restart(&[("SHOP_FAULTS", &faults)])
                    .await;
                shop_kills += 1;
            } else if backend == Backend::Postgres && round.is_multiple_of(3) {
                tokio::task::spawn_blocking(|| postgres::durable_cluster().crash_and_restart())
                    .await
                    .unwrap();
                restarts += 1;
            } else {
                let victim = rand::rng().random_range(0..world.servers.len());
                world.servers[victim].lock().unwrap().kill();
                let fresh = world.start_server(&world.ports[victim]).await;
                *world.servers[victim].lock().unwrap() = fresh;
                kills += 1;
            }
            load.acts.fetch_add(1, Ordering::SeqCst);
        }
        (kills, restarts, shop_kills)
    })
}

/// The load: `plan.clients` clients sending requests (a share of them duplicates) until the
/// budget is spent and the chaos has acted enough.
async fn drive(world: Arc<World>, plan: &Plan, load: Arc<Load>) {
    let (budget, min_acts) = (plan.requests, plan.min_chaos_acts);
    let clients: Vec<_> = (0..plan.clients)
        .map(|_| {
            let (world, load) = (world.clone(), load.clone());
            tokio::spawn(async move {
                while load.sent.load(Ordering::SeqCst) < budget
                    || load.acts.load(Ordering::SeqCst) < min_acts
                {
                    let (key, intent, copies, is_duplicate) = next_request(&load.ledger, &world);
                    load.sent.fetch_add(copies as u64, Ordering::SeqCst);
                    load.duplicates.fetch_add(
                        if is_duplicate {
                            copies as u64
                        } else {
                            copies as u64 - 1
                        },
                        Ordering::SeqCst,
                    );
                    let answers = futures::future::join_all((0..copies).map(|_| {
                        let server = rand::rng().random_range(0..world.servers.len());
                        world.send(server, &key, &intent)
                    }))
                    .await;
                    let mut answered = true;
                    for answer in answers {
                        if !record(&load.ledger, &key, answer.as_ref()) {
                            load.no_answer.fetch_add(1, Ordering::SeqCst);
                            answered = false;
                        }
                    }
                    if !answered {
                        // A client backs off when its server is gone (a retry policy, not a wait).
                        let pause = Duration::from_millis(rand::rng().random_range(20..80));
                        tokio::time::sleep(pause).await;
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
}

/// Every key the clients used, and its definite answer.
struct Settled {
    keys: usize,
    finals: HashMap<String, Answer>,
    final_retries: u64,
}

/// Every key, resent until it has a definite answer (at most 100 tries): what a client does
/// after the storm. A key whose replay differs from what a client first saw is a violation.
async fn settle(world: &World, ledger: &Mutex<Ledger>) -> Settled {
    let keys: Vec<(String, KeyRecord)> = ledger
        .lock()
        .unwrap()
        .keys
        .iter()
        .map(|(k, r)| (k.clone(), r.clone()))
        .collect();
    let mut final_retries = 0;
    let mut finals: HashMap<String, Answer> = HashMap::new();
    for (key, record) in &keys {
        let mut tries = 0;
        let answer = loop {
            tries += 1;
            let server = tries % world.servers.len();
            match world.send(server, key, &record.intent).await {
                Some(answer) if is_definite(&answer) => break Some(answer),
                _ if tries >= 100 => break None,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        final_retries += tries as u64;
        let mut ledger = ledger.lock().unwrap();
        match answer {
            None => ledger
                .violations
                .push(format!("key {key} never got a definite answer")),
            Some(answer) => {
                if let Some((status, body)) = &record.first_answer
                    && (answer.status != *status || answer.body != *body)
                {
                    ledger.violations.push(format!(
                        "key {key}: the replay differs from what the client first saw"
                    ));
                }
                finals.insert(key.clone(), answer);
            }
        }
    }

    Settled {
        keys: keys.len(),
        finals,
        final_retries,
    }
}

/// What the books hold at the end.
struct Money {
    sessions: u64,
    payments: u64,
    refunds: u64,
    declines: u64,
    held: i64,
    issued: i64,
    live_payments: i64,
    shops_hold: i64,
}

/// Every acknowledged session, payment and refund is in the database exactly once, nothing else
/// is, the invariants hold, and money is conserved.
async fn check_money(
    world: &World,
    finals: &HashMap<String, Answer>,
    violations: &mut Vec<String>,
) -> Money {
    let (mut sessions, mut payments, mut refunds, mut declines) = (0u64, 0u64, 0u64, 0u64);
    for (key, answer) in finals {
        if answer.status != StatusCode::CREATED {
            declines += 1;
            continue;
        }
        let body = answer.json();
        let (table, column) = if body.get("refund_id").is_some() {
            refunds += 1;
            ("refunds", "refund_id")
        } else if body.get("session_id").is_some() {
            sessions += 1;
            ("checkout_sessions", "session_id")
        } else {
            payments += 1;
            ("payments", "payment_id")
        };
        let id = body[column].as_str().unwrap().to_owned();
        let found = world
            .db
            .scalar(&format!(
                "SELECT COUNT(*) FROM {table} WHERE {column} = '{id}'"
            ))
            .await;
        if found != 1 {
            violations.push(format!(
                "key {key}: acknowledged {id} is in {table} {found} times"
            ));
        }
    }
    let in_db = world.db.scalar("SELECT COUNT(*) FROM payments").await as u64;
    if in_db != payments {
        violations.push(format!(
            "{in_db} payments in the database, {payments} keys answered with one"
        ));
    }
    let refunds_in_db = world.db.scalar("SELECT COUNT(*) FROM refunds").await as u64;
    if refunds_in_db != refunds {
        violations.push(format!(
            "{refunds_in_db} refunds in the database, {refunds} keys answered with one"
        ));
    }
    let sessions_in_db = world
        .db
        .scalar("SELECT COUNT(*) FROM checkout_sessions")
        .await as u64;
    if sessions_in_db != sessions {
        violations.push(format!(
            "{sessions_in_db} sessions in the database, {sessions} keys answered with one"
        ));
    }
    for broken in world.db.broken_invariants().await {
        violations.push(format!("invariant broken: {broken}"));
    }
    let money_held = world
        .db
        .scalar(
            "SELECT CAST((SELECT COALESCE(SUM(balance), 0) FROM accounts WHERE kind <> 'funding') \
                  + (SELECT COALESCE(SUM(amount), 0) FROM unfolded_credits) AS BIGINT)",
        )
        .await;
    // Test money issued (opening credits) and live money deposited: conserved in each mode (the
    // invariants above check each mode alone; here, the sum).
    let money_issued = world
        .db
        .scalar(
            "SELECT CAST((SELECT COALESCE(SUM(amount), 0) FROM ledger WHERE kind = 'opening') \
                  + (SELECT COALESCE(SUM(amount), 0) FROM deposits) AS BIGINT)",
        )
        .await;
    let live_payments = world
        .db
        .scalar("SELECT COUNT(*) FROM payments WHERE livemode = 1")
        .await;
    let shops_hold = world
        .db
        .scalar(
            "SELECT CAST(COALESCE(SUM(l.amount), 0) AS BIGINT) FROM ledger l \
               JOIN accounts a ON a.account_id = l.account_id WHERE a.kind = 'shop'",
        )
        .await;
    if money_held != money_issued {
        violations.push(format!(
            "money not conserved: {money_held} held, {money_issued} issued"
        ));
    }

    Money {
        sessions,
        payments,
        refunds,
        declines,
        held: money_held,
        issued: money_issued,
        live_payments,
        shops_hold,
    }
}

/// Waits (bounded) until every event is delivered, then holds each shop's orders against the
/// checkout: paid exactly when the checkout has its payment (by that payment, learned from the
/// webhook), refunded as much as the checkout refunded, the bonus the state those imply, and one
/// inbox entry per event. Returns (events, delivery attempts, orders checked).
async fn check_shops(world: &World, violations: &mut Vec<String>) -> (i64, i64, u64) {
    // A deposit's event is the operator's record, for no shop: never sent (`no_endpoint`).
    const PENDING: &str = "status <> 'delivered' AND type <> 'deposit.succeeded'";
    let undelivered = &format!("SELECT COUNT(*) FROM webhook_events WHERE {PENDING}");
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while world.db.scalar(undelivered).await > 0 {
        if std::time::Instant::now() > deadline {
            violations.push(format!(
                "{} events still undelivered after 3 minutes, e.g. {} ({} attempts): {}",
                world.db.scalar(undelivered).await,
                world.db.scalar_text(&format!("SELECT event_id || ' ' || type || ' ' || status FROM webhook_events WHERE {PENDING} ORDER BY seq LIMIT 1")).await,
                world.db.scalar(&format!("SELECT attempts FROM webhook_events WHERE {PENDING} ORDER BY seq LIMIT 1")).await,
                world.db.scalar_text(&format!("SELECT COALESCE(last_error, '-') FROM webhook_events WHERE {PENDING} ORDER BY seq LIMIT 1")).await,
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = world.db.scalar("SELECT COUNT(*) FROM webhook_events").await;
    let attempts = world
        .db
        .scalar("SELECT CAST(COALESCE(SUM(attempts), 0) AS BIGINT) FROM webhook_events")
        .await;
    let mut checked = 0;
    for (i, shop) in world.shops.iter().enumerate() {
        let shop = shop.lock().await;
        let account = &world.shop_accounts[i];
        let sent = world
            .db
            .scalar(&format!(
                "SELECT COUNT(*) FROM webhook_events WHERE shop_account_id = '{account}'"
            ))
            .await;
        let received = shop
            .scalar("SELECT COUNT(*) FROM inbox WHERE status = 'done'")
            .await;
        if sent != received {
            violations.push(format!(
                "shop {i}: {sent} events sent, {received} in its inbox"
            ));
            let log = shop.log();
            let failures: Vec<&str> = log.lines().filter(|l| l.contains("failed")).collect();
            for line in failures.iter().rev().take(5) {
                eprintln!("shop {i} log: {line}");
            }
        }
        let mut paid_orders = 0;
        for order in shop.orders().await {
            checked += 1;
            let id = &order.id;
            let at_checkout = world
                .db
                .scalar(&format!(
                    "SELECT COUNT(*) FROM payments WHERE order_id = '{id}' AND shop_account_id = '{account}'"
                ))
                .await;
            match (at_checkout, order.payment_id.as_deref()) {
                (0, None) if order.state == "awaiting_payment" && order.bonus.is_none() => {}
                (1, Some(payment)) if order.state == "paid" => {
                    paid_orders += 1;
                    let same = world
                        .db
                        .scalar(&format!(
                            "SELECT COUNT(*) FROM payments WHERE payment_id = '{payment}' \
                              AND order_id = '{id}' AND amount = {} AND refunded = {}",
                            order.amount, order.refunded
                        ))
                        .await;
                    let bonus = (order.amount - order.refunded) / 100 / 10;
                    if same != 1
                        || order.bonus != Some(bonus)
                        || order.paid_via.as_deref() != Some("webhook")
                    {
                        violations.push(format!(
                            "shop {i}: order {id} is {order:?}; the checkout disagrees (bonus should be {bonus})"
                        ));
                    }
                }
                _ => violations.push(format!(
                    "shop {i}: order {id} is {order:?}, with {at_checkout} payments at the checkout"
                )),
            }
        }
        let payments = world
            .db
            .scalar(&format!(
                "SELECT COUNT(*) FROM payments WHERE shop_account_id = '{account}'"
            ))
            .await;
        if payments != paid_orders {
            violations.push(format!(
                "shop {i}: {payments} payments at the checkout, {paid_orders} paid orders"
            ));
        }
    }
    (events, attempts, checked)
}

/// The next thing a client sends: a new session, payment or refund, or a key sent before.
fn next_request(ledger: &Mutex<Ledger>, world: &World) -> (String, Intent, usize, bool) {
    let mut rng = rand::rng();
    let mut ledger = ledger.lock().unwrap();
    // About 30 % of requests are duplicates: a fifth are retries of an earlier key, and a fifth
    // of new intents go out as two concurrent copies.
    if rng.random_bool(0.2) && !ledger.to_retry.is_empty() {
        let i = rng.random_range(0..ledger.to_retry.len());
        let key = ledger.to_retry.swap_remove(i);
        let intent = ledger.keys[&key].intent.clone();
        return (key, intent, 1, true);
    }
    let shop = rng.random_range(0..world.shop_keys.len());
    let refundable = ledger.paid.get(&shop).filter(|p| !p.is_empty()).cloned();
    let intent = if ledger.open_sessions.len() < 4 || rng.random_bool(0.3) {
        // One or two bars of chocolate (40,00 ₽ each) in the shop's storefront.
        Intent {
            kind: Kind::Session { shop },
            token: String::new(),
            path: "/orders".into(),
            body: json!({ "qty": rng.random_range(1..=2) }),
        }
    } else if let Some(paid) = refundable.filter(|_| rng.random_bool(0.25)) {
        let (payment_id, amount) = paid[rng.random_range(0..paid.len())].clone();
        Intent {
            kind: Kind::Refund,
            token: world.shop_keys[shop].clone(),
            path: format!("/api/payments/{payment_id}/refunds"),
            body: json!({ "amount": rng.random_range(1..=amount.max(1) / 2 + 1) }),
        }
    } else {
        // Mostly a session nobody paid yet; now and then one that may be paid already.
        let (session, shop) = if rng.random_bool(0.1) {
            ledger.all_sessions[rng.random_range(0..ledger.all_sessions.len())].clone()
        } else {
            let i = rng.random_range(0..ledger.open_sessions.len());
            ledger.open_sessions.swap_remove(i)
        };
        // A shopper of the session's mode (the other mode's is refused, and moves nothing).
        let shoppers = if world.shop_live[shop] {
            &world.live_tokens
        } else {
            &world.tokens
        };
        Intent {
            kind: Kind::Payment { shop },
            token: shoppers[rng.random_range(0..shoppers.len())].clone(),
            path: "/api/payments".into(),
            body: pay_session(&session),
        }
    };
    let key = new_key();
    ledger.keys.insert(
        key.clone(),
        KeyRecord {
            intent: intent.clone(),
            first_answer: None,
        },
    );
    let copies = if rng.random_bool(0.2) { 2 } else { 1 };
    (key, intent, copies, false)
}

/// Notes an answer; a definite one must equal the first definite one seen for the key.
/// Returns whether there was an answer at all.
fn record(ledger: &Mutex<Ledger>, key: &str, answer: Option<&Answer>) -> bool {
    let mut ledger = ledger.lock().unwrap();
    let Some(answer) = answer.filter(|a| is_definite(a)) else {
        ledger.to_retry.push(key.to_owned());
        return answer.is_some();
    };
    let record = ledger.keys.get_mut(key).expect("a known key");
    match &record.first_answer {
        Some((status, body)) if *status != answer.status || *body != answer.body => {
            ledger
                .violations
                .push(format!("key {key}: two different definite answers"));
        }
        Some(_) => {}
        None => {
            record.first_answer = Some((answer.status, answer.body.clone()));
            let kind = record.intent.kind.clone();
            if answer.status == StatusCode::CREATED {
                let body = answer.json();
                let text = |field: &str| body[field].as_str().unwrap_or_default().to_owned();
                match kind {
                    Kind::Session { shop } => {
                        let session = (text("session_id"), shop);
                        ledger.open_sessions.push(session.clone());
                        ledger.all_sessions.push(session);
                    }
                    Kind::Payment { shop } => {
                        let paid = (text("payment_id"), body["amount"].as_i64().unwrap_or(0));
                        ledger.paid.entry(shop).or_default().push(paid);
                    }
                    Kind::Refund => {}
                }
            }
            // Some settled keys are sent again later: their replay must not differ.
            if rand::rng().random_bool(0.2) {
                ledger.to_retry.push(key.to_owned());
            }
        }
    }
    true
}

impl Report {
    pub fn summary(&self) -> String {
        format!(
            "{} × {} server(s): {} requests ({} duplicates) over {} keys; {} sessions, {} payments, {} refunds, {} declines; \
             {} requests got no answer; {} server kills, {} shop kills, {} database restarts; {} final retries; \
             money held {} of {} issued (shops {}); {} events in {} delivery attempts, {} shop orders checked; violations: {}",
            self.backend,
            self.servers,
            self.requests,
            self.duplicates,
            self.keys,
            self.sessions,
            self.payments,
            self.refunds,
            self.declines,
            self.no_answer,
            self.server_kills,
            self.shop_kills,
            self.database_restarts,
            self.final_retries,
            self.money_held,
            self.money_issued,
            self.shops_hold,
            self.events,
            self.webhook_attempts,
            self.shop_orders,
            self.violations.len()
        )
    }
}
