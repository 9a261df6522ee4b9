//! The outbox: events to the shops, written in the transaction of the change they tell of, and
//! leased to a delivery worker, settled by the attempt that holds the lease, listed and asked
//! for again by their shop.

use super::row::{Arg, Row, RowError, Template};
use super::{Store, StoreError, Tx};

/// The outbox's backlog, for the metrics: events not yet delivered, and the oldest one's time.
pub const OUTBOX_BACKLOG: &str = "\
SELECT COUNT(*) AS depth, MIN(created_at) AS oldest FROM webhook_events WHERE status = 'pending'";

/// Events not yet confirmed by the broker, in the outbox's order (`CHECKOUT_AMQP_URL`).
pub const UNPUBLISHED_EVENTS: &str = "\
SELECT event_id, type, body, broker_returns FROM webhook_events \
 WHERE published_at IS NULL AND (broker_retry_at IS NULL OR broker_retry_at <= $2) \
 ORDER BY seq LIMIT $1";

/// An event the broker routed to no queue: offered again at `$2`.
pub const MARK_RETURNED: &str = "\
    UPDATE webhook_events SET broker_returns = broker_returns + 1, broker_retry_at = $2 \
     WHERE event_id = $1 AND published_at IS NULL";

/// Events the broker routed to no queue so far, for the metrics.
pub const BROKER_UNROUTED: &str = "\
    SELECT COUNT(*) AS depth FROM webhook_events WHERE published_at IS NULL AND broker_returns > 0";

/// Events waiting for the broker, for the metrics.
pub const BROKER_BACKLOG: &str =
    "SELECT COUNT(*) AS depth FROM webhook_events WHERE published_at IS NULL";

/// An event the broker confirmed.
pub const MARK_PUBLISHED: &str =
    "UPDATE webhook_events SET published_at = $2 WHERE event_id = $1 AND published_at IS NULL";

/// What becomes of a new event of type `$t` for shop account `$a`: `no_endpoint` while the shop
/// has no endpoint or it is disabled, `filtered` when the endpoint takes only other types (its
/// list is written `,a,b,`), else `pending`.
macro_rules! endpoint_takes {
    ($a:literal, $t:literal) => {
        concat!(
            "CASE WHEN (SELECT webhook_url FROM shops WHERE account_id = ",
            $a,
            " AND webhook_disabled_at IS NULL) IS NULL THEN 'no_endpoint' \
                  WHEN (SELECT event_types FROM shops WHERE account_id = ",
            $a,
            ") NOT IN ('') AND (SELECT event_types FROM shops WHERE account_id = ",
            $a,
            ") NOT LIKE '%,' || ",
            $t,
            " || ',%' THEN 'filtered' ELSE 'pending' END"
        )
    };
}

/// The same for an event sent whatever the shop's list says: `no_endpoint` or `pending`.
macro_rules! endpoint_open {
    ($a:literal) => {
        concat!(
            "CASE WHEN (SELECT webhook_url FROM shops WHERE account_id = ",
            $a,
            " AND webhook_disabled_at IS NULL) IS NULL THEN 'no_endpoint' ELSE 'pending' END"
        )
    };
}

/// An event into the outbox; its place in the delivery order is the next number, safely under
/// SQLite's one writer.
pub const SQLITE_INSERT_EVENT: &str = concat!(
    "INSERT INTO webhook_events \
           (event_id, seq, shop_account_id, type, subject_id, body, created_at, next_attempt_at, \
            status) \
    VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM webhook_events), $2, $3, $4, $5, $6, $6, \
            ",
    endpoint_takes!("$2", "$3"),
    ")"
);

/// An event into the outbox; its `seq` comes from the sequence.
pub const POSTGRES_INSERT_EVENT: &str = concat!(
    "INSERT INTO webhook_events \
           (event_id, shop_account_id, type, subject_id, body, created_at, next_attempt_at, status) \
    VALUES ($1, $2, $3, $4, $5, $6, $6, ",
    endpoint_takes!("$2", "$3"),
    ")"
);

/// An event about the endpoint itself (a test, the alert that it was disabled): sent whatever
/// types the endpoint takes, and never to the broker (no queue takes it: it is marked published).
pub const SQLITE_INSERT_ENDPOINT_EVENT: &str = concat!(
    "INSERT INTO webhook_events \
           (event_id, seq, shop_account_id, type, subject_id, body, created_at, next_attempt_at, \
            status, published_at) \
    VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM webhook_events), $2, $3, $4, $5, $6, $6, \
            ",
    endpoint_open!("$2"),
    ", $6)"
);

pub const POSTGRES_INSERT_ENDPOINT_EVENT: &str = concat!(
    "INSERT INTO webhook_events \
           (event_id, shop_account_id, type, subject_id, body, created_at, next_attempt_at, status, \
            published_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $6, ",
    endpoint_open!("$2"),
    ", $6)"
);

/// An event is due when it is pending, its time has come, no worker holds a lease on it, its
/// shop has a webhook URL, and no earlier event of its subject is still pending (a refund's
/// event never overtakes its payment's). `{e}` names the row.
macro_rules! due_event {
    ($e:literal) => {
        concat!(
            $e,
            ".status = 'pending' AND ",
            $e,
            ".next_attempt_at <= {now} \
             AND (",
            $e,
            ".locked_until IS NULL OR ",
            $e,
            ".locked_until < {now}) \
             AND EXISTS (SELECT 1 FROM shops s \
                          WHERE s.account_id = ",
            $e,
            ".shop_account_id AND s.webhook_url IS NOT NULL) \
             AND NOT EXISTS (SELECT 1 FROM webhook_events p \
                              WHERE p.subject_id = ",
            $e,
            ".subject_id AND p.seq < ",
            $e,
            ".seq \
                                AND p.status = 'pending')"
        )
    };
}

/// The columns of an event, as [`super::EventRow`] reads them.
macro_rules! event_columns {
    () => {
        "event_id, seq, shop_account_id, type, subject_id, body, created_at, status, attempts, \
         next_attempt_at, last_error, delivered_at, lease_id"
    };
}

/// Leases up to $4 due events to this worker for $1 ms under lease $2 (their attempt counted),
/// taking turns between shops: each shop's first $3 due events are picked (an index walk, never
/// the whole backlog), numbered in turn, and a shop gets at most $3 in flight at once (its
/// events already leased count), so one shop whose endpoint hangs cannot hold every send slot.
/// `$picks` is the per-shop pick, spelled per database. `chosen` locks what was picked and
/// re-checks it as locked (skipping rows another instance holds); the `UPDATE` checks once
/// more, as READ COMMITTED re-reads only its own `WHERE`.
/// Each step is a `MATERIALIZED` CTE, run once (nested `IN`s were run once per row of the
/// backlog when the planner misjudged it; see [`POSTGRES_CLAIM_PLANNER`]).
macro_rules! claim_due_events {
    ($picks:expr) => {
        concat!(
            "WITH ranked AS MATERIALIZED ( \
                  SELECT picks.event_id, picks.seq, \
                         ROW_NUMBER() OVER (PARTITION BY picks.shop_account_id \
                                            ORDER BY picks.next_attempt_at, picks.seq) AS turn, \
                         (SELECT COUNT(*) FROM webhook_events b \
                           WHERE b.shop_account_id = picks.shop_account_id \
                             AND b.status = 'pending' \
                             AND b.locked_until IS NOT NULL \
                             AND b.locked_until >= {now}) AS busy \
                    FROM (",
            $picks,
            ") picks), \
                  chosen AS MATERIALIZED ( \
                  SELECT ev.event_id FROM webhook_events ev \
                   WHERE ev.event_id IN ( \
                         SELECT ranked.event_id FROM ranked \
                          WHERE ranked.turn + ranked.busy <= $3 \
                          ORDER BY ranked.turn, ranked.seq LIMIT $4) \
                     AND ",
            due_event!("ev"),
            "{skip_locked}) \
             UPDATE webhook_events SET locked_until = {now} + $1, lease_id = $2, \
                    attempts = attempts + 1 \
              WHERE event_id IN (SELECT chosen.event_id FROM chosen) \
                AND ",
            due_event!("webhook_events"),
            " RETURNING ",
            event_columns!()
        )
    };
}

/// The planner's choices for the claim's transaction on PostgreSQL: no nested loop where another
/// join will do. Believing the backlog a row or two (statistics taken while nearly every event
/// was delivered, or a standby just promoted, whose counters start afresh so that nothing
/// analyzes the table soon), the planner joined the pending events to themselves by nested
/// loops, a walk of the backlog for every event of it: 2.1 s and a million buffers a claim for
/// 717 events waiting, and the failover campaign's outbox did not drain. Hashed, a claim reads
/// the backlog once, whatever the statistics say. (The LATERAL pick keeps its loop, the only
/// plan it has; JIT off, as the penalty on that loop would otherwise compile the statement.)
pub const POSTGRES_CLAIM_PLANNER: &str =
    "SELECT set_config('enable_nestloop', 'off', true), set_config('jit', 'off', true)";

/// Each shop's first $3 due events, in the order they fell due, by a lateral index walk.
pub static POSTGRES_CLAIM_DUE_EVENTS: Template = Template::new(claim_due_events!(concat!(
    "SELECT pick.event_id, pick.seq, pick.shop_account_id, pick.next_attempt_at \
       FROM shops s \
      CROSS JOIN LATERAL ( \
            SELECT e.event_id, e.seq, e.shop_account_id, e.next_attempt_at \
              FROM webhook_events e \
             WHERE e.shop_account_id = s.account_id AND ",
    due_event!("e"),
    " ORDER BY e.next_attempt_at, e.seq LIMIT $3) pick \
      WHERE s.webhook_url IS NOT NULL"
)));

/// The same pick where SQLite has no `LATERAL`: a correlated `IN` list per shop.
pub static SQLITE_CLAIM_DUE_EVENTS: Template = Template::new(claim_due_events!(concat!(
    "SELECT pick.event_id, pick.seq, pick.shop_account_id, pick.next_attempt_at \
       FROM shops s \
       JOIN webhook_events pick ON pick.event_id IN ( \
            SELECT e.event_id FROM webhook_events e \
             WHERE e.shop_account_id = s.account_id AND ",
    due_event!("e"),
    " ORDER BY e.next_attempt_at, e.seq LIMIT $3) \
      WHERE s.webhook_url IS NOT NULL"
)));

/// Whether any event is due at all: a read, so that an idle worker takes no write transaction.
pub static ANY_DUE_EVENT: Template = Template::new(
    "SELECT CAST(1 AS BIGINT) AS due FROM webhook_events \
      WHERE status = 'pending' AND next_attempt_at <= {now} \
        AND (locked_until IS NULL OR locked_until < {now}) LIMIT 1",
);

/// How an attempt ended is written only by the attempt that holds the lease ($2): a shop's
/// redelivery request made meanwhile takes the lease away, and is not undone by it.
pub static EVENT_DELIVERED: Template = Template::new(
    "UPDATE webhook_events SET status = 'delivered', delivered_at = {now}, locked_until = NULL, \
            lease_id = NULL, last_error = NULL \
      WHERE event_id = $1 AND lease_id = $2 AND status = 'pending'",
);

/// The next attempt $3 ms from now; none while the endpoint is disabled (it was disabled while
/// this attempt was in flight): kept as `no_endpoint` then. (The claim does not look at
/// `webhook_disabled_at`: no event of a disabled endpoint is pending, and a condition more
/// there made PostgreSQL's plan for a backlog ten times slower.)
pub static EVENT_RETRY_AT: Template = Template::new(concat!(
    "UPDATE webhook_events SET next_attempt_at = {now} + $3, locked_until = NULL, lease_id = NULL, \
            last_error = $4, status = ",
    endpoint_open!("webhook_events.shop_account_id"),
    " WHERE event_id = $1 AND lease_id = $2 AND status = 'pending'"
));

/// A delivery attempt, as it was seen (written whether or not its lease still held: it was made).
/// An attempt's record, if its event still exists: asynchronous replication can lose an event
/// whose attempt has ended (it was written just before the primary was lost), and a record the
/// database refuses would fail the sender's every later turn.
pub const INSERT_ATTEMPT: &str = "\
    INSERT INTO delivery_attempts (event_id, shop_account_id, url, attempt, at, status, \
                                   latency_ms, excerpt) \
    SELECT $1, $2, $3, $4, $5, $6, $7, $8 \
     WHERE EXISTS (SELECT 1 FROM webhook_events WHERE event_id = $1) \
    ON CONFLICT DO NOTHING";

pub const EVENT_DEAD: &str = "\
    UPDATE webhook_events SET status = 'dead', locked_until = NULL, lease_id = NULL, \
           last_error = $3 \
     WHERE event_id = $1 AND lease_id = $2 AND status = 'pending'";

/// A shop's events, newest first, before `seq` $2, at most $3.
pub const SHOP_EVENTS: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM webhook_events WHERE shop_account_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3"
);

pub const SHOP_EVENT: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM webhook_events WHERE event_id = $1 AND shop_account_id = $2"
);

/// A shop asks for an event again: pending with a fresh schedule, due now, or when the lease
/// of an attempt in flight ends (the lease stays, so no other worker sends it meanwhile; the
/// lease id goes, so that attempt's outcome no longer counts). Kept as `no_endpoint` while the
/// shop has no webhook URL.
pub static REDELIVER_EVENT: Template = Template::new(concat!(
    "UPDATE webhook_events \
        SET status = ",
    endpoint_open!("$2"),
    ", \
            attempts = 0, lease_id = NULL, last_error = NULL, \
            next_attempt_at = CASE WHEN locked_until > {now} THEN locked_until ELSE {now} END \
      WHERE event_id = $1 AND shop_account_id = $2 \
     RETURNING ",
    event_columns!()
));

/// A shop recovers what it missed since $2 (ms): every event of its account made since then
/// that is `dead` (and, when $3 is 1, `delivered` too) is pending again, due now, on a fresh
/// schedule, with its `webhook-id`; kept as `no_endpoint` while the shop has no webhook URL.
/// Pending events are already on their way, untouched.
pub static RECOVER_EVENTS: Template = Template::new(concat!(
    "UPDATE webhook_events \
            SET status = ",
    endpoint_open!("$1"),
    ", \
                attempts = 0, lease_id = NULL, last_error = NULL, next_attempt_at = {now} \
          WHERE shop_account_id = $1 AND created_at >= $2 \
            AND (status = 'dead' OR ($3 = 1 AND status = 'delivered'))"
));

/// The shop has an endpoint (again), not disabled: every event it has not received goes there,
/// due now, on a fresh schedule (but the alert that it was disabled, which tells of it); an
/// attempt in flight keeps its lease.
pub static EVENTS_TO_NEW_ENDPOINT: Template = Template::new(
    "UPDATE webhook_events \
        SET status = 'pending', attempts = 0, last_error = NULL, \
            next_attempt_at = CASE WHEN locked_until > {now} THEN locked_until ELSE {now} END \
      WHERE shop_account_id = $1 AND status IN ('pending', 'no_endpoint') \
        AND type <> 'webhook_endpoint.disabled' \
        AND (SELECT webhook_disabled_at FROM shops WHERE account_id = $1) IS NULL",
);

/// The shop has no endpoint any more: what waited for delivery is kept, as `no_endpoint`.
pub static EVENTS_WITHOUT_ENDPOINT: Template = Template::new(
    "UPDATE webhook_events SET status = 'no_endpoint', lease_id = NULL \
      WHERE shop_account_id = $1 AND status = 'pending' \
        AND (locked_until IS NULL OR locked_until < {now})",
);

#[derive(Clone, Copy, Debug, Default)]
pub struct OutboxBacklog {
    pub depth: i64,
    pub oldest_created_at_ms: Option<i64>,
}

/// An event in the outbox, as stored.
#[derive(Clone, Debug)]
pub struct EventRow {
    pub event_id: String,
    pub seq: i64,
    pub shop_account_id: String,
    pub event_type: String,
    pub subject_id: String,
    /// The JSON body, exactly as it is sent and signed.
    pub body: String,
    pub created_at: i64,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub delivered_at: Option<i64>,
    /// The lease of the attempt in flight, if any.
    pub lease_id: Option<String>,
}

impl EventRow {
    pub(super) fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(EventRow {
            event_id: row.text("event_id")?,
            seq: row.int("seq")?,
            shop_account_id: row.text("shop_account_id")?,
            event_type: row.text("type")?,
            subject_id: row.text("subject_id")?,
            body: row.text("body")?,
            created_at: row.int("created_at")?,
            status: row.text("status")?,
            attempts: row.int("attempts")?,
            next_attempt_at: row.int("next_attempt_at")?,
            last_error: row.opt_text("last_error")?,
            delivered_at: row.opt_int("delivered_at")?,
            lease_id: row.opt_text("lease_id")?,
        })
    }
}

/// How one delivery attempt of an event ended.
#[derive(Clone, Debug)]
pub enum EventSettled {
    Delivered,
    /// To be tried again this long from now (by the database's clock).
    RetryAfter {
        pause_ms: i64,
        error: String,
    },
    Dead {
        error: String,
    },
}

/// How an attempt under a lease ended, to be recorded by [`Store::settle_and_lease`].
#[derive(Clone, Debug)]
pub struct EndedAttempt {
    pub event_id: String,
    pub lease_id: String,
    pub settled: EventSettled,
    /// What the attempt saw, for the shop's dashboard; `None`: no request was made (no
    /// endpoint, the shop unreadable).
    pub seen: Option<AttemptSeen>,
}

/// One delivery attempt as the shop's dashboard shows it: to which URL and account, which
/// attempt of the event, when it began, the HTTP status (none: no answer came), how long it
/// took, and the answer's first bytes (or why there was none).
#[derive(Clone, Debug)]
pub struct AttemptSeen {
    pub shop_account_id: String,
    pub url: String,
    pub attempt: i64,
    pub at: i64,
    pub status: Option<i64>,
    pub latency_ms: i64,
    pub excerpt: String,
}

/// What a delivery worker's turn leased, and the endpoints it found failing: each shop
/// account's, with the first failure since its last success (Unix ms).
#[derive(Clone, Debug, Default)]
pub struct Turn {
    pub events: Vec<EventRow>,
    pub failing: Vec<(String, i64)>,
}

/// Due events a worker asks to lease: at most `limit`, for `lease_ms` (by the database's
/// clock), under `lease_id`, with at most `per_shop` of any one shop in flight.
#[derive(Clone, Debug)]
pub struct LeaseRequest {
    pub lease_ms: i64,
    pub lease_id: String,
    pub per_shop: i64,
    pub limit: i64,
}

/// An event to publish to the broker: its id (the message's `message_id`), type (the routing
/// key) and body.
#[derive(Clone, Debug)]
pub struct UnpublishedEvent {
    pub event_id: String,
    pub event_type: String,
    pub body: String,
    /// How many times the broker routed it to no queue.
    pub broker_returns: i64,
}

/// An event to write in the transaction of the change it tells of.
pub struct NewEvent<'a> {
    /// About the endpoint itself (see [`SQLITE_INSERT_ENDPOINT_EVENT`]).
    pub about_endpoint: bool,
    pub event_id: &'a str,
    pub shop_account_id: &'a str,
    pub event_type: &'a str,
    pub subject_id: &'a str,
    pub body: &'a str,
    pub created_at: i64,
}

impl<'a> NewEvent<'a> {
    /// `$1`…`$6` of [`POSTGRES_INSERT_EVENT`] and its kin.
    pub(super) fn args(&self) -> [Arg<'a>; 6] {
        [
            Arg::Text(self.event_id),
            Arg::Text(self.shop_account_id),
            Arg::Text(self.event_type),
            Arg::Text(self.subject_id),
            Arg::Text(self.body),
            Arg::Int(self.created_at),
        ]
    }
}

impl Store {
    /// Up to `limit` events the broker has not confirmed into a queue, oldest first, but not
    /// one returned whose next offer is after `now_ms`.
    pub async fn unpublished_events(
        &self,
        limit: i64,
        now_ms: i64,
    ) -> Result<Vec<UnpublishedEvent>, StoreError> {
        self.read(
            UNPUBLISHED_EVENTS,
            &[Arg::Int(limit), Arg::Int(now_ms)],
            |row| {
                Ok(UnpublishedEvent {
                    event_id: row.text("event_id")?,
                    event_type: row.text("type")?,
                    body: row.text("body")?,
                    broker_returns: row.int("broker_returns")?,
                })
            },
        )
        .await
    }

    /// Events the broker routed to no queue and that wait to be offered again.
    pub async fn broker_unrouted(&self) -> Result<i64, StoreError> {
        let rows = self
            .read(BROKER_UNROUTED, &[], |row| row.int("depth"))
            .await?;
        Ok(rows.into_iter().next().unwrap_or(0))
    }

    /// Events the broker returned (no queue took them): each offered again at its time.
    pub async fn mark_returned(&self, returned: Vec<(String, i64)>) -> Result<(), StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                for (event_id, retry_at) in &returned {
                    tx.execute(MARK_RETURNED, &[Arg::Text(event_id), Arg::Int(*retry_at)])
                        .await?;
                }
                Ok(())
            })
        })
        .await
    }

    /// Events waiting for the broker.
    pub async fn broker_backlog(&self) -> Result<i64, StoreError> {
        let rows = self
            .read(BROKER_BACKLOG, &[], |row| row.int("depth"))
            .await?;
        Ok(rows.into_iter().next().unwrap_or(0))
    }

    /// Marks the events the broker confirmed, in one short transaction.
    pub async fn mark_published(
        &self,
        event_ids: Vec<String>,
        at_ms: i64,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                for event_id in &event_ids {
                    tx.execute(MARK_PUBLISHED, &[Arg::Text(event_id), Arg::Int(at_ms)])
                        .await?;
                }
                Ok(())
            })
        })
        .await
    }

    pub async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        let rows = self
            .read(OUTBOX_BACKLOG, &[], |row| {
                Ok(OutboxBacklog {
                    depth: row.int("depth")?,
                    oldest_created_at_ms: row.opt_int("oldest")?,
                })
            })
            .await?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }

    /// One turn of a delivery worker, in one short write transaction: records how the attempts
    /// in `ended` went (each only if its lease still holds: a redelivery request meanwhile took
    /// it), then leases what `lease` asks for: those events, oldest first. Nothing ended and
    /// nothing due (a read finds out) takes no write transaction at all.
    pub async fn settle_and_lease(
        &self,
        ended: Vec<EndedAttempt>,
        lease: Option<LeaseRequest>,
    ) -> Result<Turn, StoreError> {
        let lease = match lease {
            Some(_) if ended.is_empty() && !self.any_due_event().await? => None,
            lease => lease,
        };
        if ended.is_empty() && lease.is_none() {
            return Ok(Turn::default());
        }
        self.write(move |tx| {
            Box::pin(async move {
                for attempt in &ended {
                    tx.settle_event(attempt).await?;
                }
                // Each endpoint tried in this turn: answered (any 2xx) or failing since when.
                let mut tried: Vec<(&str, bool)> = Vec::new();
                for seen in ended.iter().filter_map(|a| a.seen.as_ref()) {
                    let answered = (200..300).contains(&seen.status.unwrap_or(0));
                    match tried.iter_mut().find(|(a, _)| *a == seen.shop_account_id) {
                        Some((_, any)) => *any |= answered,
                        None => tried.push((&seen.shop_account_id, answered)),
                    }
                }
                let mut failing = Vec::new();
                for (account_id, answered) in tried {
                    if let Some(since) = tx.note_endpoint(account_id, answered).await? {
                        failing.push((account_id.to_owned(), since));
                    }
                }
                let Some(lease) = lease else {
                    return Ok(Turn {
                        events: Vec::new(),
                        failing,
                    });
                };
                if let Tx::Postgres(_) = tx {
                    tx.execute(POSTGRES_CLAIM_PLANNER, &[]).await?;
                }
                let statement = tx.spelled(
                    SQLITE_CLAIM_DUE_EVENTS.sqlite(),
                    POSTGRES_CLAIM_DUE_EVENTS.postgres(),
                );
                let mut events = tx
                    .fetch_all(
                        statement,
                        &[
                            Arg::Int(lease.lease_ms),
                            Arg::Text(&lease.lease_id),
                            Arg::Int(lease.per_shop),
                            Arg::Int(lease.limit),
                        ],
                        EventRow::read,
                    )
                    .await?;
                events.sort_by_key(|e| e.seq);
                Ok(Turn { events, failing })
            })
        })
        .await
    }

    async fn any_due_event(&self) -> Result<bool, StoreError> {
        let statement = match self {
            Store::Sqlite(_) => ANY_DUE_EVENT.sqlite(),
            Store::Postgres(_) => ANY_DUE_EVENT.postgres(),
        };
        Ok(!self
            .read(statement, &[], |row| row.int("due"))
            .await?
            .is_empty())
    }

    /// A shop's events, newest first, before `before_seq`.
    pub async fn shop_events(
        &self,
        shop_account_id: &str,
        before_seq: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        self.read(
            SHOP_EVENTS,
            &[
                Arg::Text(shop_account_id),
                Arg::Int(before_seq),
                Arg::Int(limit),
            ],
            EventRow::read,
        )
        .await
    }

    pub async fn shop_event(
        &self,
        shop_account_id: &str,
        event_id: &str,
    ) -> Result<Option<EventRow>, StoreError> {
        let rows = self
            .read(
                SHOP_EVENT,
                &[Arg::Text(event_id), Arg::Text(shop_account_id)],
                EventRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }
}

impl Tx {
    /// [`RECOVER_EVENTS`]: how many events are queued again.
    pub async fn recover_events(
        &mut self,
        shop_account_id: &str,
        since_ms: i64,
        include_delivered: bool,
    ) -> Result<u64, StoreError> {
        let statement = self.template(&RECOVER_EVENTS);
        self.execute(
            statement,
            &[
                Arg::Text(shop_account_id),
                Arg::Int(since_ms),
                Arg::Int(i64::from(include_delivered)),
            ],
        )
        .await
    }

    /// Puts one of the shop's events back in the queue with a fresh schedule: due now, or as
    /// soon as an attempt in flight has ended.
    pub async fn redeliver_event(
        &mut self,
        shop_account_id: &str,
        event_id: &str,
    ) -> Result<Option<EventRow>, StoreError> {
        let statement = self.template(&REDELIVER_EVENT);
        self.fetch_optional(
            statement,
            &[Arg::Text(event_id), Arg::Text(shop_account_id)],
            EventRow::read,
        )
        .await
    }

    /// Records how one attempt ended, if its lease still holds.
    async fn settle_event(&mut self, attempt: &EndedAttempt) -> Result<(), StoreError> {
        if let Some(seen) = &attempt.seen {
            self.execute(
                INSERT_ATTEMPT,
                &[
                    Arg::Text(&attempt.event_id),
                    Arg::Text(&seen.shop_account_id),
                    Arg::Text(&seen.url),
                    Arg::Int(seen.attempt),
                    Arg::Int(seen.at),
                    Arg::Int(seen.status.unwrap_or(0)),
                    Arg::Int(seen.latency_ms),
                    Arg::Text(&seen.excerpt),
                ],
            )
            .await?;
        }
        let (event, lease) = (Arg::Text(&attempt.event_id), Arg::Text(&attempt.lease_id));
        match &attempt.settled {
            EventSettled::Delivered => {
                let statement = self.template(&EVENT_DELIVERED);
                self.execute(statement, &[event, lease]).await?
            }
            EventSettled::RetryAfter { pause_ms, error } => {
                let statement = self.template(&EVENT_RETRY_AT);
                self.execute(
                    statement,
                    &[event, lease, Arg::Int(*pause_ms), Arg::Text(error)],
                )
                .await?
            }
            EventSettled::Dead { error } => {
                self.execute(EVENT_DEAD, &[event, lease, Arg::Text(error)])
                    .await?
            }
        };
        Ok(())
    }

    /// Writes an event into the outbox, in this transaction: it commits with the change. On
    /// PostgreSQL it travels with the key's stored answer, or alone before `COMMIT`.
    pub async fn insert_event(&mut self, event: &NewEvent<'_>) -> Result<(), StoreError> {
        let args = event.args();
        let (sqlite, postgres) = if event.about_endpoint {
            (SQLITE_INSERT_ENDPOINT_EVENT, POSTGRES_INSERT_ENDPOINT_EVENT)
        } else {
            (SQLITE_INSERT_EVENT, POSTGRES_INSERT_EVENT)
        };
        match self {
            Tx::Postgres(tx) => {
                tx.defer(postgres, &args);
                Ok(())
            }
            Tx::Sqlite(_) => self.execute(sqlite, &args).await.map(|_| ()),
        }
    }
}
