//! The shop's one error type: a page in Russian with the right status for a person, and
//! `{"error": …}` for the page's own script.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::checkout_api::CallError;
use crate::pages;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error("not found")]
    NotFound,
    /// The person sent something the shop cannot act on; the text says what, in Russian.
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    Conflict(String),
    /// Not allowed from here (not signed in, a forged form, another site's request).
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Checkout(#[from] CallError),
    /// The checkout's answer contradicts the order: never marked paid on it.
    #[error("the checkout's payment does not match the order: {0}")]
    Mismatch(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

impl ShopError {
    fn status(&self) -> StatusCode {
        match self {
            ShopError::NotFound => StatusCode::NOT_FOUND,
            ShopError::BadInput(_) => StatusCode::BAD_REQUEST,
            ShopError::Conflict(_) => StatusCode::CONFLICT,
            ShopError::Forbidden(_) => StatusCode::FORBIDDEN,
            ShopError::Checkout(CallError::Refused(_)) => StatusCode::CONFLICT,
            ShopError::Checkout(CallError::Unavailable(_)) => StatusCode::BAD_GATEWAY,
            ShopError::Mismatch(_) | ShopError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What the person reads.
    pub fn message(&self) -> String {
        match self {
            ShopError::NotFound => "Такой страницы нет".into(),
            ShopError::BadInput(text) | ShopError::Conflict(text) | ShopError::Forbidden(text) => {
                text.clone()
            }
            ShopError::Checkout(CallError::Refused(problem)) => {
                format!("Платёжный сервис отказал: {}", problem.code.as_str())
            }
            ShopError::Checkout(CallError::Unavailable(_)) => {
                "Платёжный сервис сейчас не отвечает. Повторите чуть позже — повтор безопасен."
                    .into()
            }
            ShopError::Mismatch(_) | ShopError::Database(_) => {
                "Внутренняя ошибка магазина. Мы уже разбираемся.".into()
            }
        }
    }

    /// For the page's script: the same, as JSON.
    pub fn json(self) -> Response {
        self.log();
        let status = self.status();
        (status, Json(serde_json::json!({ "error": self.message() }))).into_response()
    }

    fn log(&self) {
        if self.status().is_server_error() {
            tracing::error!("{self}");
        }
    }
}

impl IntoResponse for ShopError {
    fn into_response(self) -> Response {
        self.log();
        (self.status(), pages::error_page(&self.message())).into_response()
    }
}
