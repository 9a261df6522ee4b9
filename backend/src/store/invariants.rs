//! The books' invariants: what must hold between the tables at every commit, each written once
//! as a statement that returns the ids breaking it. `checkout-server verify`, the server's
//! periodic check (`CHECKOUT_VERIFY_SECS`) and the test kit all run this list, in one consistent
//! read-only snapshot (PostgreSQL `REPEATABLE READ READ ONLY`; a SQLite read transaction over
//! the WAL), so a check never blocks a writer and never sees half of a transfer.
//!
//! Every statement is the same text on both databases: `$n` arguments are not needed, and the
//! ids come back as one text column `id`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::row::Row;
use super::{Store, StoreError, postgres, sqlite};

/// One invariant of the books.
#[derive(Debug)]
pub struct Invariant {
    /// A short name, for a metric's label and a report's line.
    pub name: &'static str,
    /// What holds, in words.
    pub says: &'static str,
    /// The table whose rows the invariant is about (counted as "rows checked").
    pub over: &'static str,
    /// The ids breaking it (one text column `id`); no row when it holds.
    pub violations: &'static str,
    /// The schema's own constraint that already forbids what this finds (so it fails only if
    /// that constraint was dropped), if any.
    pub constraint: Option<&'static str>,
}

/// One invariant as one snapshot found it.
#[derive(Debug)]
pub struct Checked {
    pub invariant: &'static Invariant,
    pub rows: i64,
    pub violations: Vec<String>,
    /// How long its statement took (the operator's clue to a slow check).
    pub took: Duration,
}

/// Every invariant checked in one snapshot.
#[derive(Debug)]
pub struct Verified {
    pub checked: Vec<Checked>,
    pub took: Duration,
}

impl Verified {
    pub fn holds(&self) -> bool {
        self.checked.iter().all(|c| c.violations.is_empty())
    }

    /// The names of the invariants broken.
    pub fn broken(&self) -> Vec<&'static str> {
        self.checked
            .iter()
            .filter(|c| !c.violations.is_empty())
            .map(|c| c.invariant.name)
            .collect()
    }
}

/// Which invariants a check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everything that holds of a database in service. A key expires (after a day), and the same
    /// key string may then move money again under a claim of its own.
    Service,
    /// Also: no key string ever moved money twice (a test that never lets a key expire).
    KeysNeverReused,
}

impl Scope {
    pub fn invariants(self) -> impl Iterator<Item = &'static Invariant> {
        let extra = match self {
            Scope::Service => None,
            Scope::KeysNeverReused => Some(&ONE_MOVEMENT_PER_KEY_STRING),
        };
        INVARIANTS.iter().chain(extra)
    }
}

/// The ids of a transfer's ledger rows, whichever kind it is.
macro_rules! transfer_id {
    () => {
        "COALESCE(payment_id, refund_id, deposit_id, 'opening')"
    };
}

pub const INVARIANTS: &[Invariant] = &[
    Invariant {
        name: "balances_equal_ledger",
        says: "balance + unfolded credits == sum(ledger) per account, never negative but the funding account's",
        over: "accounts",
        violations: "\
            SELECT a.account_id AS id FROM accounts a \
              LEFT JOIN (SELECT account_id, SUM(amount) AS total FROM unfolded_credits GROUP BY account_id) u \
                     ON u.account_id = a.account_id \
              LEFT JOIN (SELECT account_id, SUM(amount) AS total FROM ledger GROUP BY account_id) l \
                     ON l.account_id = a.account_id \
             WHERE (a.balance < 0 AND a.kind <> 'funding') \
                OR a.balance + COALESCE(u.total, 0) <> COALESCE(l.total, 0)",
        constraint: None,
    },
    Invariant {
        name: "test_money_conserved",
        says: "the test balances sum to the test money issued (opening entries, test accounts only)",
        over: "accounts",
        violations: "\
            SELECT CAST('test' AS TEXT) AS id WHERE NOT ( \
              (SELECT COALESCE(SUM(balance), 0) FROM accounts WHERE livemode = 0) \
              + (SELECT COALESCE(SUM(u.amount), 0) FROM unfolded_credits u JOIN accounts a ON a.account_id = u.account_id WHERE a.livemode = 0) \
              = (SELECT COALESCE(SUM(l.amount), 0) FROM ledger l JOIN accounts a ON a.account_id = l.account_id \
                  WHERE l.kind = 'opening' AND a.livemode = 0) \
              AND NOT EXISTS (SELECT 1 FROM ledger l JOIN accounts a ON a.account_id = l.account_id \
                  WHERE l.kind = 'opening' AND a.livemode = 1))",
        constraint: None,
    },
    Invariant {
        name: "live_money_conserved",
        says: "the live balances sum to the live money deposited, which the funding account gave",
        over: "deposits",
        violations: "\
            SELECT CAST('live' AS TEXT) AS id WHERE NOT ( \
              (SELECT COALESCE(SUM(balance), 0) FROM accounts WHERE livemode = 1 AND kind <> 'funding') \
              + (SELECT COALESCE(SUM(u.amount), 0) FROM unfolded_credits u JOIN accounts a ON a.account_id = u.account_id WHERE a.livemode = 1) \
              = (SELECT COALESCE(SUM(amount), 0) FROM deposits) \
              AND (SELECT COALESCE(SUM(amount), 0) FROM deposits) \
                = -(SELECT COALESCE(SUM(balance), 0) FROM accounts WHERE kind = 'funding'))",
        constraint: None,
    },
    Invariant {
        name: "transfers_of_one_mode",
        says: "every transfer's accounts are of one mode (test or live)",
        over: "ledger",
        violations: concat!(
            "SELECT ",
            transfer_id!(),
            " AS id FROM (SELECT l.kind, l.payment_id, l.refund_id, l.deposit_id FROM ledger l \
              JOIN accounts a ON a.account_id = l.account_id WHERE l.kind <> 'opening' \
              GROUP BY l.kind, l.payment_id, l.refund_id, l.deposit_id \
              HAVING MIN(a.livemode) <> MAX(a.livemode)) t"
        ),
        constraint: None,
    },
    Invariant {
        name: "payments_of_their_sessions_mode",
        says: "a payment is of its session's mode, and the session of its shop account's",
        over: "payments",
        violations: "\
            SELECT p.payment_id AS id FROM payments p \
              JOIN checkout_sessions s ON s.session_id = p.checkout_session_id \
              JOIN accounts a ON a.account_id = s.shop_account_id \
             WHERE p.livemode <> s.livemode OR s.livemode <> a.livemode",
        constraint: None,
    },
    Invariant {
        name: "deposits_moved_once",
        says: "every deposit credits a live shopper and debits the funding account, once each, and has its event",
        over: "deposits",
        violations: "\
            SELECT d.deposit_id AS id FROM deposits d WHERE \
              (SELECT COUNT(*) FROM ledger l JOIN accounts a ON a.account_id = l.account_id \
                WHERE l.deposit_id = d.deposit_id AND l.account_id = d.account_id AND l.amount = d.amount \
                  AND a.livemode = 1 AND a.kind = 'shopper') <> 1 \
              OR (SELECT COUNT(*) FROM ledger l JOIN accounts a ON a.account_id = l.account_id \
                WHERE l.deposit_id = d.deposit_id AND a.kind = 'funding' AND l.amount = -d.amount) <> 1 \
              OR (SELECT COUNT(*) FROM webhook_events e WHERE e.type = 'deposit.succeeded' \
                   AND e.subject_id = d.deposit_id) <> 1",
        constraint: None,
    },
    Invariant {
        name: "transfers_sum_to_zero",
        says: "every transfer is two ledger rows summing to zero",
        over: "ledger",
        violations: concat!(
            "SELECT ",
            transfer_id!(),
            " AS id FROM (SELECT kind, payment_id, refund_id, deposit_id FROM ledger WHERE kind <> 'opening' \
              GROUP BY kind, payment_id, refund_id, deposit_id HAVING COUNT(*) <> 2 OR SUM(amount) <> 0) t"
        ),
        constraint: None,
    },
    Invariant {
        name: "transfers_carry_their_claim",
        says: "every transfer has exactly one row carrying its key's claim",
        over: "ledger",
        violations: concat!(
            "SELECT ",
            transfer_id!(),
            " AS id FROM (SELECT kind, payment_id, refund_id, deposit_id FROM ledger WHERE kind <> 'opening' \
              GROUP BY kind, payment_id, refund_id, deposit_id \
              HAVING SUM(CASE WHEN claim_id IS NOT NULL AND idempotency_key IS NOT NULL THEN 1 ELSE 0 END) <> 1) t"
        ),
        constraint: None,
    },
    Invariant {
        name: "transfers_name_their_change",
        says: "every payment, refund or deposit transfer names a payment, refund or deposit that exists",
        over: "ledger",
        violations: "\
            SELECT COALESCE(l.payment_id, l.refund_id, l.deposit_id, 'ledger entry') AS id FROM ledger l \
             WHERE (l.kind = 'payment' AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.payment_id = l.payment_id)) \
                OR (l.kind = 'refund' AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.refund_id = l.refund_id)) \
                OR (l.kind = 'deposit' AND NOT EXISTS (SELECT 1 FROM deposits d WHERE d.deposit_id = l.deposit_id))",
        constraint: None,
    },
    Invariant {
        name: "one_movement_per_claim",
        says: "a claim of a key moved money at most once",
        over: "ledger",
        violations: "\
            SELECT claim_id AS id FROM ledger WHERE claim_id IS NOT NULL \
             GROUP BY claim_id HAVING COUNT(*) > 1",
        constraint: Some("ledger.claim_id UNIQUE"),
    },
    Invariant {
        name: "payments_moved_once",
        says: "every payment debits its shopper and credits its shop, once each",
        over: "payments",
        violations: "\
            SELECT payment_id AS id FROM (SELECT p.payment_id, \
                SUM(CASE WHEN l.account_id = p.shopper_account_id AND l.amount = -p.amount THEN 1 ELSE 0 END) AS debits, \
                SUM(CASE WHEN l.account_id = p.shop_account_id AND l.amount = p.amount THEN 1 ELSE 0 END) AS credits \
              FROM payments p LEFT JOIN ledger l ON l.payment_id = p.payment_id AND l.kind = 'payment' \
              GROUP BY p.payment_id) t WHERE debits <> 1 OR credits <> 1",
        constraint: None,
    },
    Invariant {
        name: "refunds_moved_once",
        says: "every refund debits the shop and credits the shopper, once each",
        over: "refunds",
        violations: "\
            SELECT refund_id AS id FROM (SELECT r.refund_id, \
                SUM(CASE WHEN l.account_id = p.shop_account_id AND l.amount = -r.amount THEN 1 ELSE 0 END) AS debits, \
                SUM(CASE WHEN l.account_id = p.shopper_account_id AND l.amount = r.amount THEN 1 ELSE 0 END) AS credits \
              FROM refunds r JOIN payments p ON p.payment_id = r.payment_id \
              LEFT JOIN ledger l ON l.refund_id = r.refund_id AND l.kind = 'refund' \
              GROUP BY r.refund_id) t WHERE debits <> 1 OR credits <> 1",
        constraint: None,
    },
    Invariant {
        name: "refunds_within_payment",
        says: "refunds of a payment sum to its refunded total, at most its amount",
        over: "payments",
        violations: "\
            SELECT p.payment_id AS id FROM payments p WHERE p.refunded > p.amount OR p.refunded <> \
              (SELECT CAST(COALESCE(SUM(r.amount), 0) AS BIGINT) FROM refunds r WHERE r.payment_id = p.payment_id)",
        constraint: None,
    },
    Invariant {
        name: "one_payment_per_session",
        says: "at most one payment per checkout session",
        over: "checkout_sessions",
        violations: "\
            SELECT checkout_session_id AS id FROM payments WHERE checkout_session_id IS NOT NULL \
             GROUP BY checkout_session_id HAVING COUNT(*) > 1",
        constraint: Some("payments.checkout_session_id UNIQUE"),
    },
    Invariant {
        name: "paid_sessions_have_their_payment",
        says: "a session is paid exactly when a payment of its amount to its shop names it",
        over: "checkout_sessions",
        // Two anti-joins (a hash join each), not a subquery per session: a checkout keeps
        // every unpaid session too.
        violations: "\
            SELECT s.session_id AS id FROM payments p JOIN checkout_sessions s ON s.session_id = p.checkout_session_id \
             WHERE s.status <> 'paid' OR s.payment_id <> p.payment_id OR s.amount <> p.amount \
                OR s.shop_account_id <> p.shop_account_id OR s.order_id <> p.order_id \
            UNION ALL \
            SELECT s.session_id FROM checkout_sessions s LEFT JOIN payments p \
                ON p.payment_id = s.payment_id AND p.checkout_session_id = s.session_id \
             WHERE s.status = 'paid' AND p.payment_id IS NULL",
        constraint: None,
    },
    Invariant {
        name: "waiting_credits_are_payments",
        says: "a shop's waiting credit is its payment's amount",
        over: "unfolded_credits",
        violations: "\
            SELECT u.account_id || ':' || u.payment_id AS id FROM unfolded_credits u LEFT JOIN payments p ON p.payment_id = u.payment_id \
             WHERE p.payment_id IS NULL OR u.account_id <> p.shop_account_id OR u.amount <> p.amount",
        constraint: None,
    },
    Invariant {
        name: "payments_have_one_event",
        says: "every payment has exactly one payment.succeeded event for its shop",
        over: "payments",
        violations: "\
            SELECT p.payment_id AS id FROM payments p \
              LEFT JOIN (SELECT subject_id, shop_account_id, COUNT(*) AS n FROM webhook_events \
                          WHERE type = 'payment.succeeded' GROUP BY subject_id, shop_account_id) e \
                     ON e.subject_id = p.payment_id AND e.shop_account_id = p.shop_account_id \
             WHERE p.shop_account_id <> 'acc_before_shops' AND COALESCE(e.n, 0) <> 1",
        constraint: None,
    },
    Invariant {
        name: "payment_versions_count_refunds",
        says: "a payment's version (its last event's sequence) is one more than its refunds",
        over: "payments",
        violations: "\
            SELECT p.payment_id AS id FROM payments p \
             WHERE p.version <> 1 + (SELECT COUNT(*) FROM refunds r WHERE r.payment_id = p.payment_id)",
        constraint: None,
    },
    Invariant {
        name: "refunds_have_one_event",
        says: "every refund has exactly one refund.succeeded event naming it (its refund_id), and every such event names a refund of its payment",
        over: "refunds",
        // Matched by the refund's id in the event's JSON (written by serde: no spaces), the same
        // text on both databases; a count per payment would miss an event naming another refund.
        violations: "\
            SELECT r.refund_id AS id FROM refunds r JOIN payments p ON p.payment_id = r.payment_id \
              LEFT JOIN webhook_events e ON e.subject_id = r.payment_id AND e.type = 'refund.succeeded' \
                   AND e.body LIKE ('%\"refund_id\":\"' || r.refund_id || '\"%') \
             WHERE p.shop_account_id <> 'acc_before_shops' \
             GROUP BY r.refund_id HAVING COUNT(e.event_id) <> 1 \
            UNION ALL \
            SELECT e.event_id FROM webhook_events e WHERE e.type = 'refund.succeeded' AND NOT EXISTS \
              (SELECT 1 FROM refunds r WHERE r.payment_id = e.subject_id \
                  AND e.body LIKE ('%\"refund_id\":\"' || r.refund_id || '\"%'))",
        constraint: None,
    },
    Invariant {
        name: "lapsed_sessions_have_one_event",
        says: "every session that lapsed unpaid has exactly one checkout_session.expired event",
        over: "checkout_sessions",
        violations: "\
            SELECT session_id AS id FROM (SELECT s.session_id FROM checkout_sessions s \
              LEFT JOIN webhook_events e ON e.subject_id = s.session_id \
                   AND e.type = 'checkout_session.expired' \
             WHERE s.status = 'expired' \
             GROUP BY s.session_id HAVING COUNT(e.event_id) <> 1) t",
        constraint: None,
    },
    Invariant {
        name: "expired_events_name_lapsed_sessions",
        says: "a checkout_session.expired event names a session that did lapse (never a paid one)",
        over: "webhook_events",
        violations: "\
            SELECT e.subject_id AS id FROM webhook_events e \
              LEFT JOIN checkout_sessions s ON s.session_id = e.subject_id \
             WHERE e.type = 'checkout_session.expired' AND (s.session_id IS NULL OR s.status <> 'expired')",
        constraint: None,
    },
    Invariant {
        name: "keys_committed_with_answer",
        says: "every committed key is done and has its stored response",
        over: "idempotency_keys",
        violations: "\
            SELECT account_id || ':' || idempotency_key AS id FROM idempotency_keys \
             WHERE status <> 'done' OR response_status IS NULL OR response_body IS NULL",
        constraint: None,
    },
];

/// Only for [`Scope::KeysNeverReused`].
pub const ONE_MOVEMENT_PER_KEY_STRING: Invariant = Invariant {
    name: "one_movement_per_key_string",
    says: "at most one ledger movement per (principal, key), ever",
    over: "ledger",
    violations: "\
        SELECT account_id || ':' || idempotency_key AS id FROM ledger WHERE claim_id IS NOT NULL \
         GROUP BY account_id, idempotency_key HAVING COUNT(*) > 1",
    constraint: None,
};

fn rows_of(table: &str) -> String {
    format!("SELECT COUNT(*) AS n FROM {table}")
}

fn id(row: &dyn Row) -> Result<String, super::row::RowError> {
    row.text("id")
}

fn count(row: &dyn Row) -> Result<i64, super::row::RowError> {
    row.int("n")
}

/// Every invariant of `scope` on a SQLite connection, inside one read transaction.
fn on_sqlite(conn: &rusqlite::Connection, scope: Scope) -> Result<Vec<Checked>, StoreError> {
    conn.execute_batch("BEGIN").map_err(sqlite::classify)?;
    let mut rows = HashMap::new();
    let checked = scope
        .invariants()
        .map(|invariant| {
            let rows = match rows.get(invariant.over) {
                Some(&n) => n,
                None => {
                    let n = sqlite::fetch_all(conn, &rows_of(invariant.over), &[], count)?[0];
                    rows.insert(invariant.over, n);
                    n
                }
            };
            let started = Instant::now();
            let violations = sqlite::fetch_all(conn, invariant.violations, &[], id)?;
            Ok(Checked {
                invariant,
                rows,
                violations,
                took: started.elapsed(),
            })
        })
        .collect();
    // Read only: ending it either way lets the WAL be checkpointed past this snapshot.
    let _ = conn.execute_batch("ROLLBACK");
    checked
}

/// The same on PostgreSQL, in a `REPEATABLE READ READ ONLY` transaction (one snapshot for
/// every statement; it takes no lock a writer waits for).
async fn on_postgres(
    tx: &mut sqlx::PgConnection,
    scope: Scope,
    prepared: bool,
) -> Result<Vec<Checked>, StoreError> {
    postgres::execute(
        &mut *tx,
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
        &[],
        prepared,
    )
    .await?;
    let mut rows = HashMap::new();
    let mut checked = Vec::new();
    for invariant in scope.invariants() {
        let n = match rows.get(invariant.over) {
            Some(&n) => n,
            None => {
                let over = rows_of(invariant.over);
                let n = postgres::fetch_all(&mut *tx, &over, &[], count, prepared).await?[0];
                rows.insert(invariant.over, n);
                n
            }
        };
        let started = Instant::now();
        let violations =
            postgres::fetch_all(&mut *tx, invariant.violations, &[], id, prepared).await?;
        checked.push(Checked {
            invariant,
            rows: n,
            violations,
            took: started.elapsed(),
        });
    }
    Ok(checked)
}

impl Store {
    /// Every invariant of `scope`, in one snapshot, on a connection of this store (a reader of
    /// SQLite's, one of PostgreSQL's pool).
    pub async fn verify(&self, scope: Scope) -> Result<Verified, StoreError> {
        let started = Instant::now();
        let checked = match self {
            Store::Sqlite(store) => store.on_reader(move |conn| on_sqlite(conn, scope)).await?,
            Store::Postgres(store) => {
                let mut tx = store.transaction().await?;
                let checked = on_postgres(tx.conn(), scope, store.prepared()).await;
                // Read only: it wrote nothing either way.
                tx.rollback().await;
                checked?
            }
        };
        Ok(Verified {
            checked,
            took: started.elapsed(),
        })
    }
}

/// Every invariant of `scope` on the database at `url`, on a connection of its own that only
/// reads (no migration, no lock on a SQLite file a server holds): for `checkout-server verify`
/// and the test kit.
pub async fn verify_database(url: &str, scope: Scope) -> Result<Verified, StoreError> {
    let started = Instant::now();
    let checked = if url.starts_with("sqlite:") {
        let conn = sqlite::open_reader(url)?;
        tokio::task::spawn_blocking(move || on_sqlite(&conn, scope))
            .await
            .map_err(|e| StoreError::Other(e.into()))??
    } else {
        let mut conn: sqlx::PgConnection = sqlx::Connection::connect(url)
            .await
            .map_err(postgres::classify)?;
        let mut tx = sqlx::Connection::begin(&mut conn)
            .await
            .map_err(postgres::classify)?;
        let checked = on_postgres(&mut tx, scope, true).await?;
        drop(tx);
        let _ = sqlx::Connection::close(conn).await;
        checked
    };
    Ok(Verified {
        checked,
        took: started.elapsed(),
    })
}
