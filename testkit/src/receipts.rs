//! A running receipts consumer (`receipts`, or `receipts-chaos` with faults) and what a test
//! checks of it: its receipts as `GET /receipts` lists them, its counters, and that the
//! receipts match the checkout's books (one per payment and per refund, for the same amount,
//! none without its payment).

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Listening, TestDb, listening};

pub struct Consumer {
    pub base: String,
    /// The bearer token its `GET /receipts` and `/metrics` ask for (`RECEIPTS_TOKEN`).
    pub token: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Consumer {
    /// Starts `binary` on `amqp_url`, its receipts in `database_url`, on a free port.
    pub async fn start(
        binary: &str,
        amqp_url: &str,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> Consumer {
        let token = format!("rct_{}", uuid::Uuid::new_v4().simple());
        let mut command = Command::new(binary);
        command
            .env("RECEIPTS_TOKEN", &token)
            .env("RECEIPTS_AMQP_URL", amqp_url)
            .env("RECEIPTS_DATABASE_URL", database_url)
            .env("RECEIPTS_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "info,sqlx=warn,lapin=warn");
        let Listening {
            child, log, addr, ..
        } = listening(command, env, "receipts").await;
        Consumer {
            base: format!("http://{addr}"),
            token,
            child,
            log,
        }
    }

    /// SIGKILL: whatever it holds unacknowledged goes back to the queue.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits (polling its log) until a line contains `needle`; panics past `within`.
    pub async fn wait_for_log(&self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "receipts never logged {needle:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `GET {path}` with its bearer token.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("receipts answers")
    }

    /// Every receipt, `GET /receipts` page after page: `{receipts: [...], totals: {income,
    /// returns, net}}`.
    pub async fn listed(&self) -> Value {
        let mut all = Vec::new();
        let mut url = "/receipts?limit=10000".to_owned();
        loop {
            let answer = self.get(&url).await;
            assert_eq!(answer.status(), 200);
            let mut page: Value = answer.json().await.unwrap();
            all.append(page["receipts"].as_array_mut().unwrap());
            match page["next_page"].as_str() {
                Some(next) if page["has_more"] == true => {
                    url = format!("/receipts?limit=10000&starting_after={next}");
                }
                _ => return serde_json::json!({ "receipts": all, "totals": page["totals"] }),
            }
        }
    }

    /// The sum of a counter's series whose line starts with `series` (`name{labels`).
    pub async fn counter(&self, series: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.unwrap();
        text.lines()
            .filter(|line| line.starts_with(series))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// How many receipts there are (`totals` of one short page: no list read).
    pub async fn count(&self) -> usize {
        let page: Value = self.get("/receipts?limit=1").await.json().await.unwrap();
        let totals = &page["totals"];
        (totals["income"].as_i64().unwrap() + totals["returns"].as_i64().unwrap()) as usize
    }

    /// Waits until `count` receipts exist, then lists them all; panics past `within` with
    /// what is there.
    pub async fn wait_for_receipts(&self, count: usize, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let have = self.count().await;
            if have >= count {
                return self.listed().await;
            }
            assert!(
                Instant::now() < deadline,
                "{have} receipts of {count} after {within:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The receipts match the checkout's books: exactly one «приход» per payment for its amount,
/// one «возврат прихода» per refund for its amount, none for a payment or refund that does not
/// exist, and their net sum is the payments' minus the refunds'.
pub async fn assert_match_the_books(db: &TestDb, listed: &Value) {
    let mismatches = mismatches_with_the_books(db, listed).await;
    assert!(
        mismatches.is_empty(),
        "the receipts do not match the books: {mismatches:#?}"
    );
}

/// What [`assert_match_the_books`] checks, each mismatch said (for a campaign's report).
pub async fn mismatches_with_the_books(db: &TestDb, listed: &Value) -> Vec<String> {
    let mut mismatches = Vec::new();
    let amounts = |rows: Vec<String>| -> HashMap<String, i64> {
        rows.iter()
            .map(|row| {
                let (id, amount) = row.split_once(' ').unwrap();
                (id.to_owned(), amount.parse().unwrap())
            })
            .collect()
    };
    let payments = amounts(
        db.texts("SELECT payment_id || ' ' || CAST(amount AS TEXT) FROM payments")
            .await,
    );
    let refunds = amounts(
        db.texts("SELECT refund_id || ' ' || CAST(amount AS TEXT) FROM refunds")
            .await,
    );
    let mut income: HashMap<String, Vec<i64>> = HashMap::new();
    let mut returns: HashMap<String, Vec<i64>> = HashMap::new();
    for receipt in listed["receipts"].as_array().unwrap() {
        let total = receipt["total"].as_i64().unwrap();
        let lines: i64 = receipt["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|line| line["total"].as_i64().unwrap())
            .sum();
        if lines != total {
            mismatches.push(format!(
                "a receipt's lines do not add up to its total: {receipt}"
            ));
        }
        match receipt["kind"].as_str().unwrap() {
            "income" => income
                .entry(receipt["payment_id"].as_str().unwrap().to_owned())
                .or_default()
                .push(total),
            "income_return" => returns
                .entry(receipt["refund_id"].as_str().unwrap().to_owned())
                .or_default()
                .push(total),
            other => mismatches.push(format!("a receipt of kind {other}")),
        }
    }
    let mut check =
        |what: &str, books: &HashMap<String, i64>, receipts: &HashMap<String, Vec<i64>>| {
            for (id, amount) in books {
                if receipts.get(id) != Some(&vec![*amount]) {
                    mismatches.push(format!(
                        "{what} {id} of {amount} has receipts {:?}, not exactly one of that amount",
                        receipts.get(id)
                    ));
                }
            }
            for id in receipts.keys() {
                if !books.contains_key(id) {
                    mismatches.push(format!("a receipt for {what} {id}, which does not exist"));
                }
            }
        };
    check("payment", &payments, &income);
    check("refund", &refunds, &returns);
    let net = payments.values().sum::<i64>() - refunds.values().sum::<i64>();
    if listed["totals"]["net"].as_i64() != Some(net) {
        mismatches.push(format!(
            "receipts sum to {}, the payments minus the refunds to {net}",
            listed["totals"]["net"]
        ));
    }
    mismatches
}
