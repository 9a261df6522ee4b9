//! A shop's webhook endpoint of one mode, as its owner controls it (the dashboard, the API):
//! which event types it takes, a test event, disabling and enabling it. And the checkout's own
//! rule: an endpoint that has failed for days without one success is disabled, the shop told by
//! an event in its list and a mail to its owners; enabled again, it gets what it missed.

use std::time::Duration;

use crate::clock;
use crate::mail::Mailer;
use crate::operations::error::OperationError;
use crate::operations::events::{self, SHOP_EVENT_TYPES};
use crate::operations::staff::Member;
use crate::store::endpoints::EndpointRow;
use crate::store::staff::NewAudit;
use crate::store::{Store, StoreError};

/// Failing this long without a success disables an endpoint (Svix's rule: five days).
pub const DISABLE_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);

/// Who disables or enables an endpoint: a member of its shop, its API key, or the checkout.
pub enum By<'a> {
    Member(&'a Member),
    ApiKey,
    Checkout,
}

impl By<'_> {
    /// Who, as the audit log names it: a member's id (if a member) and a name.
    fn actor(&self) -> (Option<String>, String) {
        match self {
            By::Member(member) => (Some(member.staff_id.clone()), member.email.clone()),
            By::ApiKey => (None, "API-ключ".into()),
            By::Checkout => (None, "касса".into()),
        }
    }
}

/// An audit line of `actor`'s, now.
fn audit<'a>(
    (staff_id, email): &'a (Option<String>, String),
    shop_id: &'a str,
    action: &'a str,
    subject: &'a str,
) -> NewAudit<'a> {
    NewAudit {
        shop_id,
        staff_id: staff_id.as_deref(),
        email,
        action,
        subject,
        at: clock::now_ms(),
    }
}

/// The endpoint of the shop in this mode.
pub async fn get(
    store: &Store,
    shop_id: &str,
    livemode: bool,
) -> Result<EndpointRow, OperationError> {
    store
        .endpoint(shop_id, livemode)
        .await?
        .ok_or_else(|| OperationError::NotFound("no such shop".into()))
}

/// The types the endpoint takes (none: every type); each must be one a shop hears.
pub async fn set_event_types(
    store: &Store,
    shop_id: &str,
    livemode: bool,
    types: &[String],
) -> Result<(), OperationError> {
    if let Some(unknown) = types
        .iter()
        .find(|t| !SHOP_EVENT_TYPES.contains(&t.as_str()))
    {
        return Err(OperationError::InvalidRequest(format!(
            "unknown event type {unknown}: one of {}",
            SHOP_EVENT_TYPES.join(", ")
        )));
    }
    let mut types = types.to_vec();
    types.sort();
    types.dedup();
    store.set_event_types(shop_id, livemode, &types).await?;
    Ok(())
}

/// Sends a test event to the endpoint (through the outbox, signed, its attempts recorded, as any
/// event): its id. Without an enabled endpoint it waits as `no_endpoint`.
pub async fn send_test(
    store: &Store,
    account_id: &str,
    livemode: bool,
) -> Result<String, OperationError> {
    let account_id = account_id.to_owned();
    let event_id = store
        .write(move |tx| {
            Box::pin(async move {
                events::webhook_test(tx, &account_id, livemode, clock::now_ms()).await
            })
        })
        .await?;
    Ok(event_id)
}

/// Disables the endpoint (given `failing_for`, only if it has been failing that long), in one
/// transaction with its alert event and audit line: the endpoint as disabled, or `None` if it
/// was not (already disabled, no URL, or not failing that long).
pub async fn disable(
    store: &Store,
    account_id: &str,
    reason: &str,
    failing_for: Option<Duration>,
    by: By<'_>,
) -> Result<Option<EndpointRow>, StoreError> {
    let (account_id, reason) = (account_id.to_owned(), reason.to_owned());
    let failing_for_ms = failing_for.map_or(0, |d| d.as_millis().max(1) as i64);
    let subject = reason.clone();
    let actor = by.actor();
    store
        .write(move |tx| {
            Box::pin(async move {
                let Some(endpoint) = tx
                    .disable_endpoint(&account_id, &reason, failing_for_ms)
                    .await?
                else {
                    return Ok(None);
                };
                events::endpoint_disabled(tx, &endpoint, clock::now_ms()).await?;
                tx.audit(&audit(
                    &actor,
                    &endpoint.shop_id,
                    "endpoint.disabled",
                    &subject,
                ))
                .await?;
                Ok(Some(endpoint))
            })
        })
        .await
}

/// Enables the endpoint again: what it missed meanwhile goes to it now. `false`: it was not
/// disabled.
pub async fn enable(
    store: &Store,
    shop_id: &str,
    livemode: bool,
    by: By<'_>,
) -> Result<bool, OperationError> {
    let endpoint = get(store, shop_id, livemode).await?;
    let (shop_id, actor) = (shop_id.to_owned(), by.actor());
    let enabled = store
        .write(move |tx| {
            Box::pin(async move {
                let enabled = tx.enable_endpoint(&endpoint.account_id).await?;
                if enabled {
                    let mode = if livemode { "live" } else { "test" };
                    tx.audit(&audit(&actor, &shop_id, "endpoint.enabled", mode))
                        .await?;
                }
                Ok(enabled)
            })
        })
        .await?;
    Ok(enabled)
}

/// Tells the shop's owners by mail that the checkout disabled its endpoint.
pub async fn alert_owners(store: &Store, mailer: &Mailer, endpoint: &EndpointRow) {
    let owners = match store.owners_of_shop(&endpoint.shop_id).await {
        Ok(owners) => owners,
        Err(error) => {
            tracing::warn!(%error, "the owners of a disabled endpoint's shop are unknown");
            return;
        }
    };
    let mode = if endpoint.livemode {
        "настоящие деньги"
    } else {
        "тестовые деньги"
    };
    let text = format!(
        "Здравствуйте!\n\nКасса перестала отправлять события на конечную точку магазина ({mode}):\n\n{}\n\n\
         Она не принимала события с {} (по UTC). События не потеряны: они ждут в кабинете \
         магазина. Когда конечная точка снова заработает, включите её в разделе «Вебхуки»: всё \
         пропущенное уйдёт на неё.\n",
        endpoint.url.as_deref().unwrap_or("—"),
        endpoint
            .failing_since
            .map(clock::rfc3339)
            .unwrap_or_default(),
    );
    for owner in owners {
        if let Err(error) = mailer
            .send(&owner, "Вебхуки магазина отключены", text.clone())
            .await
        {
            tracing::warn!(%error, "the alert of a disabled endpoint was not mailed");
        }
    }
}
