//! The API client the tests speak through, and the answers they check.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

use crate::*;

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
