//! A shop's webhook endpoint of one mode, as its owner controls it (the dashboard, the API):
//! its URL and the event types it takes, a test event, disabling and enabling it, events sent
//! again; each change in one transaction with its audit line. And the checkout's own
//! rule: an endpoint that has failed for days without one success is disabled, the shop told by
//! an event in its list and a mail to its owners; enabled again, it gets what it missed.

use std::time::Duration;

use crate::clock;
use crate::mail::Mailer;
use crate::operations::error::OperationError;
use crate::operations::events::{self, SHOP_EVENT_TYPES};
use crate::operations::shops::{ShopError, new_signing_secret, validate_webhook_url};
use crate::operations::staff::Member;
use crate::store::endpoints::EndpointRow;
use crate::store::events::EventRow;
use crate::store::staff::NewAudit;
use crate::store::{ShopRow, Store, StoreError, Tx, TxFuture};

/// Failing this long without a success disables an endpoint (Svix's rule: five days).
pub const DISABLE_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);

/// Who changes an endpoint or its deliveries, as its audit line names them: a member of the
/// shop, its API key, the operator (the command line), or the checkout itself.
pub enum By<'a> {
    Member(&'a Member),
    ApiKey,
    Operator,
    Checkout,
}

impl By<'_> {
    /// Who, as the audit log names it: a member's id (if a member) and a name.
    fn actor(&self) -> (Option<String>, String) {
        match self {
            By::Member(member) => (Some(member.staff_id.clone()), member.email.clone()),
            By::ApiKey => (None, "API-ключ".into()),
            By::Operator => (None, "оператор".into()),
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

/// A change to a shop's endpoint of one mode: each field given is set, the others stay.
#[derive(Default)]
pub struct Change<'a> {
    /// The URL events go to; `Some(None)`: none (events wait as `no_endpoint`).
    pub url: Option<Option<&'a str>>,
    /// The types it takes; empty: every type.
    pub event_types: Option<&'a [String]>,
    pub enabled: Option<bool>,
}

/// Makes `change` whole or not at all: every field is checked before anything is written, then
/// one transaction sets each part with its audit line (and, when it disables the endpoint, the
/// alert event). Setting what is already set writes nothing but the audit line of the setting.
pub async fn change(
    store: &Store,
    shop: &ShopRow,
    change: Change<'_>,
    by: By<'_>,
) -> Result<(), ShopError> {
    if let Some(Some(url)) = change.url {
        validate_webhook_url(url)?;
    }
    let types = change.event_types.map(known_types).transpose()?;
    let (shop_id, account_id, livemode) =
        (shop.shop_id.clone(), shop.account_id.clone(), shop.livemode);
    let url = change.url.map(|u| u.map(str::to_owned));
    let enabled = change.enabled;
    let actor = by.actor();
    store
        .write(move |tx| {
            Box::pin(async move {
                if let Some(url) = &url
                    && !tx
                        .set_webhook_url(&shop_id, livemode, url.as_deref())
                        .await?
                {
                    return Ok(Err(ShopError::UnknownShop(shop_id)));
                }
                if let Some(types) = &types {
                    tx.set_event_types(&shop_id, livemode, types).await?;
                }
                if url.is_some() || types.is_some() {
                    let subject = setting(livemode, url.as_ref(), types.as_deref());
                    tx.audit(&audit(&actor, &shop_id, "endpoint.set", &subject))
                        .await?;
                }
                match enabled {
                    Some(false) => {
                        disable_in(tx, &account_id, "disabled by the shop", 0, &actor).await?;
                    }
                    Some(true) if tx.enable_endpoint(&account_id).await? => {
                        tx.audit(&audit(&actor, &shop_id, "endpoint.enabled", mode(livemode)))
                            .await?;
                    }
                    _ => {}
                }
                Ok(Ok(()))
            })
        })
        .await?
}

/// The types asked for, known, sorted, once each; every type chosen is written as "every
/// type", so that new kinds of events reach the endpoint too.
fn known_types(types: &[String]) -> Result<Vec<String>, ShopError> {
    if let Some(unknown) = types
        .iter()
        .find(|t| !SHOP_EVENT_TYPES.contains(&t.as_str()))
    {
        return Err(ShopError::EventType(unknown.clone()));
    }
    let mut types = types.to_vec();
    types.sort();
    types.dedup();
    if types.len() == SHOP_EVENT_TYPES.len() {
        types.clear();
    }
    Ok(types)
}

/// What an `endpoint.set` line says was set: `test: https://… [refund.succeeded]`.
fn setting(livemode: bool, url: Option<&Option<String>>, types: Option<&[String]>) -> String {
    let mut subject = format!("{}:", mode(livemode));
    if let Some(url) = url {
        subject.push(' ');
        subject.push_str(url.as_deref().unwrap_or("—"));
    }
    if let Some(types) = types {
        let types = if types.is_empty() {
            "*".to_owned()
        } else {
            types.join(",")
        };
        subject.push_str(&format!(" [{types}]"));
    }
    subject
}

fn mode(livemode: bool) -> &'static str {
    if livemode { "live" } else { "test" }
}

/// A new signing secret for the shop's events in one mode (printed once). The old one stops
/// signing at once or, given an `overlap`, signs beside the new one until it has passed (its
/// end is returned then, in Unix ms): the shop's endpoint verifies either meanwhile.
pub async fn roll_signing_secret(
    store: &Store,
    shop_id: &str,
    livemode: bool,
    overlap: Duration,
    by: By<'_>,
) -> Result<(String, Option<i64>), ShopError> {
    let secret = new_signing_secret();
    let old_until =
        (!overlap.is_zero()).then(|| clock::now_ms().saturating_add(overlap.as_millis() as i64));
    let subject = format!("{}: overlap {} s", mode(livemode), overlap.as_secs());
    let (owner, written) = (shop_id.to_owned(), secret.clone());
    let rolled = audited(store, shop_id, by, "signing_secret.rolled", move |tx| {
        Box::pin(async move {
            let rolled = tx
                .roll_signing_secret(&owner, livemode, &written, old_until)
                .await?;
            Ok((rolled, rolled.then_some(subject)))
        })
    })
    .await?;
    if rolled {
        Ok((secret, old_until))
    } else {
        Err(ShopError::UnknownShop("no such shop".into()))
    }
}

/// Sends a test event to the endpoint (through the outbox, signed, its attempts recorded, as any
/// event), with its audit line: its id. Without an enabled endpoint it waits as `no_endpoint`.
pub async fn send_test(store: &Store, shop: &ShopRow, by: By<'_>) -> Result<String, StoreError> {
    let (account_id, livemode) = (shop.account_id.clone(), shop.livemode);
    audited(store, &shop.shop_id, by, "endpoint.tested", move |tx| {
        Box::pin(async move {
            let event_id = events::webhook_test(tx, &account_id, livemode, clock::now_ms()).await?;
            Ok((event_id.clone(), Some(event_id)))
        })
    })
    .await
}

/// Sends one of the shop's events again, now and on a fresh schedule, with its audit line: the
/// event as queued, or `None` if the shop has no such event.
pub async fn redeliver(
    store: &Store,
    shop: &ShopRow,
    event_id: &str,
    by: By<'_>,
) -> Result<Option<EventRow>, StoreError> {
    let (account_id, event_id) = (shop.account_id.clone(), event_id.to_owned());
    audited(store, &shop.shop_id, by, "event.redelivered", move |tx| {
        Box::pin(async move {
            let event = tx.redeliver_event(&account_id, &event_id).await?;
            let subject = event.is_some().then_some(event_id);
            Ok((event, subject))
        })
    })
    .await
}

/// Sends again every event of the shop made since `since_ms` that it never received (and with
/// `include_delivered`, those it did), with the audit line: how many.
pub async fn recover(
    store: &Store,
    shop: &ShopRow,
    since_ms: i64,
    include_delivered: bool,
    by: By<'_>,
) -> Result<u64, StoreError> {
    let account_id = shop.account_id.clone();
    let subject = format!(
        "since {}{}",
        clock::rfc3339(since_ms),
        if include_delivered {
            ", delivered too"
        } else {
            ""
        }
    );
    audited(store, &shop.shop_id, by, "events.recovered", move |tx| {
        Box::pin(async move {
            let recovered = tx
                .recover_events(&account_id, since_ms, include_delivered)
                .await?;
            Ok((recovered, Some(subject)))
        })
    })
    .await
}

/// Runs `work` in one transaction with its audit line, so that nothing is changed that the log
/// does not tell of: `work` gives its result and the line's subject (`None`: it changed
/// nothing, and no line is written).
fn audited<'s, T, F>(
    store: &'s Store,
    shop_id: &str,
    by: By<'_>,
    action: &'static str,
    work: F,
) -> impl Future<Output = Result<T, StoreError>> + Send + 's
where
    T: Send + 'static,
    F: for<'t> FnOnce(&'t mut Tx) -> TxFuture<'t, (T, Option<String>)> + Send + 'static,
{
    let (shop_id, actor) = (shop_id.to_owned(), by.actor());
    store.write(move |tx| {
        Box::pin(async move {
            let (done, subject) = work(tx).await?;
            if let Some(subject) = subject {
                tx.audit(&audit(&actor, &shop_id, action, &subject)).await?;
            }
            Ok(done)
        })
    })
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
    let actor = by.actor();
    store
        .write(move |tx| {
            Box::pin(
                async move { disable_in(tx, &account_id, &reason, failing_for_ms, &actor).await },
            )
        })
        .await
}

/// [`disable`] inside a transaction.
async fn disable_in(
    tx: &mut Tx,
    account_id: &str,
    reason: &str,
    failing_for_ms: i64,
    actor: &(Option<String>, String),
) -> Result<Option<EndpointRow>, StoreError> {
    let Some(endpoint) = tx
        .disable_endpoint(account_id, reason, failing_for_ms)
        .await?
    else {
        return Ok(None);
    };
    events::endpoint_disabled(tx, &endpoint, clock::now_ms()).await?;
    tx.audit(&audit(
        actor,
        &endpoint.shop_id,
        "endpoint.disabled",
        reason,
    ))
    .await?;
    Ok(Some(endpoint))
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
