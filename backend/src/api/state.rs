//! What every handler can reach.

use std::sync::Arc;
use std::time::Duration;

use checkout_idempotency::Protocol;

use crate::api::assets::Site;
use crate::api::limits::Limits;
use crate::mail::Mailer;
use crate::operations::authentication::PrincipalCache;
use crate::operations::passkeys::RelyingParty;
use crate::store::Store;

/// What every handler can reach.
#[derive(Clone, Debug)]
pub struct AppState {
    pub store: Store,
    pub protocol: Protocol,
    pub principals: Arc<PrincipalCache>,
    pub demo: bool,
    /// How long a new checkout session can be paid.
    pub session_ttl: Duration,
    /// The built widget: the payment page and its files.
    pub site: Arc<Site>,
    /// Wakes this instance's webhook delivery (an event was written or asked for again).
    pub deliveries: Arc<tokio::sync::Notify>,
    /// Sign-in, sign-up and test-shopper allowances; keys in progress per principal.
    pub limits: Arc<Limits>,
    /// Mail to shoppers (the codes that prove their e-mail); `None`: no SMTP server is set.
    pub mailer: Option<Arc<Mailer>>,
    /// The checkout as the passkeys' relying party (its public origin).
    pub passkeys: Arc<RelyingParty>,
    /// The checkout's public origin (`CHECKOUT_PUBLIC_ORIGIN`): over https, every answer
    /// carries HSTS; the loader is told it.
    pub public_origin: url::Url,
}

impl AppState {
    /// Served over https: every answer carries HSTS.
    pub fn https(&self) -> bool {
        self.public_origin.scheme() == "https"
    }
}
