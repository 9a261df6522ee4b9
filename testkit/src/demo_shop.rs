//! A real `demo-shop` process: its storefront, back office, inbox and database.

use reqwest::StatusCode;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use crate::*;

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
            .env("RUST_LOG", "info,sqlx=warn");
        let Listening {
            child, log, addr, ..
        } = listening(command, env, "demo-shop").await;
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

/// The demo shop's staff password in tests, and its Argon2id hash (`demo-shop hash-password`),
/// which every test shop is given.
pub const STAFF_PASSWORD: &str = "staff-test-password";

pub const STAFF_PASSWORD_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$RAyOPSB08H6i/EG2djIkLw$AAg4/XSIzgnwM2y8dn8sL9wroyr+Pory63sQP82RflI";
