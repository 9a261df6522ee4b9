//! A shop's webhook endpoint of one mode, beyond its URL and secret (`accounts`): the event
//! types it takes, whether it is disabled and why, and since when it has been failing. Kept on
//! the shop's row of that mode; the outbox's statements (`events`) read them when an event is
//! written, asked for again, or leased.

use super::row::{Arg, Row, RowError, Template};
use super::{Store, StoreError, Tx};

macro_rules! endpoint_columns {
    () => {
        "shop_id, account_id, livemode, webhook_url, event_types, webhook_disabled_at, \
         webhook_disabled_reason, webhook_failing_since, old_signing_secret_until"
    };
}

pub const ENDPOINT: &str = concat!(
    "SELECT ",
    endpoint_columns!(),
    " FROM shops WHERE shop_id = $1 AND livemode = $2"
);

/// The event types the endpoint takes, written `,a,b,` ('' for every type).
pub const SET_EVENT_TYPES: &str =
    "UPDATE shops SET event_types = $3 WHERE shop_id = $1 AND livemode = $2";

/// An attempt the endpoint answered `2xx`: it is failing no more.
pub const ENDPOINT_ANSWERED: &str = "\
    UPDATE shops SET webhook_failing_since = NULL \
     WHERE account_id = $1 AND webhook_failing_since IS NOT NULL";

/// An attempt that failed: failing since the first failure after the last success.
pub static ENDPOINT_FAILED: Template = Template::new(
    "UPDATE shops SET webhook_failing_since = COALESCE(webhook_failing_since, {now}) \
      WHERE account_id = $1 AND webhook_disabled_at IS NULL \
     RETURNING webhook_failing_since",
);

/// Disables an enabled endpoint ($2: why) that has one; given $3 > 0, only if it has been failing
/// for at least $3 ms (the checkout's own decision, made again by whichever instance sees it).
pub static DISABLE_ENDPOINT: Template = Template::new(concat!(
    "UPDATE shops SET webhook_disabled_at = {now}, webhook_disabled_reason = $2 \
      WHERE account_id = $1 AND webhook_disabled_at IS NULL AND webhook_url IS NOT NULL \
        AND ($3 = 0 OR webhook_failing_since <= {now} - $3) \
     RETURNING ",
    endpoint_columns!()
));

pub const ENABLE_ENDPOINT: &str = "\
    UPDATE shops SET webhook_disabled_at = NULL, webhook_disabled_reason = NULL, \
                     webhook_failing_since = NULL \
     WHERE account_id = $1 AND webhook_disabled_at IS NOT NULL";

/// A shop's endpoint in one mode.
#[derive(Clone, Debug)]
pub struct EndpointRow {
    pub shop_id: String,
    pub account_id: String,
    pub livemode: bool,
    pub url: Option<String>,
    /// The types it takes; empty: every type.
    pub event_types: Vec<String>,
    /// Since when, and why, it has been disabled.
    pub disabled: Option<(i64, String)>,
    /// The first failure after its last success, if it is failing.
    pub failing_since: Option<i64>,
    /// When the rolled signing secret stops signing beside the new one.
    pub old_secret_until: Option<i64>,
}

impl EndpointRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(EndpointRow {
            shop_id: row.text("shop_id")?,
            account_id: row.text("account_id")?,
            livemode: row.int("livemode")? == 1,
            url: row.opt_text("webhook_url")?,
            event_types: row
                .text("event_types")?
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            disabled: match (
                row.opt_int("webhook_disabled_at")?,
                row.opt_text("webhook_disabled_reason")?,
            ) {
                (Some(at), reason) => Some((at, reason.unwrap_or_default())),
                _ => None,
            },
            failing_since: row.opt_int("webhook_failing_since")?,
            old_secret_until: row.opt_int("old_signing_secret_until")?,
        })
    }
}

/// The types as the column keeps them.
fn written(types: &[String]) -> String {
    if types.is_empty() {
        String::new()
    } else {
        format!(",{},", types.join(","))
    }
}

impl Store {
    pub async fn endpoint(
        &self,
        shop_id: &str,
        livemode: bool,
    ) -> Result<Option<EndpointRow>, StoreError> {
        let rows = self
            .read(
                ENDPOINT,
                &[Arg::Text(shop_id), Arg::Int(livemode.into())],
                EndpointRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }
}

impl Tx {
    /// Sets the types the endpoint takes (none: every type); `false`: no such shop.
    pub async fn set_event_types(
        &mut self,
        shop_id: &str,
        livemode: bool,
        types: &[String],
    ) -> Result<bool, StoreError> {
        let set = self
            .execute(
                SET_EVENT_TYPES,
                &[
                    Arg::Text(shop_id),
                    Arg::Int(livemode.into()),
                    Arg::Text(&written(types)),
                ],
            )
            .await?;
        Ok(set == 1)
    }

    /// Notes how an attempt to the shop account's endpoint went; after a failure, since when it
    /// has been failing (`None`: it answered, or it is disabled already).
    pub async fn note_endpoint(
        &mut self,
        account_id: &str,
        answered: bool,
    ) -> Result<Option<i64>, StoreError> {
        if answered {
            self.execute(ENDPOINT_ANSWERED, &[Arg::Text(account_id)])
                .await?;
            return Ok(None);
        }
        let statement = self.template(&ENDPOINT_FAILED);
        self.fetch_optional(statement, &[Arg::Text(account_id)], |row| {
            row.int("webhook_failing_since")
        })
        .await
    }

    /// Disables the endpoint (if enabled, and failing for at least `failing_for_ms` when that
    /// is above 0), and keeps what waited for it as `no_endpoint`: the endpoint as it is now,
    /// or `None` if nothing was disabled.
    pub async fn disable_endpoint(
        &mut self,
        account_id: &str,
        reason: &str,
        failing_for_ms: i64,
    ) -> Result<Option<EndpointRow>, StoreError> {
        let statement = self.template(&DISABLE_ENDPOINT);
        let disabled = self
            .fetch_optional(
                statement,
                &[
                    Arg::Text(account_id),
                    Arg::Text(reason),
                    Arg::Int(failing_for_ms),
                ],
                EndpointRow::read,
            )
            .await?;
        if disabled.is_some() {
            let statement = self.template(&super::events::EVENTS_WITHOUT_ENDPOINT);
            self.execute(statement, &[Arg::Text(account_id)]).await?;
        }
        Ok(disabled)
    }

    /// Enables a disabled endpoint: what it missed meanwhile goes to it now. `false`: it was
    /// not disabled.
    pub async fn enable_endpoint(&mut self, account_id: &str) -> Result<bool, StoreError> {
        if self
            .execute(ENABLE_ENDPOINT, &[Arg::Text(account_id)])
            .await?
            == 0
        {
            return Ok(false);
        }
        let statement = self.template(&super::events::EVENTS_TO_NEW_ENDPOINT);
        self.execute(statement, &[Arg::Text(account_id)]).await?;
        Ok(true)
    }
}
