//! A real `checkout-server` process on a free port, and a shop as the operator adds it.

use reqwest::StatusCode;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::*;

/// A running `checkout-server` process.
pub struct Server {
    pub base: String,
    /// The address this server's mail comes from: one per server, so that a test reads only
    /// its own server's mail in the receiver every test of the binary shares.
    pub mail_from: String,
    pub(crate) binary: String,
    pub(crate) database_url: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    drained: mpsc::Receiver<()>,
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
            .env("RUST_LOG", "info,sqlx=warn");
        let Listening {
            child,
            log,
            addr,
            drained,
        } = listening(command, env, "checkout-server").await;
        Server {
            base: format!("http://{addr}"),
            mail_from,
            binary: binary.to_owned(),
            database_url: db.url.clone(),
            child,
            log,
            drained,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown, no flush, exactly like a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.wait_for_last_words();
    }

    /// Once the process has ended: until its log holds every line it wrote (the pipes' readers
    /// reach their end a moment after the exit; a test reading the log at once missed the
    /// last line, "stopped").
    fn wait_for_last_words(&self) {
        for _ in 0..2 {
            if self.drained.recv_timeout(Duration::from_secs(5)).is_err() {
                break;
            }
        }
    }

    /// The exit status, once the process has ended by itself (`None` while it runs).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.try_wait().ok().flatten()?;
        self.wait_for_last_words();
        Some(status)
    }

    /// SIGTERM, then the exit status once it has stopped.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let status = self.child.wait().unwrap();
        self.wait_for_last_words();
        status
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

/// A started process, its log (both pipes, line by line) and the address it announced.
pub(crate) struct Listening {
    pub(crate) child: Child,
    pub(crate) log: Arc<Mutex<Vec<String>>>,
    pub(crate) addr: String,
    /// A message from each pipe's reader once it has read the pipe to its end.
    pub(crate) drained: mpsc::Receiver<()>,
}

/// Spawns `command` with `env` on top of its settings, its output piped into its log, and
/// waits for its `listening on http://ADDR` line.
pub(crate) async fn listening(mut command: Command, env: &[(&str, &str)], what: &str) -> Listening {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{what} starts: {e}"));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (addr_tx, addr_rx) = mpsc::channel();
    let (drained_tx, drained) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let (log, addr_tx, drained_tx) = (log.clone(), addr_tx.clone(), drained_tx.clone());
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
            let _ = drained_tx.send(());
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
    Listening {
        child,
        log,
        addr,
        drained,
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
