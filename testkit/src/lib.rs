//! The test harness: a real `checkout-server` process on a free port over a real SQLite file
//! or a real PostgreSQL database, a small API client, and the contract's invariants checked
//! in the database itself. Used by the backend's tests and by the browser tests.

pub mod chromium;
pub mod dashboard;
pub mod mail;
pub mod patroni;
pub mod pgbouncer;
pub mod postgres;
pub mod rabbitmq;
pub mod receipts;
pub mod receiver;
pub mod slow_link;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use checkout_backend::store::invariants::verify_database;
pub use checkout_backend::store::invariants::{Scope, Verified};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// One test per scenario and database: `on_both_databases!(a, b)` makes `sqlite::a`,
/// `postgres::a`, … each calling the scenario `async fn a(backend: Backend)` of the caller.
#[macro_export]
macro_rules! on_both_databases {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::Backend::Postgres).await
                }
            )*
        }
    };
}

/// As [`on_both_databases!`], and a third time with the servers reaching PostgreSQL through
/// PgBouncer in transaction pooling mode (`pgbouncer::a`, …).
#[macro_export]
macro_rules! on_every_database {
    ($($scenario:ident),* $(,)?) => {
        $crate::on_both_databases!($($scenario),*);
        mod pgbouncer {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::Backend::PgBouncer).await
                }
            )*
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    /// PostgreSQL, the servers reaching it through PgBouncer (transaction pooling); the test's
    /// own checks read the database directly.
    PgBouncer,
}

/// One test's database, kept until the test ends.
pub struct TestDb {
    /// The database itself, for the test's own reads and the operator's commands.
    pub url: String,
    /// What a server is given as `DATABASE_URL` (the same, or through PgBouncer).
    pub server_url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        sqlx::any::install_default_drivers();
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("checkout.db").display());
                TestDb {
                    server_url: url.clone(),
                    url,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => TestDb::on(postgres::cluster()).await,
            Backend::PgBouncer => {
                let db = TestDb::on(postgres::cluster()).await;
                // Behind a transaction pooler the server does not migrate: the operator's
                // `checkout-server migrate` does, on PostgreSQL itself.
                checkout_backend::store::Store::migrate(&db.url)
                    .await
                    .expect("the migrations run on PostgreSQL itself");
                TestDb {
                    server_url: pgbouncer::bouncer().url_of(&db.url),
                    ..db
                }
            }
        }
    }

    /// A database some other part of the test made (behind HAProxy, say).
    pub fn at(url: String) -> TestDb {
        sqlx::any::install_default_drivers();
        TestDb {
            server_url: url.clone(),
            url,
            _dir: None,
        }
    }

    /// The same database, its servers reaching it at `server_url` (a pooler in transaction
    /// mode in front of it).
    pub fn served_through(self, server_url: String) -> TestDb {
        TestDb { server_url, ..self }
    }

    /// A fresh database on this PostgreSQL cluster.
    pub async fn on(cluster: &postgres::Cluster) -> TestDb {
        sqlx::any::install_default_drivers();
        let url = cluster.create_database().await;
        TestDb {
            server_url: url.clone(),
            url,
            _dir: None,
        }
    }

    pub async fn connect(&self) -> sqlx::AnyConnection {
        sqlx::Connection::connect(&self.url)
            .await
            .expect("the test connects to its database")
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        let mut conn = self.connect().await;
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }

    /// A text the database answers (one row, one column).
    pub async fn scalar_text(&self, sql: &str) -> String {
        let mut conn = self.connect().await;
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }

    /// Everything the payments of `session_id` wrote, counted (payments, their ledger rows,
    /// their waiting credits, their events), and the session's `status/payment_id`.
    pub async fn payment_footprint(&self, session_id: &str) -> (i64, i64, i64, i64, String) {
        let of_payments = |table: &str, column: &str| {
            format!(
                "SELECT COUNT(*) FROM {table} WHERE {column} IN \
                   (SELECT payment_id FROM payments WHERE checkout_session_id = '{session_id}')"
            )
        };
        (
            self.scalar(&format!(
                "SELECT COUNT(*) FROM payments WHERE checkout_session_id = '{session_id}'"
            ))
            .await,
            self.scalar(&of_payments("ledger", "payment_id")).await,
            self.scalar(&of_payments("unfolded_credits", "payment_id"))
                .await,
            self.scalar(&of_payments("webhook_events", "subject_id"))
                .await,
            self.scalar_text(&format!(
                "SELECT status || '/' || COALESCE(payment_id, '-') FROM checkout_sessions \
                  WHERE session_id = '{session_id}'"
            ))
            .await,
        )
    }

    /// A column of texts the database answers.
    pub async fn texts(&self, sql: &str) -> Vec<String> {
        let mut conn = self.connect().await;
        sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
    }

    pub async fn execute(&self, sql: &str) {
        let mut conn = self.connect().await;
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }

    /// Every invariant of the books (the server's own list, as `checkout-server verify` runs
    /// it), in one snapshot; panics naming each one broken and the ids breaking it.
    pub async fn assert_invariants(&self) {
        self.assert_invariants_in(Scope::KeysNeverReused).await;
    }

    /// As [`assert_invariants`], for a test that lets a key expire and be used again (so one
    /// key string may have moved money twice, each time under its own claim).
    pub async fn assert_invariants_after_key_reuse(&self) {
        self.assert_invariants_in(Scope::Service).await;
    }

    async fn assert_invariants_in(&self, scope: Scope) {
        let verified = self.verify(scope).await;
        let broken: Vec<String> = verified
            .checked
            .iter()
            .filter(|c| !c.violations.is_empty())
            .map(|c| {
                format!(
                    "{} ({}): {:?}",
                    c.invariant.name, c.invariant.says, c.violations
                )
            })
            .collect();
        assert!(broken.is_empty(), "invariants broken: {broken:#?}");
    }

    /// The invariants checked in one snapshot, by the code `checkout-server verify` runs.
    pub async fn verify(&self, scope: Scope) -> Verified {
        verify_database(&self.url, scope)
            .await
            .expect("the invariants can be read")
    }

    /// The names of the invariants that the tables break right now.
    pub async fn broken_invariants(&self) -> Vec<&'static str> {
        self.verify(Scope::KeysNeverReused).await.broken()
    }
}

/// A running `checkout-server` process.
pub struct Server {
    pub base: String,
    /// The address this server's mail comes from: one per server, so that a test reads only
    /// its own server's mail in the receiver every test of the binary shares.
    pub mail_from: String,
    binary: String,
    database_url: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `binary` (a `checkout-server` build) over `db` on a free port.
    pub async fn start(binary: &str, db: &TestDb) -> Server {
        Server::start_with(binary, db, &[]).await
    }

    /// Starts the server with extra `CHECKOUT_*` settings and waits for its
    /// `listening on http://ADDR` line.
    pub async fn start_with(binary: &str, db: &TestDb, env: &[(&str, &str)]) -> Server {
        let mail_from = format!(
            "no-reply+{}@checkout.localhost",
            uuid::Uuid::new_v4().simple()
        );
        let mut command = Command::new(binary);
        command
            .env("DATABASE_URL", &db.server_url)
            .env(
                "CHECKOUT_DB_POOLER",
                if db.server_url == db.url {
                    "none"
                } else {
                    "transaction"
                },
            )
            .env("CHECKOUT_ADDR", "127.0.0.1:0")
            .env("CHECKOUT_DEMO", "1")
            .env("CHECKOUT_STATIC_DIR", "/nonexistent")
            // Tests make many shoppers and keyed requests from one address; a test of the
            // limits sets its own.
            .env("CHECKOUT_TEST_SHOPPERS_PER_ADDRESS", "1000000")
            .env("CHECKOUT_SIGN_IN_PER_ADDRESS", "1000000")
            .env("CHECKOUT_SIGN_IN_PER_ACCOUNT", "1000000")
            .env("CHECKOUT_KEYS_IN_PROGRESS", "100000")
            // A live shopper's codes go to the tests' own SMTP server, where a test reads them.
            .env("CHECKOUT_SMTP_URL", mail::receiver().url())
            .env(
                "CHECKOUT_MAIL_FROM",
                format!("Оплата заказов <{mail_from}>"),
            )
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let Listening { child, log, addr } = listening(command, "checkout-server").await;
        Server {
            base: format!("http://{addr}"),
            mail_from,
            binary: binary.to_owned(),
            database_url: db.url.clone(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown, no flush, exactly like a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status, once the process has ended by itself (`None` while it runs).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then the exit status once it has stopped.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Reads the log later, even after the server is gone (for a failure report).
    pub fn log_handle(&self) -> impl Fn() -> String + Send + 'static {
        let log = self.log.clone();
        move || log.lock().unwrap().join("\n")
    }

    pub fn api(&self) -> Api {
        Api {
            mail_from: Some(self.mail_from.clone()),
            ..Api::new(&self.base)
        }
    }

    /// A new shop, added as an operator adds one: `checkout-server shop add` over the same
    /// database, beside the running server.
    pub async fn add_shop(&self, name: &str) -> Shop {
        add_shop(&self.binary, &self.database_url, &self.base, name).await
    }

    /// Runs `checkout-server ARGS…` over the same database, beside the running server, as an
    /// operator does: its exit status, stdout and stderr.
    pub async fn operator(&self, args: &[&str]) -> (bool, String, String) {
        let output = tokio::process::Command::new(&self.binary)
            .args(args)
            .env("DATABASE_URL", &self.database_url)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .expect("checkout-server runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// `checkout-server shopper deposit`: whether it worked, and its JSON line (or its error).
    pub async fn deposit(&self, email: &str, amount: i64, key: &str) -> (bool, Value) {
        let amount = amount.to_string();
        let (ok, out, err) = self
            .operator(&[
                "shopper", "deposit", "--email", email, "--amount", &amount, "--key", key,
            ])
            .await;
        if ok {
            (
                true,
                serde_json::from_str(out.trim()).expect("deposit prints JSON"),
            )
        } else {
            (false, Value::String(err))
        }
    }

    /// A new shop whose events go to `webhook_url`.
    pub async fn add_shop_with_webhook(&self, name: &str, webhook_url: &str) -> Shop {
        add_shop_with(
            &self.binary,
            &self.database_url,
            &self.base,
            name,
            Some(webhook_url),
            &[],
        )
        .await
    }
}

/// A shop as a test drives it: its secrets (shown once, by `shop add`) and its API client, in
/// test mode (what most tests use) and in live mode.
#[derive(Clone)]
pub struct Shop {
    pub shop_id: String,
    pub signing_secret: String,
    pub api: Api,
    pub live_signing_secret: String,
    pub live_api: Api,
}

/// Runs `checkout-server shop add --name NAME` over `database_url` and reads its one JSON line.
pub async fn add_shop(binary: &str, database_url: &str, base: &str, name: &str) -> Shop {
    add_shop_with(binary, database_url, base, name, None, &[]).await
}

/// `shop add`, with a webhook URL if given, and the origins of the shop's pages (where its
/// payment pages may be framed and its `return_url`s lead).
pub async fn add_shop_with(
    binary: &str,
    database_url: &str,
    base: &str,
    name: &str,
    webhook_url: Option<&str>,
    origins: &[&str],
) -> Shop {
    let mut args = vec!["shop", "add", "--name", name];
    if let Some(url) = webhook_url {
        args.extend(["--webhook-url", url]);
    }
    for origin in origins {
        args.extend(["--origin", origin]);
    }
    let output = tokio::process::Command::new(binary)
        .args(&args)
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("checkout-server shop add runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "shop add failed: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "shop add prints one line: {stdout}");
    let printed: Value = serde_json::from_str(lines[0]).expect("shop add prints JSON");
    let text = |mode: &str, field: &str| printed[mode][field].as_str().expect(field).to_owned();
    Shop {
        shop_id: printed["shop_id"].as_str().expect("shop_id").to_owned(),
        signing_secret: text("test", "signing_secret"),
        api: Api {
            token: Some(text("test", "secret_key")),
            ..Api::new(base)
        },
        live_signing_secret: text("live", "signing_secret"),
        live_api: Api {
            token: Some(text("live", "secret_key")),
            ..Api::new(base)
        },
    }
}

impl Shop {
    /// Its credentials in one mode, as the demo shop reads them from `SHOP_CREDENTIALS_FILE`.
    pub fn credentials(&self, live: bool) -> Value {
        let (api, signing_secret) = if live {
            (&self.live_api, &self.live_signing_secret)
        } else {
            (&self.api, &self.signing_secret)
        };
        serde_json::json!({
            "shop_id": self.shop_id,
            "secret_key": api.token,
            "signing_secret": signing_secret,
        })
    }

    /// Creates a checkout session under `key`: the raw answer.
    pub async fn try_session(&self, key: &str, body: &Value) -> Answer {
        self.api
            .send(self.api.post("/api/checkout-sessions", Some(key), body))
            .await
            .expect("the server answers")
    }

    /// A new open session for `order_id` and `amount` (one item), under a fresh key: its id.
    pub async fn session(&self, order_id: &str, amount: i64) -> String {
        let answer = self
            .try_session(&new_key(), &session_request(order_id, amount))
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.json()["session_id"].as_str().unwrap().to_owned()
    }

    /// The request body that pays a new session for `order_id` and `amount`.
    pub async fn checkout(&self, order_id: &str, amount: i64) -> Value {
        pay_session(&self.session(order_id, amount).await)
    }

    pub async fn refund(&self, payment_id: &str, key: &str, amount: i64) -> Answer {
        self.api.refund(payment_id, key, amount).await
    }

    pub async fn balance(&self) -> i64 {
        self.api.balance().await
    }
}

/// A session's request: one item making up the amount.
pub fn session_request(order_id: &str, amount: i64) -> Value {
    json!({
        "order_id": order_id,
        "amount": amount,
        "description": format!("Заказ {order_id}"),
        "items": [{ "name": "Товар", "quantity": 1, "unit_price": amount }],
    })
}

/// The body of a payment of this session.
pub fn pay_session(session_id: &str) -> Value {
    json!({ "checkout_session_id": session_id })
}

/// A started process, its log (both pipes, line by line) and the address it announced.
struct Listening {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    addr: String,
}

/// Spawns `command` and waits for its `listening on http://ADDR` line.
async fn listening(mut command: Command, what: &str) -> Listening {
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{what} starts: {e}"));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (addr_tx, addr_rx) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let (log, addr_tx) = (log.clone(), addr_tx.clone());
        // Keep draining the pipe for the server's whole life, or it would block on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                    let _ = addr_tx.send(addr);
                }
                let mut log = log.lock().unwrap();
                // Bounded: a benchmark's server logs a line per request.
                if log.len() >= 200_000 {
                    log.drain(..100_000);
                }
                log.push(line);
            }
        });
    }
    // Only the readers hold a sender now: a server that exits ends the wait at once.
    drop(addr_tx);
    let addr = tokio::task::spawn_blocking(move || addr_rx.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap();
    let addr = match addr {
        Ok(addr) => addr,
        Err(_) => panic!(
            "{what} did not start ({:?}):\n{}",
            child.try_wait(),
            log.lock().unwrap().join("\n")
        ),
    };
    Listening { child, log, addr }
}

/// A running demo shop (`demo-shop`): its own SQLite database in a temporary directory, the
/// checkout at `checkout_base`, the demo shop's credentials from `credentials_file`.
pub struct DemoShop {
    pub base: String,
    pub database: std::path::PathBuf,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    dir: Arc<tempfile::TempDir>,
    /// How it was started, to start it again on the same address and database.
    binary: String,
    checkout_base: String,
    credentials_file: std::path::PathBuf,
}

impl DemoShop {
    pub async fn start(
        binary: &str,
        checkout_base: &str,
        credentials_file: &std::path::Path,
        env: &[(&str, &str)],
    ) -> DemoShop {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        DemoShop::spawn(binary, checkout_base, credentials_file, env, dir).await
    }

    /// The same shop again (same address, same database) after it died or was killed.
    pub async fn restart(&mut self, env: &[(&str, &str)]) {
        self.kill();
        let addr = self.base.trim_start_matches("http://").to_owned();
        let mut env = env.to_vec();
        env.push(("SHOP_ADDR", &addr));
        let again = DemoShop::spawn(
            &self.binary,
            &self.checkout_base,
            &self.credentials_file,
            &env,
            self.dir.clone(),
        )
        .await;
        let old = std::mem::replace(self, again);
        // The old handle's child is gone already; its drop kills nothing that lives.
        drop(old);
    }

    /// `true` once the process has ended on its own (a crash).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    async fn spawn(
        binary: &str,
        checkout_base: &str,
        credentials_file: &std::path::Path,
        env: &[(&str, &str)],
        dir: Arc<tempfile::TempDir>,
    ) -> DemoShop {
        let database = dir.path().join("demo-shop.db");
        let mut command = Command::new(binary);
        command
            .env("SHOP_ADDR", "127.0.0.1:0")
            .env(
                "SHOP_DATABASE_URL",
                format!("sqlite://{}", database.display()),
            )
            .env("CHECKOUT_URL", format!("{checkout_base}/"))
            .env("SHOP_CREDENTIALS_FILE", credentials_file)
            .env("SHOP_STAFF_PASSWORD_HASH", STAFF_PASSWORD_HASH)
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let Listening { child, log, addr } = listening(command, "demo-shop").await;
        DemoShop {
            base: format!("http://{addr}"),
            database,
            child,
            log,
            dir,
            binary: binary.to_owned(),
            checkout_base: checkout_base.to_owned(),
            credentials_file: credentials_file.to_owned(),
        }
    }

    /// Signs in to the back office as its staff (as a server-side client, which sends no
    /// `Origin`): the `Cookie` header value to send with later requests.
    pub async fn staff_cookie(&self) -> String {
        let answer = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(format!("{}/admin/login", self.base))
            .form(&[("password", STAFF_PASSWORD)])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "signed in");
        let set = answer.headers()["set-cookie"].to_str().unwrap();
        set.split(';').next().unwrap().to_owned()
    }

    /// A number the shop's own database answers (`SELECT COUNT(*) …`).
    pub async fn scalar(&self, sql: &str) -> i64 {
        use sqlx::Connection;
        let url = format!("sqlite://{}", self.database.display());
        let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let value: i64 = sqlx::query_scalar(sql).fetch_one(&mut db).await.unwrap();
        value
    }

    /// Every order as the shop's database holds it.
    pub async fn orders(&self) -> Vec<ShopOrder> {
        use sqlx::Connection;
        let url = format!("sqlite://{}", self.database.display());
        let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let rows: Vec<ShopOrderRow> = sqlx::query_as(
            "SELECT id, state, payment_id, amount, refunded, \
                        (SELECT points FROM bonuses b WHERE b.order_id = orders.id), \
                        paid_via, checkout_session_id FROM orders",
        )
        .fetch_all(&mut db)
        .await
        .unwrap();
        rows.into_iter()
            .map(
                |(id, state, payment_id, amount, refunded, bonus, paid_via, session_id)| {
                    ShopOrder {
                        id,
                        state,
                        payment_id,
                        amount,
                        refunded,
                        bonus,
                        paid_via,
                        session_id,
                    }
                },
            )
            .collect()
    }

    /// A text the shop's own database answers, if any row.
    pub async fn text(&self, sql: &str) -> Option<String> {
        use sqlx::Connection;
        let url = format!("sqlite://{}", self.database.display());
        let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query_scalar(sql)
            .fetch_optional(&mut db)
            .await
            .unwrap()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn log_handle(&self) -> impl Fn() -> String + Send + 'static {
        let log = self.log.clone();
        move || log.lock().unwrap().join("\n")
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (id, state, payment_id, amount, refunded, bonus, paid_via, checkout_session_id)
type ShopOrderRow = (
    String,
    String,
    Option<String>,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// An order as the demo shop holds it.
#[derive(Clone, Debug)]
pub struct ShopOrder {
    pub id: String,
    pub state: String,
    pub payment_id: Option<String>,
    pub amount: i64,
    pub refunded: i64,
    pub bonus: Option<i64>,
    pub paid_via: Option<String>,
    pub session_id: Option<String>,
}

impl Drop for DemoShop {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An answer as a client sees it.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// A header of the answer (names are lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").map(String::as_str) == Some("true")
    }

    /// The problem's `code`, or "" when the body is not a problem.
    pub fn code(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .map(String::as_str)
            .unwrap_or("")
    }

    /// A problem+json error with this status and code.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "status of {}", self.body);
        assert_eq!(
            self.content_type(),
            "application/problem+json",
            "content type of {}",
            self.body
        );
        let problem = self.json();
        assert_eq!(problem["code"], code, "code of {}", self.body);
        assert_eq!(problem["status"], status);
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "detail of {}",
            self.body
        );
    }
}

/// A shopper's session: the client as a test drives it.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
    /// Whose mail this client's shopper reads: its server's sender ([`Server::mail_from`]).
    pub mail_from: Option<String>,
}

impl Api {
    pub fn new(base: &str) -> Api {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        Api {
            base: base.to_owned(),
            http,
            token: None,
            mail_from: None,
        }
    }

    /// A fresh test shopper holding 100 000 kopecks of test money.
    pub async fn shopper(&self) -> Api {
        let answer = self
            .send(self.http.post(format!("{}/api/test/shoppers", self.base)))
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        Api {
            token: Some(answer.json()["token"].as_str().unwrap().to_owned()),
            ..self.clone()
        }
    }

    /// A live shopper signs up (`POST /api/shoppers`), reads the code in its mailbox and enters
    /// it (`POST /api/shoppers/confirm`): confirmed, signed in, no money yet.
    pub async fn live_shopper(&self, email: &str, password: &str) -> Api {
        let code = self.sign_up(email, password).await;
        let answer = self.confirm(email, &code).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        Api {
            token: Some(answer.json()["token"].as_str().unwrap().to_owned()),
            ..self.clone()
        }
    }

    /// `POST /api/shoppers`, answered `202`: the code the mail to `email` brought.
    pub async fn sign_up(&self, email: &str, password: &str) -> String {
        let mail = self
            .mailed_after(email, async {
                let answer = self
                    .send(self.post(
                        "/api/shoppers",
                        None,
                        &json!({ "email": email, "password": password }),
                    ))
                    .await
                    .unwrap();
                assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
            })
            .await;
        mail.code()
            .unwrap_or_else(|| panic!("the sign-up mail carries a code: {mail:?}"))
    }

    /// Runs `request`, then waits for the next mail to `email` it caused.
    pub async fn mailed_after(
        &self,
        email: &str,
        request: impl std::future::Future<Output = ()>,
    ) -> mail::Mail {
        let receiver = mail::receiver();
        let from = self.mail_from.as_deref();
        let before = receiver.mails(email, from).len();
        request.await;
        receiver.nth_mail(email, from, before + 1).await
    }

    /// `POST /api/shoppers/confirm`: the raw answer.
    pub async fn confirm(&self, email: &str, code: &str) -> Answer {
        self.send(self.post(
            "/api/shoppers/confirm",
            None,
            &json!({ "email": email, "code": code }),
        ))
        .await
        .unwrap()
    }

    /// `POST /api/shoppers/sign-in`: the raw answer.
    pub async fn sign_in(&self, email: &str, password: &str) -> Answer {
        self.send(self.post(
            "/api/shoppers/sign-in",
            None,
            &serde_json::json!({ "email": email, "password": password }),
        ))
        .await
        .unwrap()
    }

    /// A fresh demo shopper's token.
    pub async fn shopper_token(&self) -> String {
        self.shopper()
            .await
            .token
            .expect("a demo session has a token")
    }

    pub fn on(&self, server: &Server) -> Api {
        Api {
            base: server.base.clone(),
            mail_from: Some(server.mail_from.clone()),
            ..self.clone()
        }
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> reqwest::Result<Answer> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await?;
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let body = response.text().await?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    pub fn post(&self, path: &str, key: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        match key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    pub async fn try_pay(&self, key: &str, body: &Value) -> reqwest::Result<Answer> {
        self.send(self.post("/api/payments", Some(key), body)).await
    }

    pub async fn pay(&self, key: &str, body: &Value) -> Answer {
        self.try_pay(key, body).await.expect("the server answers")
    }

    pub async fn refund(&self, payment_id: &str, key: &str, amount: i64) -> Answer {
        self.send(self.post(
            &format!("/api/payments/{payment_id}/refunds"),
            Some(key),
            &json!({ "amount": amount }),
        ))
        .await
        .expect("the server answers")
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
            .expect("the server answers")
    }

    pub async fn balance(&self) -> i64 {
        let answer = self.get("/api/account").await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        answer.json()["balance"].as_i64().unwrap()
    }

    /// [`Api::pay_until_definite`] owning its arguments, for many payments started at once.
    pub async fn pay_until_definite_owned(&self, key: String, body: Value) -> Answer {
        self.pay_until_definite(&key, &body).await
    }

    /// Retries a payment with the same key until it has a definite answer, as a client must
    /// after a `409` in use or a lost connection. Bounded: it gives up after 200 tries.
    pub async fn pay_until_definite(&self, key: &str, body: &Value) -> Answer {
        for _ in 0..200 {
            match self.try_pay(key, body).await {
                Ok(answer)
                    if answer.status == StatusCode::CONFLICT
                        && answer.code() == "idempotency_key_in_use" =>
                {
                    assert!(
                        answer.headers.contains_key("retry-after"),
                        "a 409 in use says when to retry"
                    );
                }
                Ok(answer) if answer.status.is_server_error() => {}
                Ok(answer) => return answer,
                Err(_) => {}
            }
            // Back off like a client (this is the client's retry policy, not a synchronisation).
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("key {key} never got a definite answer");
    }
}

/// Polls `condition` every 20 ms until it holds, and fails with `what` once `within` has
/// passed: a bounded wait for something another process does, never a sleep standing in for it.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !condition().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the series `name` whose labels are exactly `labels` in a Prometheus text
/// scrape, if it was exported (label order does not matter).
pub fn metric(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: std::collections::BTreeSet<String> =
        labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    scrape.lines().find_map(|line| {
        let (series, number) = line.rsplit_once(' ')?;
        let (series_name, found) = match series.split_once('{') {
            Some((n, rest)) => (
                n,
                rest.trim_end_matches('}')
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
            None => (series, std::collections::BTreeSet::new()),
        };
        (series_name == name && found == wanted).then(|| number.parse().ok())?
    })
}

pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub const OPENING_BALANCE: i64 = 100_000;

/// The demo shop's staff password in tests, and its Argon2id hash (`demo-shop hash-password`),
/// which every test shop is given.
pub const STAFF_PASSWORD: &str = "staff-test-password";
pub const STAFF_PASSWORD_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$RAyOPSB08H6i/EG2djIkLw$AAg4/XSIzgnwM2y8dn8sL9wroyr+Pory63sQP82RflI";

/// Serves one HTML page at `/` on a free loopback port (a page of some other site, for a
/// test's browser): its base URL.
pub async fn serve_page(html: String) -> String {
    serve(axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let html = html.clone();
            async move { axum::response::Html(html) }
        }),
    ))
    .await
}

/// Serves one HTML page at every path on a free loopback port (a look-alike of another
/// server's pages, for a test's browser): its base URL.
pub async fn serve_page_at_every_path(html: String) -> String {
    serve(axum::Router::new().fallback(move || {
        let html = html.clone();
        async move { axum::response::Html(html) }
    }))
    .await
}

/// `app` on a free loopback port, for as long as the test runs: its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

/// Sends raw bytes and reads the answer until the server closes: for requests a well-behaved
/// client library will not make (a body announced but never sent).
pub async fn raw_request(base: &str, head: &str) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.lines();
    let status_line = lines.next().unwrap();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status: StatusCode::from_u16(status).unwrap(),
        headers,
        body: body.to_owned(),
    }
}
