//! A shop's webhook endpoint for tests: a real HTTP server on loopback that records every
//! delivery attempt (headers, body, when) and answers as told: a status per attempt, or no
//! answer at all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;

/// One attempt as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub webhook_id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: String,
    pub headers: HeaderMap,
    pub at: Instant,
}

/// How the receiver answers.
#[derive(Clone, Debug)]
pub enum Answer {
    Status(u16),
    /// Holds the request until the sender gives up.
    Never,
    /// `307 Temporary Redirect` to this URL.
    Redirect(String),
}

#[derive(Default)]
struct Inner {
    deliveries: Vec<Delivery>,
    /// Answers for the next attempts, in order; then `then`.
    script: std::collections::VecDeque<Answer>,
    then: Option<Answer>,
}

#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl Receiver {
    /// Listens on a free loopback port; answers `200` unless told otherwise.
    pub async fn start() -> Receiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/webhooks", post(receive))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/webhooks", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, inner }
    }

    /// The next attempts get these answers, in order; later ones get `then`.
    pub fn answer(&self, script: Vec<Answer>, then: Answer) {
        let mut inner = self.inner.lock().unwrap();
        inner.script = script.into();
        inner.then = Some(then);
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.inner.lock().unwrap().deliveries.clone()
    }

    /// Waits until at least `n` attempts arrived (or `within` passed), then returns them all.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Delivery> {
        crate::wait_until(
            &format!("the receiver never got {n} deliveries"),
            within,
            || async { self.deliveries().len() >= n },
        )
        .await;
        self.deliveries()
    }
}

async fn receive(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let answer = {
        let mut inner = inner.lock().unwrap();
        inner.deliveries.push(Delivery {
            webhook_id: text("webhook-id"),
            timestamp: text("webhook-timestamp"),
            signature: text("webhook-signature"),
            body: String::from_utf8_lossy(&body).into_owned(),
            headers: headers.clone(),
            at: Instant::now(),
        });
        let then = inner.then.clone().unwrap_or(Answer::Status(200));
        inner.script.pop_front().unwrap_or(then)
    };
    match answer {
        Answer::Status(status) => StatusCode::from_u16(status).unwrap().into_response(),
        Answer::Never => std::future::pending().await,
        Answer::Redirect(to) => (
            StatusCode::TEMPORARY_REDIRECT,
            [(axum::http::header::LOCATION, to)],
        )
            .into_response(),
    }
}
